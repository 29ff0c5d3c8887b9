"""GPU sources: NVML (against an injected stand-in for pynvml: no GPU here),
dcgm-exporter text over real HTTP, and the simulator's /sim/dcgm + /sim/state."""

from __future__ import annotations

import asyncio
import json
import threading
import types
from pathlib import Path

import pytest
from aiohttp import web

from soak.clock import ManualClock
from soak.errors import GpuUnavailable
from soak.probes.build import build_gpu_source
from soak.probes.config import ProbesConfig
from soak.probes.gpu import DcgmGpuSource, NvmlGpuSource, SimGpuSource, parse_dcgm
from soak.samples import GpuSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
MIB = 1024 * 1024


class FakeNVMLError(Exception):
    def __init__(self, value):
        self.value = value
        super().__init__(f"NVML error {value}")


class FakeNvml:
    """The slice of pynvml's module interface NvmlGpuSource uses, with its constants."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self, count=2, *, init_error=None):
        self.count = count
        self.init_error = init_error
        self.util = {i: 100 for i in range(count)}
        self.samples = {i: [] for i in range(count)}  # (timestamp_us, value)
        self.pids = {i: [] for i in range(count)}
        self.power_supported = True
        self.block = None  # a threading.Event: calls wait on it (a wedged driver)
        self.calls = 0
        self.shutdowns = 0

    def _enter(self):
        self.calls += 1
        if self.block is not None:
            self.block.wait(10)

    def nvmlInit(self):
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUtilizationRates(self, h):
        self._enter()
        return types.SimpleNamespace(gpu=self.util[h[1]], memory=0)

    def nvmlDeviceGetSamples(self, h, kind, last):
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        fresh = [s for s in self.samples[h[1]] if s[0] > last]
        if not fresh:
            raise FakeNVMLError(self.NVML_ERROR_NOT_FOUND)
        return 1, [types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=v)) for t, v in fresh]

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=22800 * MIB, total=24576 * MIB, free=1776 * MIB)

    def nvmlDeviceGetPowerUsage(self, h):
        if not self.power_supported:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 341250

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1695

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return 1200 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 3400

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=10 * MIB) for p in self.pids[h[1]]]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h[1]}"


def _live_sources():
    return [t for t in threading.enumerate() if t.name == "soak-nvml"]


@pytest.fixture
async def nvml_source():
    """``make(fake, **kw) -> NvmlGpuSource``; closed at teardown, blocked calls released."""
    made = []

    def make(fake, **kw):
        source = NvmlGpuSource(clock=ManualClock(1_800_000_000.0), provider=fake, **kw)
        made.append((source, fake))
        return source

    yield make
    for source, fake in made:
        if fake.block is not None:
            fake.block.set()
        await source.aclose()


async def test_nvml_reading_has_every_field_and_only_new_200ms_samples(nvml_source):
    fake = FakeNvml()
    fake.util = {0: 100, 1: 0}
    fake.pids = {0: [4300, 4300, 4301], 1: []}
    fake.samples = {0: [(1_000, 90), (2_000, 100)], 1: [(1_000, 5), (2_000, 0)]}
    source = nvml_source(fake)
    first = await source.read()
    assert first.error is None and first.source is GpuSource.NVML
    g0, g1 = first.gpus
    assert (g0.index, g0.util_pct, g1.util_pct) == (0, 100.0, 0.0)
    assert g0.mem_used_mib == 22800 and g0.mem_total_mib == 24576
    assert g0.power_w == pytest.approx(341.25) and g0.sm_clock_mhz == 1695
    assert (g0.pcie_tx_kbs, g0.pcie_rx_kbs) == (1200, 3400)
    assert g0.pids == (4300, 4301) and g1.pids == ()
    assert g0.uuid == "GPU-fake-0"
    assert g0.util_samples == (100.0,)  # the first call returns the whole buffer: newest only
    fake.samples[0] += [(3_000, 100), (4_000, 95)]
    second = await source.read()
    assert second.gpus[0].util_samples == (100.0, 95.0)  # only samples since the last read
    assert second.gpus[1].util_samples == ()


async def test_nvml_unsupported_field_is_none(nvml_source):
    fake = FakeNvml(1)
    fake.power_supported = False
    sample = await nvml_source(fake).read()
    assert sample.error is None and sample.gpus[0].power_w is None


async def test_nvml_indices_select_gpus(nvml_source):
    sample = await nvml_source(FakeNvml(4), indices=[2, 3]).read()
    assert [g.index for g in sample.gpus] == [2, 3]


async def test_missing_nvml_is_gpu_unavailable(nvml_source):
    source = nvml_source(FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(GpuUnavailable):
        await source.open()
    with pytest.raises(GpuUnavailable):
        await nvml_source(FakeNvml(0)).open()
    # read() never raises: the same failure is a sample with an error
    sample = await nvml_source(FakeNvml(init_error=12)).read()
    assert sample.error and sample.gpus == ()


async def test_wedged_nvml_call_gives_error_samples_without_piling_up_threads(nvml_source):
    fake = FakeNvml(1)
    source = nvml_source(fake, deadline_s=0.2)
    assert (await source.read()).error is None
    fake.block = threading.Event()
    nvml_threads = len(_live_sources())
    late = await source.read()
    assert late.error and "deadline" in late.error
    calls = fake.calls
    for _ in range(3):
        blocked = await source.read()
        assert blocked.error and "still blocked" in blocked.error
    assert fake.calls == calls  # nothing queued behind the stuck call
    assert len(_live_sources()) == nvml_threads  # one worker thread, still the same one
    fake.block.set()  # the driver answers again
    fake.block = None
    for _ in range(50):
        recovered = await source.read()
        if recovered.error is None:
            break
        await asyncio.sleep(0.02)  # the next probe tick
    assert recovered.error is None and recovered.gpus[0].util_pct == 100.0


async def test_nvml_close_is_idempotent_and_shuts_nvml_down(nvml_source):
    fake = FakeNvml(1)
    source = nvml_source(fake)
    await source.read()
    await source.aclose()
    await source.aclose()
    assert (await source.read()).error == "source closed"


def test_dcgm_text_parses_per_gpu():
    g0, g1 = parse_dcgm((FIXTURES / "dcgm_exporter.txt").read_text())
    assert (g0.index, g0.util_pct, g1.util_pct) == (0, 100.0, 0.0)
    assert g0.mem_used_mib == 22800 and g0.mem_total_mib == 22800 + 1776
    assert g0.power_w == 341.25 and g1.sm_clock_mhz == 210
    assert g0.uuid.startswith("GPU-5b1a")


async def test_dcgm_source_over_http(serve, session):
    base = await serve({"/metrics": (FIXTURES / "dcgm_exporter.txt").read_text()})
    source = DcgmGpuSource(base + "/metrics", session=session, clock=ManualClock(), indices=[1])
    sample = await source.read()
    assert sample.error is None and [g.index for g in sample.gpus] == [1]
    broken = DcgmGpuSource(base + "/nothing", session=session, clock=ManualClock())
    failed = await broken.read()
    assert failed.error and "404" in failed.error and failed.gpus == ()


async def test_sim_source_merges_pids_from_sim_state(serve, session):
    text = (FIXTURES / "dcgm_exporter.txt").read_text()
    state = {"gpus": [{"index": 0, "util_pct": 100, "pids": [4300]}, {"index": 1, "util_pct": 0, "pids": [4301]}],
             "processes": {"api_server": 1, "engine_core": 2, "workers": [4300, 4301]}}

    async def sim_state(request):
        return web.json_response(state)

    base = await serve({"/sim/dcgm": text, "/sim/state": sim_state})
    sample = await SimGpuSource(base, session=session, clock=ManualClock()).read()
    assert sample.error is None and sample.source is GpuSource.SIM
    assert [(g.index, g.util_pct, g.pids) for g in sample.gpus] == [(0, 100.0, (4300,)), (1, 0.0, (4301,))]
    state["gpus"] = "garbage"
    assert (await SimGpuSource(base, session=session, clock=ManualClock()).read()).error


def test_gpu_config_kinds_pick_sources():
    clock = ManualClock()
    auto = ProbesConfig()
    assert isinstance(build_gpu_source(auto, base_url="http://x", session=None, clock=clock, is_simulator=True),
                      SimGpuSource)
    assert isinstance(build_gpu_source(auto, base_url="http://x", session=None, clock=clock, is_simulator=False),
                      NvmlGpuSource)
    dcgm = ProbesConfig.model_validate({"gpu": {"kind": "dcgm", "url": "http://127.0.0.1:9400/metrics"}})
    assert isinstance(build_gpu_source(dcgm, base_url="http://x", session=None, clock=clock, is_simulator=True),
                      DcgmGpuSource)
    none = ProbesConfig.model_validate({"gpu": {"kind": "none"}})
    assert build_gpu_source(none, base_url="http://x", session=None, clock=clock, is_simulator=True) is None


def test_unknown_gpu_kind_names_the_known_ones(tmp_path):
    from soak.config import load_run_config
    from soak.errors import ConfigError

    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({"probes": {"gpu": {"kind": "rocm"}}}))
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    message = str(info.value)
    assert "probes.gpu" in message and "unknown kind rocm, known: auto, sim, nvml, dcgm, stage_cpu, none" in message
