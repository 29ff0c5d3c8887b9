"""Simulator settings (section ``target: {kind: simulator, sim: {...}}`` and ``soak sim`` flags).

Defaults are the real box's launch line (FACTS.md): PP 8, block 256,
max_num_seqs 12, max_num_batched_tokens 256, 5 speculative tokens,
max_model_len 327680. Every duration is in simulated seconds; the server runs
them ``time_scale`` times faster on the wall clock.

Faults are a list tagged by ``kind``; each fires once, when the first of its
triggers (``at``, ``after_requests``, a random draw with mean ``mtbf``) is due.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from soak.configbase import Duration, StrictModel


class FaultTrigger(StrictModel):
    at: Optional[Duration] = None  # simulated seconds after start-up
    after_requests: Optional[int] = Field(default=None, ge=0)  # fires when request N+1 arrives
    mtbf: Optional[Duration] = None  # exponential onset with this mean, drawn from the seed
    # none of the three: fires at start-up


class PpDeadlockFault(FaultTrigger):
    """vllm#53402: stages 0..pp-2 spin in a broadcast, the last stage idles."""

    kind: Literal["pp_deadlock"] = "pp_deadlock"
    # None: the server's (SimConfig.ringbuffer_warning_interval).
    ringbuffer_warning_interval: Optional[Duration] = None
    # The trigger vllm#53577 names: the last stage logs vLLM's jit_monitor line for this
    # kernel as the deadlock begins (a first-time Triton compile mid-serve). None: no line.
    jit_kernel: Optional[str] = None
    watchdog_timeout: Duration = 60.0  # the NCCL process group's timeout
    execute_timeout: Duration = 300.0  # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
    seq_id: int = 40427
    # The RPC whose timeout is logged; None: the version's (0.11.2 execute_model, 0.33 sample_tokens).
    rpc_method: Optional[Literal["execute_model", "sample_tokens"]] = None
    # A build's hang rate (soak bisect's simulated builds): the onset is an exponential
    # draw with this mean (seeded by the seed), in WALL seconds counted from the first
    # request: the harness's time at risk (monotonic, from the start of load), which
    # time_scale does not compress. ``mtbf`` is in simulated seconds like every other
    # duration here, so at time_scale 10 an ``mtbf: 20m`` hangs after ~2 wall minutes.
    wall_mtbf: Optional[Duration] = None

    @field_validator("wall_mtbf")
    @classmethod
    def _positive_wall_mtbf(cls, value: Optional[float]) -> Optional[float]:
        if value is not None and not 0 < value < float("inf"):
            raise ValueError("must be a positive duration such as 20m")
        return value

    @model_validator(mode="after")
    def _one_mtbf(self):
        if self.wall_mtbf is not None and self.mtbf is not None:
            raise ValueError("give wall_mtbf (wall seconds of load) or mtbf (simulated seconds), not both")
        return self


class AllIdleDeadlockFault(FaultTrigger):
    kind: Literal["all_idle_deadlock"] = "all_idle_deadlock"
    ringbuffer_warning_interval: Optional[Duration] = None


class CrashFault(FaultTrigger):
    kind: Literal["crash"] = "crash"
    # /health answers 503 this long before the API server exits; None: the server's
    # engine_death_shutdown (vLLM's 5 s watchdog)
    exit_delay: Optional[Duration] = None
    exit_code: int = 1


class SlowFault(FaultTrigger):
    """A long healthy silence: a compile pause (every stage busy, no tokens)."""

    kind: Literal["slow"] = "slow"
    pause: Duration = 120.0


class MetricsStallFault(FaultTrigger):
    kind: Literal["metrics_stall"] = "metrics_stall"
    duration: Optional[Duration] = None  # None: /metrics never answers again


class CorruptOutputFault(FaultTrigger):
    """Sampled tokens misaligned between the requests of a batch (soak.sim.greedy):
    answers come back 200 with wrong tokens, silently."""

    kind: Literal["corrupt_output"] = "corrupt_output"
    scope: Literal["all", "long"] = "all"  # long: prompts of at least long_tokens
    # A prompt of at least this many tokens is "long" (scope: long corrupts only those).
    long_tokens: int = Field(default=2048, ge=1)
    one_in: int = Field(default=1, ge=1)  # only one answer in N is affected
    duration: Optional[Duration] = None  # None: for good


class CorruptThenDeadlockFault(CorruptOutputFault):
    """The seed's story: the misalignment corrupts answers from its onset, and
    ``deadlock_after`` simulated seconds later the pipeline deadlocks as
    ``pp_deadlock`` (``deadlock``: its settings; its own triggers are not read)."""

    kind: Literal["corrupt_then_deadlock"] = "corrupt_then_deadlock"  # type: ignore[assignment]
    deadlock_after: Duration = 300.0
    deadlock: PpDeadlockFault = Field(default_factory=PpDeadlockFault)


class LyingUsageFault(FaultTrigger):
    """usage claims ``factor`` times the completion tokens streamed (/metrics stays true)."""

    kind: Literal["lying_usage"] = "lying_usage"
    factor: float = Field(default=2.0, gt=0)


class OtherModelFault(FaultTrigger):
    """Answers and chunks name ``model`` while /v1/models says the configured one."""

    kind: Literal["other_model"] = "other_model"
    model: str = "other-model"


class ReplayFault(FaultTrigger):
    """Every answer the same cached bytes (the first answer after the onset, per
    endpoint and streaming mode); the engine does no work for them."""

    kind: Literal["replay"] = "replay"


