"""Every type of line in a run's events.jsonl, in one enum.

The run writes them, the store, the live view and the exporter match them, the
report and the history read them back: one spelling for all. The values are the
strings on disk; a str enum compares and hashes as its value, so a line read back
from JSON matches its member.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol


class EventType(str, Enum):
    # the start
    RUN_CREATED = "run_created"
    LEFTOVERS_KILLED = "leftovers_killed"
    TARGET_STARTING = "target_starting"
    TARGET_WAITING = "target_waiting"
    TARGET_READY = "target_ready"
    SERVER_VERSION = "server_version"
    BUILD = "build"
    WORKLOAD_FITS = "workload_fits"
    WORKLOAD_MAY_NOT_FIT = "workload_may_not_fit"
    MAX_MODEL_LEN_UNKNOWN = "max_model_len_unknown"
    RUN_STARTED = "run_started"
    LOAD_STARTED = "load_started"
    CRITERIA_CONFIG = "criteria_config"
    PROVE_PLAN = "prove_plan"  # prove: the sequential test's plan, as resolved (soak.run.proving)
    # while the load runs
    DETECTOR_STATE = "detector_state"
    DECISION = "decision"
    CRITERION_AT_RISK = "criterion_at_risk"
    CRITERION_FAIL = "criterion_fail"
    THRESHOLD_BREACHED = "threshold_breached"
    PROOF_DECIDED = "proof_decided"  # prove: the test crossed a line or its truncation
    METRICS_STALE = "metrics_stale"
    METRICS_FRESH = "metrics_fresh"
    METRICS_SCRAPE_FAILED = "metrics_scrape_failed"
    GPU_SOURCE_STALE = "gpu_source_stale"
    GPU_SOURCE_FRESH = "gpu_source_fresh"
    WALL_CLOCK_STEP = "wall_clock_step"
    WARNING = "warning"
    # vLLM's jit_monitor: a kernel compiled mid-serve. A precursor (vllm#53577), not a verdict.
    JIT_COMPILE = "jit_compile"
    # the incident cycle
    INCIDENT_STARTED = "incident_started"
    INCIDENT = "incident"
    INCIDENT_ERROR = "incident_error"
    RESTART_STARTED = "restart_started"
    RESTART_DONE = "restart_done"
    RESTART_FAILED = "restart_failed"
    RESTART_CANCELLED = "restart_cancelled"
    # the end
    DRAINING = "draining"  # the live view's phase for it; no run writes it today
    LOAD_STOPPED = "load_stopped"
    TARGET_STOPPED = "target_stopped"
    SHM_RELEASED = "shm_released"
    RUN_ENDED = "run_ended"
    THRESHOLDS_FAILED = "thresholds_failed"
    PUSHED = "pushed"
    PUSH_FAILED = "push_failed"
    REPORT_WRITTEN = "report_written"
    REPORT_FAILED = "report_failed"

    def __str__(self) -> str:  # the value wherever it is formatted (Prometheus labels, f-strings)
        return self.value


class Emit(Protocol):
    """How a part says an event: the type and its fields (the run adds ``ts``)."""

    def __call__(self, type: EventType, **fields: Any) -> None: ...
