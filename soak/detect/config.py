"""Detector rules and thresholds (section ``detector:`` of a run config).

Each rule has its own block so a config can tune or switch off one rule
without restating the others. Durations take a unit: ``"90s"``, ``"2m"`` (a bare ``90`` is
read as seconds, with a warning).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from soak.configbase import Duration, StrictModel
from soak.samples import GpuSource


class StageCpuMarks(StrictModel):
    """``pp_tail_stall``'s marks when the readings are stage CPU (percent of one core,
    soak.probes.stage_cpu), not GPU utilization: docs/detection.md has the shapes."""

    # At or under this the tail is asleep: stage_cpu_stall's ``asleep_pct``. A rank
    # asleep in gloo's receive reads 4-50% on a loaded box (its wake-ups are booked
    # with their run-queue wait); at 10 the simulator's sleeping tail read 12% beside a
    # spinning stage 0 in CI and the hang went undecided.
    low_pct: float = Field(45.0, ge=0, le=100)
    # A spinning rank reads 90-100% (CPU time plus run-queue wait, so a loaded
    # box does not hide it: docs/detection.md); a healthy pipeline's stages taking
    # turns read about 100/N % each, at most 50% for two stages.
    high_pct: float = Field(75.0, ge=0, le=100)
    # CPU readings are whole-interval deltas (one point per gpu_interval), and a
    # long prefill or a first-time compile on stage 0 keeps the tail idle for
    # seconds: a longer hold than the GPU's 3 s.
    window: Duration = 5.0
    # Before a server life's first token (start-up, first compiles, cold
    # prefills), stage 0 busy with an idle tail is normal: wait for it.
    after_first_token: bool = True

    @model_validator(mode="after")
    def _marks(self) -> "StageCpuMarks":
        if self.low_pct >= self.high_pct:
            raise ValueError("low_pct must be below high_pct")
        return self


class SequentialConfig(StrictModel):
    """``pp_tail_stall`` from GPU readings decided by sequential evidence (issue 37,
    soak.detect.evidence): a CUSUM of per-reading log-likelihood ratios against a bound
    set by the average run length to a false alarm. Stage-CPU readings keep the window."""

    enabled: bool = True
    # One false alarm per this many hours of healthy busy load (the bound: ln(ARL0 / period)).
    arl0_hours: float = Field(10_000.0, gt=0)
    # What one plain utilization reading averages over, at most: NVML's
    # nvmlDeviceGetUtilizationRates covers 1/6 s to 1 s, the per-process source's window
    # 2 s (soak.probes.process_source), so the tail last worked at most this long before
    # a working reading (the onset interval's earliest end).
    reading_span: Duration = 2.0
    # The detector is suspect once the evidence passes this fraction of the bound.
    suspect_fraction: float = Field(0.5, gt=0, le=1)


class PpTailStallConfig(StrictModel):
    """The last pipeline stage idle while every upstream stage spins (NCCL busy-wait)."""

    enabled: bool = True
    low_pct: float = Field(10.0, ge=0, le=100)
    high_pct: float = Field(90.0, ge=0, le=100)
    # How long the pattern must hold. A healthy pipeline bubble lasts one step
    # (tens of ms, a few hundred at most), far below this.
    window: Duration = 3.0
    # Progress seen this long after the pattern began still clears the rule:
    # a scrape that lands just after the stop reports the last tokens before it.
    progress_grace: Duration = 2.0
    # Spacing of NVML's utilization samples inside one reading.
    util_sample_period: Duration = 0.2
    # The marks for a stage-CPU source (no GPUs), in place of low/high/window.
    stage_cpu: StageCpuMarks = StageCpuMarks()
    # GPU readings: sequential evidence in place of low/high held for ``window``.
    sequential: SequentialConfig = SequentialConfig()

    def marks(self, source: GpuSource | None) -> tuple[float, float, float]:
        """(low_pct, high_pct, window) for readings from ``source``."""
        if source is GpuSource.STAGE_CPU:
            return self.stage_cpu.low_pct, self.stage_cpu.high_pct, self.stage_cpu.window
        return self.low_pct, self.high_pct, self.window

    @model_validator(mode="after")
    def _marks(self) -> "PpTailStallConfig":
        if self.low_pct >= self.high_pct:
            raise ValueError("low_pct must be below high_pct")
        return self


class StageCpuStallConfig(StrictModel):
    """Stage CPU only (vLLM's CPU build, soak.probes.stage_cpu): a stuck pipeline whose
    ranks sleep in gloo's blocking receive, or whose last stage spins alone. On the
    real CPU build (docs/real-vllm.md) a skipped or late send leaves every stage
    asleep, a deaf last stage spins while the stage before it sleeps, and a SIGSTOP
    of the last stage reads 0% beside a stage 0 winding down; none is the GPU's
    "upstream bright, tail dark" that pp_tail_stall reads. docs/detection.md has
    the shapes and margins."""

    enabled: bool = True
    # At or under this a stage is asleep. A rank asleep in gloo's receive or the shm
    # queue read 4-26% on a box at load 19 and 25-50% (three readings in a row over
    # 30) above it, its periodic wake-ups booked with their run-queue wait. A working
    # CPU worker reads 40-100%, but the shape also wants no progress for the window:
    # at 45 the healthy real soaks' longest held condition stayed 1.7 s (as at 30).
    asleep_pct: float = Field(45.0, ge=0, le=100)
    # At or over this a stage spins (CPU time plus run-queue wait: a loaded box
    # does not hide a spinner).
    spin_pct: float = Field(75.0, ge=0, le=100)
    # How long a shape must hold, with requests in flight and no progress signal
    # moving, before it is a hang. The longest healthy stretch measured on the
    # real CPU build is in docs/detection.md.
    window: Duration = 5.0
    # A shape held this fraction of the window keeps the detector suspect.
    suspect_fraction: float = Field(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _marks(self) -> "StageCpuStallConfig":
        if self.asleep_pct >= self.spin_pct:
            raise ValueError("asleep_pct must be below spin_pct")
        return self


class LearnedThreshold(StrictModel):
    """A silence threshold learned from the run's own healthy gaps:
    ``clamp(longest recent healthy gap * safety_factor, floor, ceiling)``."""

    enabled: bool = True
    safety_factor: float = Field(5.0, gt=0)
    floor: Duration = 15.0
    ceiling: Duration = 120.0
    # Healthy gaps remembered (the longest of these is the learned gap).
    history: int = Field(512, ge=1)
    # A rule is "suspect" once silence passes this fraction of its threshold.
    suspect_fraction: float = Field(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _bounds(self) -> "LearnedThreshold":
        if self.floor > self.ceiling:
            raise ValueError("floor must not exceed ceiling")
        return self

    def threshold(self, learned_gap_s: float) -> float:
        return min(max(learned_gap_s * self.safety_factor, self.floor), self.ceiling)


class GenerationFrozenConfig(LearnedThreshold):
    # Before the first generated token after a start or restart the server may
    # compile, capture graphs and prefill cold prompts: allow this long.
    startup_grace: Duration = 300.0
    # Silence while no stream is past its first token and /metrics shows nothing a
    # prefill moves (no KV usage: a proxy's /metrics, an allowlisted scrape, no scrape
    # at all) may be a long prefill the probes cannot see: allow this long. Without it
    # a 190K-token cold prefill behind such a /metrics was a hang at 15 s.
    unseen_prefill_grace: Duration = 300.0


class ClientStallConfig(LearnedThreshold):
    floor: Duration = 30.0
    ceiling: Duration = 300.0


class LogSignatureConfig(StrictModel):
    enabled: bool = True
    # A non-fatal signature (the shm-broadcast wait) keeps the detector suspect this long.
    suspect_for: Duration = 120.0
    # Used to date the onset of a sample_tokens RPC timeout when nothing better is known
    # (vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS).
    execute_model_timeout: Duration = 300.0
    # vLLM's shm-broadcast line (``No available shared memory broadcast block found in N
    # seconds``, every VLLM_RINGBUFFER_WARNING_INTERVAL) this many times since the last
    # progress, with requests running, settles a hang. One line is one slow step (a cold
    # compile, a long prefill): it only keeps the detector suspect.
    shm_broadcast_repeats: int = Field(2, ge=2)


class ServerGoneConfig(StrictModel):
    enabled: bool = True
    # /health must fail this many times in a row, spanning at least health_window.
    health_failures: int = Field(3, ge=1)
    health_window: Duration = 3.0


class DetectorConfig(StrictModel):
    # How often the run loop calls assess(); samples arrive on their own schedules.
    interval: Duration = 0.5
    # Hysteresis: suspect goes back to healthy only after every rule stayed clear this long.
    clear_after: Duration = 5.0
    pp_tail_stall: PpTailStallConfig = PpTailStallConfig()
    stage_cpu_stall: StageCpuStallConfig = StageCpuStallConfig()
    generation_frozen: GenerationFrozenConfig = GenerationFrozenConfig()
    client_stall: ClientStallConfig = ClientStallConfig()
    log_signature: LogSignatureConfig = LogSignatureConfig()
    server_gone: ServerGoneConfig = ServerGoneConfig()
