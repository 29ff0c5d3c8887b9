"""Where the probes' samples and the load's request records come in: each goes to
the detector or the criteria, to the sinks, and to whoever watches it live (the
responder's recent window, the GPU and /metrics freshness, the live thresholds,
the cached-tokens reader's view of the server's lives)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from soak.clock import Clock
from soak.criteria.rules import RequestTally
from soak.detect.detector import Detector
from soak.events import Emit, EventType
from soak.probes.gpu import GpuFreshness
from soak.records import RunSink
from soak.run.freshness import MetricsFreshness
from soak.run.live_judge import LiveJudge
from soak.logsignatures import JIT_COMPILE
from soak.samples import GpuSample, LogSample, RequestRecord, Sample, ServerSample
from soak.counters import CounterDelta

# The responder's "last minutes" come from here; bounded whatever the run's length.
RECENT_SAMPLES_MAX = 20_000


class FanIn:
    def __init__(self, *, sinks: RunSink, detector: Detector, tally: RequestTally, live: LiveJudge, clock: Clock,
                 emit: Emit, samples_window_s: float, gpu_window_s: float, metrics_interval_s: float) -> None:
        from soak.store.summary import SERVER_KEYS

        self._sinks = sinks
        self._detector = detector
        self._tally = tally
        self._live = live
        self._clock = clock
        self._emit = emit
        self._window = samples_window_s
        self._recent: deque[Sample] = deque(maxlen=RECENT_SAMPLES_MAX)
        self._gpu_freshness = GpuFreshness(gpu_window_s)
        self._metrics_freshness = MetricsFreshness(metrics_interval_s=metrics_interval_s, server_keys=SERVER_KEYS)
        self._server_life = CounterDelta()  # a split of the server's prompt counter: it restarted
        self.cached_reader: Any = None  # soak.versions.CachedTokensReader, once the server's version is known
        # Set by a sample that settles a rule at once: the watch loop judges then,
        # not up to a detector interval later.
        self.judge_now = asyncio.Event()
        # The canary probe (soak.probes.canary): the server's state at a bad answer,
        # the load's busy time for its share.
        self.canaries: Any = None

    def on_sample(self, sample: Sample) -> None:
        recent = self._recent
        recent.append(sample)
        # Keep only the responder's window (by time; the count bound is a backstop).
        horizon = sample.ts - self._window
        while recent and recent[0].ts < horizon:
            recent.popleft()
        if self._detector.observe(sample):
            self.judge_now.set()
        self._sinks.on_sample(sample)
        if self.canaries is not None:
            self.canaries.observe(sample)
        if isinstance(sample, GpuSample):
            change = self._gpu_freshness.observe(sample)
            if change is not None:
                self._emit(change.pop("type"), **change)
        if isinstance(sample, LogSample) and sample.signature == JIT_COMPILE:
            # On the timeline, at the log probe's time: the incident and the report
            # show it when it came shortly before a hang.
            self._emit(EventType.JIT_COMPILE, kernel=sample.fields.get("kernel"),
                       compiler=sample.fields.get("compiler"), worker=sample.fields.get("worker"),
                       pid=sample.fields.get("pid"), line=sample.line[:500])
        if isinstance(sample, ServerSample):
            said = self._metrics_freshness.observe(sample)
            if said is not None:
                self._emit(said[0], **said[1])
            if sample.ok and self._server_life.add(sample.values.get("prompt_tokens")) \
                    and self.cached_reader is not None:
                self.cached_reader.restarted()  # its counters restarted: a new server life (an attached one too)
            if sample.ok:
                self._live.add_server(sample.ts, sample.values)

    def on_record(self, record: RequestRecord) -> None:
        # Live, a record ends now on the run's monotonic clock, as the load's span does.
        self._tally.add(record, at=self._clock.monotonic())
        if self.canaries is not None:
            self.canaries.note_request(record)
        self._sinks.on_request(record)
        self._live.add_request(record)

    def recent_samples(self) -> list[Sample]:
        since = self._clock.now() - self._window
        return [s for s in self._recent if s.ts >= since]
