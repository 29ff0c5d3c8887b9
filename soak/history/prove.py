"""``soak history --prove``'s pure part (issue 36): a build's nights as one
sequential test, and a broken MTBF taken from a named build's history.

A build's runs, oldest first, are one path of the test: their time at risk laid
end to end (``soak.exposure``'s intervals, the one definition), a hang at the end
of every interval that a hang ended. Nights pool because the test's statistic
is exposure and hang count only; where a night starts does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from soak.history.model import RunRecord
from soak.prove.live import exposure_path
from soak.prove.sprt import Decision, Plan, walk, withheld


def runs_of(runs: Sequence[RunRecord], build: str) -> tuple[RunRecord, ...]:
    """The runs of ``build``, named by its history key, its ``label@identity`` or its
    label, oldest first (a run without a start time last, in the order given). A
    label whose nights ran different things (soak.history.build.identity_of) names
    several builds: pooling them would credit one with the other's nights, so that
    is a ``ConfigError`` naming them, never a silent pool."""
    mine = [r for r in runs if r.label == build]
    if not mine:
        mine = [r for r in runs if build in (r.build, r.identity_key)]
    else:
        from soak.history.build import group_keys, label_splits

        keys = group_keys(mine)  # as history pools them (nights from before soak read the launch too)
        if len(set(keys)) > 1:
            from soak.errors import ConfigError
            from soak.printable import printable
            from soak.redact import clip

            split = label_splits([(r.label, k, r.facts) for r, k in zip(mine, keys)])[0]
            # labels and facts come from run directories: one printable line
            raise ConfigError(printable(clip(f"build {split.sentence()}; name one: {', '.join(split.builds)}", 600)))
    return tuple(sorted(mine, key=lambda r: (r.started_at is None, r.started_at or 0.0)))


def path_of(runs: Sequence[RunRecord]) -> tuple[tuple[float, ...], float]:
    """(cumulative exposure at each hang, total exposure) over these runs in order."""
    return exposure_path(interval for run in runs for interval in run.intervals)


def prove_build(plan: Plan, runs: Sequence[RunRecord], build: str) -> Decision:
    """Where ``build``'s sequential test stands over its nights so far; never fixed
    while one of them failed otherwise (its judge withheld it: soak.prove.sprt.withheld),
    as that night's own end said."""
    mine = runs_of(runs, build)
    marks, total = path_of(mine)
    decision = walk(plan, hang_exposures_s=marks, exposure_s=total)
    failed = next((r for r in mine if r.withheld), None)
    if failed is not None:
        decision = withheld(decision, f"night {failed.run_id or failed.path}: {failed.withheld}")
    return decision


@dataclass(frozen=True)
class BuildProof:
    """One build's test over its nights: where it stands, and the path it walked."""

    build: str
    decision: Decision
    hang_exposures_s: tuple[float, ...]
    exposure_s: float

    def to_json(self) -> dict[str, Any]:
        return {"build": self.build, **self.decision.to_json(),
                "path": {"hang_exposures_s": list(self.hang_exposures_s), "exposure_s": self.exposure_s}}


def prove_builds(plan: Plan, runs: Sequence[RunRecord], builds: Sequence[str]) -> tuple[BuildProof, ...]:
    """Each of ``builds`` tested over its own nights, in the order given."""
    out = []
    for build in builds:
        marks, total = path_of(runs_of(runs, build))
        out.append(BuildProof(build, walk(plan, hang_exposures_s=marks, exposure_s=total), marks, total))
    return tuple(out)


def broken_mtbf_of(runs: Sequence[RunRecord], build: str) -> float | None:
    """The broken build's MTBF for ``prove.broken_build``: its pooled exposure
    over its hangs (the point estimate; the test's θ1 is "how often it hangs",
    not a bound), None when history holds no hang of it."""
    mine = runs_of(runs, build)
    hangs = sum(r.hangs for r in mine)
    return sum(r.exposure_s for r in mine) / hangs if hangs else None
