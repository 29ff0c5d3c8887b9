"""The record of one incident: what the run store, the exporter and summary.json carry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class IncidentRecord:
    """CONTRACTS.md's incident fields, plus what the kill path measured.

    ``killed_pids`` are the processes SIGKILL was sent to; ``gpus_released`` is
    true once the GPU source showed no target process and memory back within
    tolerance; ``gpu_free_s`` counts from the SIGKILL to that moment (None when
    it never happened within the bounded wait). ``evidence`` is relative to the
    run directory.
    """

    number: int
    kind: str
    rule: str
    onset_at: float
    detected_at: float
    killed_pids: tuple[int, ...]
    # None: the GPU source could not confirm either way (the reason is in notes).
    gpus_released: bool | None
    gpu_free_s: float | None
    evidence: str
    summary: str
    reasons: tuple[str, ...] = ()
    killed_at: float | None = None
    gpus_free_at: float | None = None
    # PIDs still alive after the kill wait (should be empty; a non-empty tuple is a failure).
    survivors: tuple[int, ...] = ()
    # One line per evidence or kill step that failed, timed out or was skipped.
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The flight-recorder diagnosis line (soak.report.diagnose), when the ranks dumped.
    diagnosis: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "kind": self.kind,
            "rule": self.rule,
            "onset_at": self.onset_at,
            "detected_at": self.detected_at,
            "killed_pids": list(self.killed_pids),
            "gpus_released": self.gpus_released,
            "gpu_free_s": self.gpu_free_s,
            "evidence": self.evidence,
            "summary": self.summary,
            "reasons": list(self.reasons),
            "killed_at": self.killed_at,
            "gpus_free_at": self.gpus_free_at,
            "survivors": list(self.survivors),
            "notes": list(self.notes),
            "extra": dict(self.extra),
            "diagnosis": self.diagnosis,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "IncidentRecord":
        data = dict(obj)
        for name in ("killed_pids", "reasons", "survivors", "notes"):
            data[name] = tuple(data.get(name) or ())
        data["extra"] = dict(data.get("extra") or {})
        known = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in data.items() if k in known})