class CollapseFault(FaultTrigger):
    """Throughput falls ``factor`` times: every engine step takes that much longer."""

    kind: Literal["collapse"] = "collapse"
    factor: float = Field(default=300.0, ge=1)
    duration: Optional[Duration] = None  # None: for good


FAULT_KINDS = ("pp_deadlock", "all_idle_deadlock", "crash", "slow", "metrics_stall", "corrupt_output",
               "corrupt_then_deadlock", "lying_usage", "other_model", "replay", "collapse")


def _known_kind(value):
    if isinstance(value, dict) and value.get("kind") not in FAULT_KINDS:
        raise PydanticCustomError(
            "unknown_kind", "unknown kind {kind}, known: {known}", {"kind": repr(value.get("kind")), "known": ", ".join(FAULT_KINDS)}
        )
    return value


FaultConfig = Annotated[
    Union[PpDeadlockFault, AllIdleDeadlockFault, CrashFault, SlowFault, MetricsStallFault, CorruptOutputFault,
          CorruptThenDeadlockFault, LyingUsageFault, OtherModelFault, ReplayFault, CollapseFault],
    Field(discriminator="kind"),
    BeforeValidator(_known_kind),
]


SIM_VLLM_VERSIONS = ("0.11.2", "0.33.0")


class SimConfig(StrictModel):
    # The vLLM version the simulator behaves as (soak/upstream/vllm-<V>.json): names,
    # finish reasons, include_usage default, cached-token field, log colours, RPC line.
    vllm_version: Literal["0.11.2", "0.33.0"] = "0.11.2"
    model: str = "deepseek-v4-flash"
    pp_size: int = Field(default=8, ge=1, le=64)
    time_scale: float = Field(default=1.0, gt=0)
    seed: int = 0
    # scheduler and cache
    block_size: int = Field(default=256, ge=1)
    max_num_seqs: int = Field(default=12, ge=1)
    max_num_batched_tokens: int = Field(default=256, ge=1)
    max_model_len: int = Field(default=327680, ge=16)
    kv_cache_blocks: int = Field(default=12288, ge=1)  # 12 sessions of 230K tokens at block 256, and room
    num_speculative_tokens: int = Field(default=5, ge=0)
    spec_acceptance: float = Field(default=0.7, ge=0.0, le=1.0)  # per draft token
    # timing: a step takes pp_size * (stage_time + stage_time_per_token * tokens)
    stage_time: Duration = 0.002
    stage_time_per_token: float = Field(default=6e-6, ge=0)
    # Loading time: `soak sim` refuses connections this long (vLLM binds its port
    # once loaded); in-process, /health answers 503 meanwhile.
    startup_delay: Duration = 0.0
    default_output_tokens: int = Field(default=256, ge=1)  # EOS point when max_tokens is absent
    # The model's answers (soak.sim.greedy): the share of positions whose top two
    # tokens are nearly tied (<= 0.004 nats), and the chance that the batch's
    # composition flips such a tie to the runner-up (0: a batch-invariant server).
    near_tie_rate: float = Field(default=0.02, ge=0.0, le=1.0)
    # At a near tie, the chance the runner-up is taken (drawn from the batch's
    # composition, as a server that is not batch-invariant does); 0: batch-invariant.
    near_tie_flip: float = Field(default=0.3, ge=0.0, le=1.0)
    # GPUs (defaults: an RTX 3090 holding its share of the model and the KV cache)
    gpu_mem_total_mib: int = 24576
    gpu_mem_used_mib: int = 22800
    gpu_power_idle_w: float = 30.0
    gpu_power_busy_w: float = 350.0
    decode_util_pct: float = Field(default=60.0, ge=0, le=100)  # decode leaves pipeline bubbles
    hostname: str = "sim-host"
    # server behaviour
    enable_prompt_tokens_details: bool = True
    # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: without it the API server shuts itself down
    # engine_death_shutdown after EngineDeadError (vLLM checks every 5 s); hung workers
    # are left behind as orphans.
    keep_alive_on_engine_death: bool = False
    engine_death_shutdown: Duration = 5.0
    show_hidden_metrics_for_version: Optional[str] = None
    log_stats_interval: Duration = 10.0
    # How often a stuck step logs the shm-broadcast line (VLLM_RINGBUFFER_WARNING_INTERVAL).
    # None: that environment variable, as vLLM reads it, else vLLM's default of 60 s.
    ringbuffer_warning_interval: Optional[Duration] = None
    process_name_prefix: str = "VLLM"
    worker_backend: Literal["cpu", "cuda"] = "cpu"
    worker_own_session: Optional[int] = None  # this worker rank calls setsid (kill-path tests)
    faults: list[FaultConfig] = Field(default_factory=list)
    # Which launch of this config this is (``soak sim --config`` counts them beside the
    # file): a run that restarts the server after a wall_mtbf hang draws a fresh onset
    # each launch, seeded by (seed, launch), so its hangs are a Poisson process, not one
    # onset repeated.
    launch: int = Field(default=0, ge=0)

    @field_validator("worker_own_session")
    @classmethod
    def _rank_in_range(cls, value, info):
        pp = info.data.get("pp_size", 8)
        if value is not None and not 0 <= value < pp:
            raise ValueError(f"rank {value} is not a pipeline stage (pp_size {pp})")
        return value

    @property
    def ringbuffer_interval_s(self) -> float:
        return 60.0 if self.ringbuffer_warning_interval is None else self.ringbuffer_warning_interval

    @property
    def spec_decode(self) -> bool:
        return self.num_speculative_tokens > 0

    @property
    def profile(self):
        """The upstream facts of ``vllm_version`` (soak.versions.VllmProfile)."""
        from soak.versions import profile_for

        return profile_for(self.vllm_version)
