"""bisect.json: the builds, every segment with the posterior after it, and where
the bisect stands (what bisect.html draws). Pure: the document is made from the
segments read back (``segments.read_segments``), so it is the same whether the
bisect ran through or was resumed; ``write_bisect_json`` is its one atomic write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from soak.bisect.executor import Build, SegmentResult
from soak.bisect.posterior import Model, replay, step

BISECT_JSON_VERSION = 1


def bisect_document(builds: Sequence[Build], results: Sequence[SegmentResult], *, model: Model, segment_s: float,
                    threshold: float = 0.95, budget_s: float | None = None) -> dict[str, Any]:
    segments = [r.segment for r in results]
    after = replay(segments, model=model)
    now = step(segments, model=model, segment_s=segment_s, threshold=threshold, budget_s=budget_s)
    return {
        "version": BISECT_JSON_VERSION,
        "builds": [{"index": b.index, "label": b.label} for b in builds],
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
