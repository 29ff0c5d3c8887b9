"""Every error soak raises, in one tree.

Third-party errors (aiohttp, pydantic, yaml, pynvml, psutil) are translated at
the boundary where they are caught, ``raise X(...) from exc``, so code above the
edges only ever sees these classes.

    SoakError
    ├── UsageError                 exit 2: bad config, workload or arguments
    │   ├── ConfigError            a file and a field (or line) are known
    │   │   └── WorkloadError      a workload or trace file is at fault
    │   └── ArgumentError          a command-line argument is at fault
    ├── EnvironmentProblem         exit 3: something the config asks for is missing
    │   ├── TargetNotReady         the server never answered /health and /v1/models
    │   ├── PortInUse
    │   ├── GpuUnavailable         no NVML, no GPU, or the driver does not answer
    │   ├── WorkloadDoesNotFit     the workload's requests exceed the target's max_model_len
    │   ├── TargetMismatch         the target is not what the config says (the attached
    │   │                          PID does not serve the URL, the launch port is taken)
    │   └── SchedulerError         the cluster scheduler (Slurm) failed or never ran a segment
    ├── HarnessFault               exit 4: the harness itself failed (its own I/O, a bug)
    ├── TransportError             one request failed; recorded, the soak goes on
    │   ├── ConnectRefused
    │   ├── ConnectionReset
    │   ├── HTTPStatusError        carries .status and the server's message
    │   ├── MalformedStream        the SSE stream broke the protocol, or a chunk cannot be read
    │   ├── StreamErrorObject      the server put an `error` object in the stream
    │   ├── RequestTimeout         carries .phase: connect | first_token | stall | total
    │   └── RequestAborted         the harness cut it short (drain over, target killed or restarted)
    └── ProbeError                 one sample could not be taken; the probe goes on
        ├── ProbeTimeout           a call ran past its deadline (a wedged driver)
        └── MetricsUnavailable

``exc.exit_code`` is the exit status of CONTRACTS.md for an error that ends a
command (1 unless a branch above says otherwise).
"""

from __future__ import annotations

from pathlib import Path


class SoakError(Exception):
    """Base of every error soak raises on purpose."""

    exit_code = 1


class UsageError(SoakError):
    exit_code = 2


class ConfigError(UsageError):
    """A config, workload or trace file is wrong.

    ``str()`` is the one line the CLI prints: ``FILE: FIELD: MESSAGE``, or
    ``FILE:LINE: MESSAGE`` when a line number is known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.field = field
        self.line = line
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = self.path or "<config>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class WorkloadError(ConfigError):
    pass


class ArgumentError(UsageError):
    pass


class EnvironmentProblem(SoakError):
    exit_code = 3


class TargetNotReady(EnvironmentProblem):
    pass


class PortInUse(EnvironmentProblem):
    pass


class GpuUnavailable(EnvironmentProblem):
    pass


class WorkloadDoesNotFit(EnvironmentProblem):
    """The workload is valid and so is the target, but not together: its largest
    request needs more tokens than the server's ``max_model_len``, so the server
    would refuse it (HTTP 400). Exit 3: the target is not what the workload needs."""


class TargetMismatch(EnvironmentProblem):
    """The process the config names is not the one that serves the URL (or a
    launch would collide with a server already there). Refused before any kill."""


class SchedulerError(EnvironmentProblem):
    """A cluster executor's scheduler failed: a command that errors, a controller
    that stays unreachable, a segment no node ever takes. The message quotes it."""


class HarnessFault(SoakError):
    """The harness failed on its own: an I/O error writing the run directory (disk
    full, read-only), or a bug. ``str()`` is the one line the CLI prints."""

    exit_code = 4


class TransportError(SoakError):
    """One request failed. ``outcome`` names the class recorded in requests.jsonl."""

    outcome = "error"


class ConnectRefused(TransportError):
    outcome = "refused"


class ConnectionReset(TransportError):
    outcome = "reset"


class HTTPStatusError(TransportError):
    outcome = "http_status"

    def __init__(self, status: int, message: str = "") -> None:
        self.status = status
        self.message = message
        super().__init__(f"HTTP {status}: {message}" if message else f"HTTP {status}")


class MalformedStream(TransportError):
    outcome = "malformed_stream"


class StreamErrorObject(TransportError):
    """An ``error`` object inside the stream (vLLM sends one for errors after the
    response began, e.g. a BadRequestError with code 400)."""

    outcome = "error"


class RequestAborted(TransportError):
    """The harness cut the request short: the drain ran out, or the target is
    being killed or restarted. Not the server's fault as such."""

    outcome = "aborted"


class RequestTimeout(TransportError):
    PHASES = ("connect", "first_token", "stall", "total")

    def __init__(self, phase: str, after_s: float) -> None:
        if phase not in self.PHASES:
            raise ValueError(f"unknown timeout phase {phase!r}, known: {', '.join(self.PHASES)}")
        self.phase = phase
        self.after_s = after_s
        super().__init__(f"{phase} timeout after {after_s:.1f}s")

    @property
    def outcome(self) -> str:  # type: ignore[override]
        return f"timeout_{self.phase}"


class ProbeError(SoakError):
    pass


class ProbeTimeout(ProbeError):
    pass


class MetricsUnavailable(ProbeError):
    pass
