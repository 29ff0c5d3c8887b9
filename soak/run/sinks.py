"""Where everything the run learns goes: the ``RunSink`` protocol and a fan-out.

The run store (soak/store), the exporter (soak/export) and the live view
(soak/run/live.py) each implement ``RunSink``. Calls come from the event loop's
thread, are synchronous and must be quick (append a line, bump a counter).
``FanOut`` passes each call to every sink; a sink that raises is reported to
the exception handler and the others still get the call, so a broken exporter
never costs the run its record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from soak.samples import RequestRecord, Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    run_dir: Path
    started_at: float  # unix seconds
    duration_s: float  # planned load duration (warm-up included)
    warmup_s: float
    target_kind: str  # simulator | launched | attached
    base_url: str
    model: str | None
    root_pid: int | None
    config: Mapping[str, Any] = field(default_factory=dict)  # resolved, secrets redacted
    gpu_count: int | None = None
    plan: Mapping[str, Any] = field(default_factory=dict)


class RunSink(Protocol):
    def on_start(self, info: RunInfo) -> None: ...

    def on_sample(self, sample: Sample) -> None: ...

    def on_request(self, record: RequestRecord) -> None: ...

    def on_assessment(self, assessment: Any) -> None: ...  # soak.detect.types.Assessment

    def on_incident(self, incident: Any) -> None: ...  # soak.respond.incident.IncidentRecord

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


ExceptionHandler = Callable[[object, str, BaseException], None]


def _log_sink_error(sink: object, method: str, exc: BaseException) -> None:
    log.warning("sink %s.%s failed: %s", type(sink).__name__, method, exc, exc_info=exc)


class FanOut:
    """A ``RunSink`` that forwards every call to its sinks, in order."""

    def __init__(self, sinks: Sequence[RunSink], *, on_error: ExceptionHandler = _log_sink_error) -> None:
        self._sinks = list(sinks)
        self._on_error = on_error
        self._closed = False

    def add(self, sink: RunSink) -> None:
        self._sinks.append(sink)

    def _each(self, method: str, *args: Any) -> None:
        for sink in self._sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # noqa: BLE001 - one sink must not sink the run
                self._on_error(sink, method, exc)

    def on_start(self, info: RunInfo) -> None:
        self._each("on_start", info)

    def on_sample(self, sample: Sample) -> None:
        self._each("on_sample", sample)

    def on_request(self, record: RequestRecord) -> None:
        self._each("on_request", record)

    def on_assessment(self, assessment: Any) -> None:
        self._each("on_assessment", assessment)

    def on_incident(self, incident: Any) -> None:
        self._each("on_incident", incident)

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None:
        self._each("on_event", type, fields)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._each("close")


class NullSink:
    """Ignores everything; a base for sinks that care about a few calls."""

    def on_start(self, info: RunInfo) -> None:
        pass

    def on_sample(self, sample: Sample) -> None:
        pass

    def on_request(self, record: RequestRecord) -> None:
        pass

    def on_assessment(self, assessment: Any) -> None:
        pass

    def on_incident(self, incident: Any) -> None:
        pass

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
