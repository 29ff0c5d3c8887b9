"""The simulator's /metrics: vLLM 0.11's families, built from soak.metric_names.

One ``CollectorRegistry`` per app. Every series carries ``model_name`` and
``engine="0"``. Scheduler gauges and spec-decode counters move every engine
step; prefix-cache queries when a waiting request is admitted;
``iteration_tokens_total`` only on steps that emit tokens; ``prompt_tokens`` grows by the whole prompt at a
request's first token, ``generation_tokens`` by the tokens emitted. While the
engine is hung nothing calls these, so the values freeze, as on the real server.
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from soak.metric_names import VLLM_METRICS, MetricSpec, MetricType, buckets_1_2_5
from soak.sim.config import SimConfig
from soak.sim.engine import Engine, SimRequest, StepResult

ENGINE_LABEL = "0"


def show_hidden(version: str | None) -> bool:
    """vLLM shows the previous minor version's hidden metrics (0.10 on 0.11)."""
    return version is not None and version.strip() in ("0.10", "0.10.0")


class SimMetrics:
    """The app's registry and the engine observer that feeds it."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry(auto_describe=True)
        hidden = show_hidden(config.show_hidden_metrics_for_version)
        self._m: dict[str, object] = {}
        self._families: dict[str, object] = {}
        exposed = config.profile.metric_families
        for spec in VLLM_METRICS.values():
            if spec.hidden and not hidden:
                continue
            if spec.exposed not in exposed:  # e.g. 0.33 has no time_per_output_token_seconds
                continue
            if spec.spec_decode_only and not config.spec_decode:
                continue
            self._families[spec.key] = self._make(spec)
        labels = (config.model, ENGINE_LABEL)
        for key, family in self._families.items():
            spec = VLLM_METRICS[key]
            if spec.extra_labels:
                continue  # children created on first use (finished_reason, position)
            self._m[key] = family.labels(*labels)
        self._labels = labels
        # plain running totals, for the periodic SpecDecoding log line
        self.spec_drafts = self.spec_draft_tokens = 0
        self.spec_accepted_per_pos = [0] * config.num_speculative_tokens
        for reason in config.profile.finish_reasons:  # vLLM creates these up front
            self._child("request_success", reason)
        for pos in range(config.num_speculative_tokens if config.spec_decode else 0):
            self._child("spec_decode_num_accepted_tokens_per_pos", str(pos))

    def _make(self, spec: MetricSpec):
        labelnames = ("model_name", "engine") + spec.extra_labels
        kw = dict(registry=self.registry, labelnames=labelnames)
        if spec.type is MetricType.COUNTER:
            return Counter(spec.exposed, spec.help, **kw)
        if spec.type is MetricType.GAUGE:
            return Gauge(spec.exposed, spec.help, **kw)
        buckets = spec.buckets or buckets_1_2_5(self.config.max_model_len)
        return Histogram(spec.exposed, spec.help, buckets=buckets, **kw)

    def _child(self, key: str, extra: str):
        family = self._families.get(key)
        return None if family is None else family.labels(*self._labels, extra)

    def _inc(self, key: str, amount: float = 1.0) -> None:
        m = self._m.get(key)
        if m is not None and amount:
            m.inc(amount)

    def _set(self, key: str, value: float) -> None:
        m = self._m.get(key)
        if m is not None:
            m.set(value)

    def _observe(self, key: str, value: float) -> None:
        m = self._m.get(key)
        if m is not None:
            m.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- EngineObserver
    def on_step(self, engine: Engine, result: StepResult) -> None:
        running, waiting = len(engine.running), len(engine.waiting)
        usage = engine.pool.usage
        self._set("num_requests_running", running)
        self._set("num_requests_waiting", waiting)
        self._set("kv_cache_usage_perc", usage)
        self._set("gpu_cache_usage_perc", usage)
        emitted = sum(d.new_tokens for d in result.deltas)
        prompt = sum(d.request.prompt_tokens for d in result.deltas if d.first)
        if emitted:  # vLLM observes it from the step's outputs: prefill-only steps leave it alone
            self._observe("iteration_tokens_total", prompt + emitted)

    def on_prefix_query(self, queries: int, hits: int) -> None:
        for key in ("prefix_cache_queries", "gpu_prefix_cache_queries"):
            self._inc(key, queries)
        for key in ("prefix_cache_hits", "gpu_prefix_cache_hits"):
            self._inc(key, hits)

    def on_spec_decode(self, drafts: int, draft_tokens: int, accepted_per_pos: Sequence[int]) -> None:
        self.spec_drafts += drafts
        self.spec_draft_tokens += draft_tokens
        for pos, n in enumerate(accepted_per_pos):
            self.spec_accepted_per_pos[pos] += n
        self._inc("spec_decode_num_drafts", drafts)
        self._inc("spec_decode_num_draft_tokens", draft_tokens)
        self._inc("spec_decode_num_accepted_tokens", sum(accepted_per_pos))
        for pos, n in enumerate(accepted_per_pos):
            child = self._child("spec_decode_num_accepted_tokens_per_pos", str(pos))
            if child is not None and n:
                child.inc(n)

    def on_first_token(self, req: SimRequest, at: float) -> None:
        self._inc("prompt_tokens", req.prompt_tokens)
        self._observe("time_to_first_token_seconds", at - req.arrival)

    def on_tokens(self, req: SimRequest, n: int, at: float, since_last: float | None) -> None:
        self._inc("generation_tokens", n)
        if since_last is not None:
            self._observe("inter_token_latency_seconds", since_last)
            self._observe("time_per_output_token_seconds", since_last)

    def on_finished(self, req: SimRequest, at: float) -> None:
        child = self._child("request_success", req.finish_reason)
        if child is not None:
            child.inc()
        scheduled = req.scheduled_at if req.scheduled_at is not None else req.arrival
        first = req.first_token_at if req.first_token_at is not None else at
        self._observe("e2e_request_latency_seconds", at - req.arrival)
        self._observe("request_queue_time_seconds", scheduled - req.arrival)
        self._observe("request_prefill_time_seconds", first - scheduled)
        self._observe("request_decode_time_seconds", at - first)
        self._observe("request_inference_time_seconds", at - scheduled)
        self._observe("request_prompt_tokens", req.prompt_tokens)
        self._observe("request_generation_tokens", req.output_tokens)

    def on_preempted(self, req: SimRequest) -> None:
        self._inc("num_preemptions")
