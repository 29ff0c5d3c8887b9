"""What a ``SoakRun`` is built from, as ``soak.run.wiring`` picks it: who the run
is (``RunIdentity``) and the concrete part each stage gets (``RunParts``: the
workload, the detector, and factories for the parts that need a live target).

The target's root PID has one path to the parts that act on its processes: the
target itself (``Target.root_pid``, replaced by a restart), which wiring hands
to both the probes' and the responder's factory; the facts carry none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol, Sequence

from soak.detect.detector import Detector
from soak.load.progress import ProgressTracker
from soak.net import OutboundSession
from soak.probes.scheduler import Probe
from soak.records import GpuSourceLike, TargetFacts
from soak.respond.responder import Responder
from soak.samples import Sample
from soak.workload import Workload

if TYPE_CHECKING:
    from soak.redact import Redactor
    from soak.run.guardian import Guardian


@dataclass(frozen=True)
class RunIdentity:
    run_id: str
    run_dir: Path
    config_path: Path | None = None  # where a workload error found only at the start points


class GpuSourceFactory(Protocol):
    """The configured GPU source for the server at ``base_url``, opened (None: no
    GPU source). A missing NVML raises ``GpuUnavailable`` (exit 3)."""

    def __call__(self, base_url: str, *, session: OutboundSession) -> Awaitable[GpuSourceLike | None]: ...


class ProbesFactory(Protocol):
    """The probes for the target's current life (called again after a restart)."""

    def __call__(self, facts: TargetFacts, *, session: OutboundSession, gpu_source: GpuSourceLike | None,
                 progress: ProgressTracker, log_from_start: bool) -> Sequence[Probe]: ...


class ResponderFactory(Protocol):
    def __call__(self, facts: TargetFacts, *, gpu_source: GpuSourceLike | None,
                 recent_samples: Callable[[], Sequence[Sample]],
                 on_write_error: Callable[[BaseException], None]) -> Responder: ...


class Calibrate(Protocol):
    """Count the workload's text once, on the target ``facts`` describe; give back the
    exact in-process counter of answers' text, or None where the run has none."""

    def __call__(self, workload: Workload, facts: TargetFacts) -> Awaitable[Callable[[str], int] | None]: ...


@dataclass(frozen=True)
class RunParts:
    """The concrete part each stage gets."""

    workload: Callable[[str | None], Workload]  # model -> workload
    calibrate: Calibrate
    detector: Detector
    gpu_source: GpuSourceFactory
    probes: ProbesFactory
    responder: ResponderFactory
    redactor: Redactor | None = None  # the last pass over the run directory
    guardian: Guardian | None = None  # takes the server along if the harness is SIGKILLed
