"""The executor boundary of ``soak bisect`` (issue 36, deliver 3): who runs a
segment, and where. The bisect loop (``conduct``) only asks an executor to soak
a build for a while and waits for finished segments; today's executor runs one
``soak run`` after another on this machine, a cluster executor (a later issue)
would keep several in flight on several boxes. Results may come back in any
order: the posterior depends on each build's totals only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from soak.bisect.posterior import Segment


@dataclass(frozen=True)
class Build:
    """One of the ordered builds: a label for people, and what a ``target:``
    section can start (a launch command with its environment, a simulator config),
    opaque to the loop: only the executor reads ``target``."""

    index: int
    label: str
    target: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SegmentResult:
    """A finished segment, as its run directory records it."""

    build: int
    run_dir: Path
    exposure_s: float  # soak.exposure's time at risk
    hangs: int
    ended_by: str  # "hang", "time", "crash", "error": a segment that did not run is evidence of nothing

    @property
    def segment(self) -> Segment:
        return Segment(self.build, self.exposure_s, self.hangs)


class Executor(Protocol):
    """Runs segments. ``slots``: how many at once (1 on this machine)."""

    slots: int

    async def submit(self, build: Build, *, segment_s: float, run_dir: Path) -> None:
        """Start soaking ``build`` for up to ``segment_s`` of time at risk, stopping
        at its first hang, writing an ordinary run directory at ``run_dir``."""

    async def next_done(self) -> SegmentResult:
        """The next segment to finish, whichever it is."""

    async def aclose(self) -> None:
        """Cancel what still runs (its run directory stays readable); idempotent."""
