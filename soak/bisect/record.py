"""bisect.json: the builds, every segment with the posterior after it, and where
the bisect stands (what bisect.html draws). Pure: the document is made from the
segments read back (``segments.read_segments``), so it is the same whether the
bisect ran through or was resumed; ``write_bisect_json`` is its one atomic write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from soak.bisect.executor import Build, SegmentResult
from soak.bisect.posterior import Model, replay, step

BISECT_JSON_VERSION = 1


def bisect_document(builds: Sequence[Build], results: Sequence[SegmentResult], *, model: Model, segment_s: float,
                    threshold: float = 0.95, budget_s: float | None = None,
                    digests: Sequence[str] | None = None) -> dict[str, Any]:
    """``digests``: each build's segment config's (``local.config_digest``), so a
    resume can tell that a build's target changed under the same label."""
    segments = [r.segment for r in results]
    after = replay(segments, model=model)
    now = step(segments, model=model, segment_s=segment_s, threshold=threshold, budget_s=budget_s)
    return {
        "version": BISECT_JSON_VERSION,
        "builds": [{"index": b.index, "label": b.label, **({"config_sha256": digests[b.index]} if digests else {})}
                   for b in builds],
        "model": {"prior": list(model.prior), "mtbf_min_s": model.mtbf_min_s, "mtbf_max_s": model.mtbf_max_s,
                  "grid": model.grid, "min_ratio": model.min_ratio, "max_ratio": model.max_ratio,
                  "good_mtbf_s": model.good_mtbf_s, "bad_mtbf_s": model.bad_mtbf_s},
        "segment_s": segment_s, "threshold": threshold, "budget_s": budget_s,
        "segments": [{**r.segment.to_json(), "run_dir": str(r.run_dir), "ended_by": r.ended_by,
                      "label": builds[r.build].label, "posterior": list(post.first_bad)}
                     for r, post in zip(results, after)],
        "now": now.to_json(),
    }


def write_bisect_json(path: Path, document: dict[str, Any]) -> None:
    from soak.fsio import write_json_atomic

    write_json_atomic(path, document)


def changed_settings(had: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What of the evidence's meaning differs between the bisect.json a folder
    holds and the one this bisect file makes (``bisect_document`` of no segment):
    the segment length, the prior, the rate assumptions, a build's segment config.
    Segments of one and of the other do not mix. Empty when nothing did; a key
    the old file lacks is not a change."""
    out = []
    if "segment_s" in had and had["segment_s"] != now["segment_s"]:
        out.append(f"segment ({_num(had['segment_s'])}s then, {_num(now['segment_s'])}s now)")
    old_model, new_model = had.get("model"), now["model"]
    if isinstance(old_model, Mapping):
        if "prior" in old_model and _close(old_model["prior"], new_model["prior"]) is False:
            out.append("prior")
        if any(k in old_model and _close(old_model[k], v) is False for k, v in new_model.items() if k != "prior"):
            out.append("rates")
    old_builds = had.get("builds") if isinstance(had.get("builds"), list) else []
    targets = [str(b.get("label")) for b, n in zip(old_builds, now["builds"])
               if isinstance(b, Mapping) and "config_sha256" in b and "config_sha256" in n
               and b["config_sha256"] != n["config_sha256"]]
    if targets:
        out.append("the target or run config of " + ", ".join(targets))
    return out


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else repr(value)[:20]


def _close(a: Any, b: Any) -> bool:
    """Equal, numbers to a float's round trip through JSON."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b
