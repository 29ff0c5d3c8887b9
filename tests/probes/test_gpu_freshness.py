"""A GPU source that refreshes more slowly than the detector's window: a fake
dcgm-exporter left at its default 30 s collect interval, a wedged NVML call."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from soak.clock import ManualClock
from soak.detect import Detector, DetectorConfig
from soak.records import RuleState, Topology
from soak.probes.gpu import DcgmGpuSource, GpuFreshness
from soak.samples import ClientSample, GpuReading, GpuSample, GpuSource, ServerSample

LABELS = 'UUID="GPU-{i}",device="nvidia{i}",modelName="NVIDIA GeForce RTX 3090",Hostname="box"'


class FakeExporter:
    """dcgm-exporter's behaviour: it collects every ``interval_s`` (on the test's
    clock) and serves its last collection in between."""

    def __init__(self, clock: ManualClock, *, interval_s: float, utils: list[float]) -> None:
        self.clock, self.interval_s, self.utils = clock, interval_s, utils
        self._collected_at: float | None = None
        self._text = ""

    def _collect(self) -> None:
        now = self.clock.now()
        if self._collected_at is not None and now - self._collected_at < self.interval_s:
            return
        self._collected_at = now
        lines = []
        for name, value in (("DCGM_FI_DEV_GPU_UTIL", lambda i: self.utils[i]),
                            ("DCGM_FI_DEV_POWER_USAGE", lambda i: 100.0 + i),
                            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", lambda i: round(now * 1000 * (100 + i)))):
            lines.append(f"# TYPE {name} gauge")
            lines += [f'{name}{{gpu="{i}",{LABELS.format(i=i)}}} {value(i)}' for i in range(len(self.utils))]
        self._text = "\n".join(lines) + "\n"

    async def handle(self, request: web.Request) -> web.Response:
        self._collect()
        return web.Response(text=self._text)


@pytest.fixture
async def exporter_url():
    servers = []

    async def make(exporter: FakeExporter) -> str:
        app = web.Application()
        app.router.add_get("/metrics", exporter.handle)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return str(server.make_url("/metrics"))

    yield make
    for server in servers:
        await server.close()


async def _read_series(exporter_url, *, interval_s: float, seconds: float, step: float = 0.5):
    clock = ManualClock()
    utils = [100.0] * 7 + [0.0]  # the deadlock's picture, frozen in the exporter
    exporter = FakeExporter(clock, interval_s=interval_s, utils=utils)
    url = await exporter_url(exporter)
    out = []
    async with aiohttp.ClientSession() as session:
        source = DcgmGpuSource(url, session=session, clock=clock)
        for _ in range(int(seconds / step)):
            out.append(await source.read())
            clock.advance(step)
    return out


async def test_an_exporter_at_30s_reads_stale_and_the_gpu_rule_treats_it_as_missing(exporter_url):
    samples = await _read_series(exporter_url, interval_s=30.0, seconds=20.0)
    assert all(s.error is None and len(s.gpus) == 8 for s in samples)
    ages = [s.ts - s.fresh_at for s in samples]
    assert ages[0] == 0 and max(ages) > 3.0  # the same collection served for 20 s

    freshness = GpuFreshness(DetectorConfig().pp_tail_stall.window)
    changes = [c for c in (freshness.observe(s) for s in samples) if c is not None]
    assert [c["type"] for c in changes] == ["gpu_source_stale"]
    assert "older than the detector's 3s window" in changes[0]["message"] and "30 s by default" in changes[0]["message"]

    # the frozen 100%/0% picture never becomes a tail stall: stale is missing, not 0% or 100%
    detector = Detector(DetectorConfig(), topology=Topology.pipeline(8))
    rule = None
    for s in samples:
        detector.observe(ServerSample(s.ts, True, {"num_requests_running": 4.0, "generation_tokens": 100.0}))
        detector.observe(ClientSample(s.ts, in_flight=4, bytes_total=10, tokens_total=10, requests_done=0))
        detector.observe(s)
        assessment = detector.assess(s.ts)
        rule = next(r for r in assessment.rules if r.rule == "pp_tail_stall")
        assert not [d for d in assessment.new_incidents if d.rule == "pp_tail_stall"]
    assert rule.state is RuleState.INACTIVE and "stale GPU readings" in rule.reasons[0]


async def test_an_exporter_at_500ms_stays_fresh_and_the_tail_stall_fires(exporter_url):
    samples = await _read_series(exporter_url, interval_s=0.5, seconds=8.0)
    freshness = GpuFreshness(DetectorConfig().pp_tail_stall.window)
    assert all(freshness.observe(s) is None for s in samples)
    detector = Detector(DetectorConfig(), topology=Topology.pipeline(8))
    fired = []
    for s in samples:
        detector.observe(ServerSample(s.ts, True, {"num_requests_running": 4.0, "generation_tokens": 100.0}))
        detector.observe(s)
        fired += [d.rule for d in detector.assess(s.ts).new_incidents]
    assert fired == ["pp_tail_stall"]


def test_a_wedged_nvml_call_reads_stale_until_a_reading_comes_back():
    freshness = GpuFreshness(3.0)
    good = GpuSample(100.0, GpuSource.NVML, (GpuReading(0, 50.0),))
    assert freshness.observe(good) is None
    stuck = [GpuSample(100.0 + k, GpuSource.NVML, (), error="NVML call ran past its 2s deadline", fresh_at=100.0)
             for k in range(1, 6)]
    changes = [c for c in map(freshness.observe, stuck) if c]
    assert [c["type"] for c in changes] == ["gpu_source_stale"] and "NVML call ran past" in changes[0]["message"]
    back = freshness.observe(GpuSample(106.0, GpuSource.NVML, (GpuReading(0, 50.0),)))
    assert back is not None and back["type"] == "gpu_source_fresh"
    assert freshness.max_age_s == pytest.approx(5.0)
