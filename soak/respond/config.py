"""What happens on a hang: evidence, kill, GPU release, restart policy.

The section ``response:`` of a run config::

    response:
      on_hang: restart          # stop (default: verdict fail, exit 1) | restart
      max_restarts: 3
      kill_timeout: 10s         # wait for every SIGKILLed process to be gone
      gpu_release_timeout: 50s  # wait for the GPUs to hold no target process
      gpu_memory_tolerance_mib: 512
      evidence:
        py_spy: true
        flight_recorder: true
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from soak.configbase import Duration, StrictModel


class EvidenceConfig(StrictModel):
    """What goes into ``incidents/N/`` before the kill, and how long each step may take.

    Steps run side by side; each has its own deadline and the whole bundle has
    ``budget``. A step that fails or runs out of time is noted in incident.json
    and never holds up the kill.
    """

    enabled: bool = True
    # The "last minutes" of samples written to incidents/N/samples.jsonl.
    samples_window: Duration = 300.0
    log_tail_bytes: int = Field(default=256 * 1024, ge=0)
    metrics_timeout: Duration = 3.0
    gpu_timeout: Duration = 3.0
    py_spy: bool = True
    # A path, or a name looked up on PATH and beside the running interpreter.
    py_spy_command: str = "py-spy"
    py_spy_native: bool = False
    py_spy_timeout: Duration = 10.0
    # Set the TORCH_NCCL_*/TORCH_FR_* variables on a launched target and ask
    # live ranks for dumps through their pipe files on an incident.
    flight_recorder: bool = True
    # How long to wait for the dumps the pipe writes ask for.
    flight_recorder_wait: Duration = 5.0
    # Where the ranks dump (TORCH_NCCL_DEBUG_INFO_TEMP_FILE): None means the run
    # directory's default for a launched target; for an attached server give the
    # prefix its ranks were started with.
    flight_recorder_dump_prefix: str | None = None
    # The pipe stem of an attached server (TORCH_NCCL_DEBUG_INFO_PIPE_FILE); a
    # launched target reports its own.
    flight_recorder_pipe_stem: str | None = None
    budget: Duration = 15.0


class ResponseConfig(StrictModel):
    # Applies to every incident the detector decides (hang, crash, server gone):
    # stop ends the soak with verdict fail; restart relaunches the target.
    on_hang: Literal["stop", "restart"] = "stop"
    # A corruption (the oracle's): the server still answers, wrongly. stop: capture the
    # evidence and end the run, stopping the server as at the end of a run; restart:
    # relaunch it (a launched target); continue: record it and keep soaking.
    on_corruption: Literal["stop", "restart", "continue"] = "stop"
    max_restarts: int = Field(default=3, ge=0)
    evidence: EvidenceConfig = EvidenceConfig()
    # How often the target's process tree is snapshotted over the run, so that a
    # worker that reparented away from a dead parent is still known (vllm#55510).
    tree_snapshot_interval: Duration = 2.0
    # With no root PID (attached by URL only), find the process listening on the
    # URL's loopback port and treat it as the root.
    find_root_by_port: bool = True
    kill_timeout: Duration = 10.0
    gpu_release_timeout: Duration = 50.0
    gpu_poll_interval: Duration = 0.25
    # The GPUs count as released when none lists a target process and each one's
    # used memory is at most its baseline + this (resiliency-ext: 512 MB).
    gpu_memory_tolerance_mib: float = Field(default=512.0, ge=0)
    # Memory a GPU uses with no target on it (MiB, every GPU): the driver's own
    # reservation, other tenants on a shared box. None: learned from readings
    # that listed no process, else "memory settled" (two readings agree).
    gpu_memory_baseline_mib: Optional[float] = Field(default=None, ge=0)
