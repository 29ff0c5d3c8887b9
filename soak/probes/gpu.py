"""GPU sources, one interface: ``async read() -> GpuSample``.

- ``NvmlGpuSource``: NVML through nvidia-ml-py (``import pynvml``, or an injected
  provider with the same functions). Every NVML call runs on one daemon worker
  thread under a deadline: a wedged driver gives samples with an error, and
  while a call is still stuck no further call is queued behind it.
- ``DcgmGpuSource``: a dcgm-exporter URL (text format, prometheus_client's parser).
- ``SimGpuSource``: the simulator's ``/sim/dcgm`` (same parser) plus ``/sim/state``
  for the PIDs holding each GPU.

A reading that cannot be taken is a GpuSample with ``error`` set, never an
exception out of ``read()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import concurrent.futures
import queue
import threading
from typing import Any, Callable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from soak.clock import Clock
from soak.errors import GpuUnavailable, ProbeError, ProbeTimeout
from soak.events import EventType
from soak.metric_names import DCGM_FIELDS
from soak.records import GpuSourceLike
from soak.samples import GpuReading, GpuSample, GpuSource


class GpuProbe:
    """A GPU source on the probe scheduler."""

    name = "gpu"

    def __init__(self, source: GpuSourceLike, *, interval_s: float = 0.5) -> None:
        self.source = source
        self.interval_s = interval_s

    async def collect(self) -> list[GpuSample]:
        return [await self.source.read()]

    async def aclose(self) -> None:
        await self.source.aclose()


# -- dcgm-exporter text -------------------------------------------------------------

_DCGM_BY_NAME = {f.exposed: f.key for f in DCGM_FIELDS.values()}


def parse_dcgm(text: str) -> tuple[GpuReading, ...]:
    """dcgm-exporter's text format -> one GpuReading per ``gpu`` label. Pure."""
    per_gpu: dict[int, dict[str, Any]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ProbeError(f"unparsable dcgm-exporter text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            key = _DCGM_BY_NAME.get(sample.name)
            gpu = sample.labels.get("gpu")
            if key is None or gpu is None:
                continue
            try:
                index = int(gpu)
            except ValueError:
                continue
            entry = per_gpu.setdefault(index, {})
            entry[key] = float(sample.value)
            if sample.labels.get("UUID"):
                entry["uuid"] = sample.labels["UUID"]
    readings = []
    for index in sorted(per_gpu):
        e = per_gpu[index]
        used, free = e.get("mem_used_mib"), e.get("mem_free_mib")
        readings.append(
            GpuReading(
                index=index,
                util_pct=e.get("util", 0.0),
                mem_used_mib=used,
                mem_total_mib=used + free if used is not None and free is not None else None,
                power_w=e.get("power_w"),
                sm_clock_mhz=e.get("sm_clock_mhz"),
                pcie_tx_kbs=e["pcie_tx_bytes"] / 1024 if "pcie_tx_bytes" in e else e.get("pcie_tx_kbs"),
                pcie_rx_kbs=e["pcie_rx_bytes"] / 1024 if "pcie_rx_bytes" in e else e.get("pcie_rx_kbs"),
                uuid=e.get("uuid"),
            )
        )
    return tuple(readings)


async def _get_text(session, url: str, timeout_s: float) -> str:
    import aiohttp

    from soak.bounds import InputRejected, fetch

    try:
        resp = await fetch(session, url, total_s=timeout_s)
        if resp.status != 200:
            raise ProbeError(f"GET {url}: HTTP {resp.status}")
        return resp.text()
    except InputRejected as exc:  # a bound hit (bytes, total time) or an unreadable body
        raise ProbeError(str(exc) if url in str(exc) else f"GET {url}: {exc}") from exc
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ProbeError(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc


def _dcgm_signature(text: str) -> tuple:
    """What changes whenever dcgm-exporter collects anew: the energy counter if
    exported (it grows while a GPU draws any power), else every field's value."""
    families = list(text_string_to_metric_families(text))
    energy = DCGM_FIELDS["energy_mj"].exposed
    picked = [f for f in families if f.name == energy] or [f for f in families if f.name in _DCGM_BY_NAME]
    return tuple(sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in picked for s in f.samples))


class DcgmGpuSource:
    """A dcgm-exporter URL. The exporter serves its last collection until the next
    one (every ``-c`` ms, 30 000 by default): the sample's ``fresh_at`` is when the
    readings last changed, so the detector can tell a 30 s-old reading from a new one."""

    def __init__(self, url: str, *, session, clock: Clock, timeout_s: float = 2.0, indices: Sequence[int] | None = None):
        self.url = url
        self._session = session
        self._clock = clock
        self._timeout_s = timeout_s
        self._indices = set(indices) if indices is not None else None
        self._signature: tuple | None = None
        self._changed_at: float | None = None

    async def read(self) -> GpuSample:
        ts = self._clock.now()
        try:
            text = await _get_text(self._session, self.url, self._timeout_s)
            readings = parse_dcgm(text)
            signature = _dcgm_signature(text)
        except ProbeError as exc:
            return GpuSample(ts, GpuSource.DCGM, (), error=str(exc), fresh_at=self._changed_at)
        except (ValueError, TypeError, IndexError) as exc:
            return GpuSample(ts, GpuSource.DCGM, (), error=f"unparsable dcgm-exporter text: {exc}", fresh_at=self._changed_at)
        if signature != self._signature or self._changed_at is None:
            self._signature, self._changed_at = signature, ts
        if self._indices is not None:
            readings = tuple(r for r in readings if r.index in self._indices)
        return GpuSample(ts, GpuSource.DCGM, readings, fresh_at=self._changed_at)

    async def open(self) -> None:
        pass  # an HTTP source: an unreachable exporter is a failed reading, not a missing environment

    async def aclose(self) -> None:
        pass


class SimGpuSource:
    """The simulator: readings from ``/sim/dcgm``, PIDs from ``/sim/state``."""

    def __init__(self, base_url: str, *, session, clock: Clock, timeout_s: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._clock = clock
        self._timeout_s = timeout_s

    async def read(self) -> GpuSample:
        import json

        ts = self._clock.now()
        try:
            dcgm, state = await asyncio.gather(
                _get_text(self._session, f"{self.base_url}/sim/dcgm", self._timeout_s),
                _get_text(self._session, f"{self.base_url}/sim/state", self._timeout_s),
            )
            readings = parse_dcgm(dcgm)
            pids = {int(g["index"]): tuple(int(p) for p in g.get("pids", ())) for g in json.loads(state)["gpus"]}
        except (ProbeError, ValueError, KeyError, TypeError) as exc:
            return GpuSample(ts, GpuSource.SIM, (), error=str(exc))
        readings = tuple(
            dataclasses.replace(r, pids=pids.get(r.index, r.pids)) for r in readings
        )
        return GpuSample(ts, GpuSource.SIM, readings)

    async def open(self) -> None:
        pass  # an HTTP source: nothing to open

    async def aclose(self) -> None:
        pass


class GpuFreshness:
    """Notices a GPU source whose readings are older than ``window_s`` (the
    detector's pp_tail_stall window) and when they are fresh again. Pure:
    ``observe(sample)`` returns the transition, or None.

    A sample's age is ``ts - fresh_at`` (the source's own account), or, for a
    failed reading without one, the time since the last good reading.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.stale = False
        self.max_age_s = 0.0
        self._last_good: float | None = None

    def age(self, sample: GpuSample) -> float | None:
        if sample.fresh_at is not None:
            return max(0.0, sample.ts - sample.fresh_at)
        if sample.error is None:
            return 0.0
        return None if self._last_good is None else max(0.0, sample.ts - self._last_good)

    def observe(self, sample: GpuSample) -> dict[str, Any] | None:
        age = self.age(sample)
        if sample.error is None:
            self._last_good = sample.fresh_at if sample.fresh_at is not None else sample.ts
        if age is None:
            return None
        self.max_age_s = max(self.max_age_s, age)
        if not self.stale and age > self.window_s:
            self.stale = True
            why = (f"last reading failed: {sample.error}" if sample.error
                   else "the source repeats its last readings (dcgm-exporter's collect interval, -c, is 30 s by default)")
            return {
                "type": EventType.GPU_SOURCE_STALE, "source": sample.source.value, "age_s": round(age, 2),
                "window_s": self.window_s,
                "message": (f"GPU source {sample.source.value} is stale: readings {age:.1f}s old, older than the "
                            f"detector's {self.window_s:g}s window ({why}); GPU rules treat them as missing"),
            }
        if self.stale and age <= self.window_s:
            self.stale = False
            return {"type": EventType.GPU_SOURCE_FRESH, "source": sample.source.value, "age_s": round(age, 2),
                    "message": f"GPU source {sample.source.value} is fresh again"}
        return None


# -- NVML -----------------------------------------------------------------------------


class _DeadlineWorker:
    """One daemon thread running submitted calls in order. A daemon, so a call
    wedged in the driver never holds up the harness's exit."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the awaiting side
                future.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)


def _load_pynvml():
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise GpuUnavailable("NVML: the nvidia-ml-py package is not installed") from exc
    return pynvml


def _mib(n_bytes: float) -> float:
    return n_bytes / (1024 * 1024)


class NvmlGpuSource:
    """GPUs through NVML. ``provider`` is the ``pynvml`` module or a stand-in with
    the same functions and constants (tests inject one; no GPU is needed)."""

    def __init__(
        self,
        *,
        clock: Clock,
        provider: Any | None = None,
        indices: Sequence[int] | None = None,
        deadline_s: float = 2.0,
    ) -> None:
        self._clock = clock
        self._provider = provider
        self._indices = tuple(indices) if indices is not None else None
        self.deadline_s = deadline_s
        self._worker: _DeadlineWorker | None = None
        self._pending: concurrent.futures.Future | None = None
        self._handles: list[tuple[int, Any]] = []
        self._last_sample_ts: dict[int, int] = {}
        self._closed = False
        self._last_ok: float | None = None  # the last reading that came back

    @property
    def nvml(self):
        if self._provider is None:
            self._provider = _load_pynvml()
        return self._provider

    async def open(self) -> None:
        """Initialise NVML; GpuUnavailable when there is no driver, GPU or answer."""
        nvml = self.nvml
        if self._worker is None:
            self._worker = _DeadlineWorker("soak-nvml")
        try:
            self._handles = await self._call(self._init)
        except ProbeError as exc:
            raise GpuUnavailable(f"NVML did not answer: {exc}") from exc
        except nvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML unavailable: {exc}") from exc
        if not self._handles:
            raise GpuUnavailable("NVML lists no GPU")

    def _init(self) -> list[tuple[int, Any]]:
        nvml = self.nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        wanted = self._indices if self._indices is not None else tuple(range(count))
        for index in wanted:
            if not 0 <= index < count:
                raise nvml.NVMLError(getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2))
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in wanted]

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread: ProbeTimeout past the deadline, ProbeError
        while an earlier call is still stuck (nothing is queued behind it)."""
        assert self._worker is not None
        if self._pending is not None and not self._pending.done():
            raise ProbeError(f"an NVML call is still blocked (deadline {self.deadline_s:g}s); not queueing another")
        future = self._worker.submit(fn)
        self._pending = future
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.deadline_s)
        except asyncio.TimeoutError as exc:
            raise ProbeTimeout(f"NVML call ran past its {self.deadline_s:g}s deadline") from exc

    async def read(self) -> GpuSample:
        ts = self._clock.now()
        if self._closed:
            return GpuSample(ts, GpuSource.NVML, (), error="source closed")
        try:
            if self._worker is None:
                await self.open()
            readings = await self._call(self._read_all)
        except (ProbeError, GpuUnavailable) as exc:
            return GpuSample(ts, GpuSource.NVML, (), error=str(exc), fresh_at=self._last_ok)
        except Exception as exc:  # NVMLError_GpuIsLost and friends, translated here
            return GpuSample(ts, GpuSource.NVML, (), error=f"NVML: {type(exc).__name__}: {exc}", fresh_at=self._last_ok)
        self._last_ok = ts
        return GpuSample(ts, GpuSource.NVML, readings)

    def _optional(self, fn: Callable[[], Any]) -> Any:
        """Calls a card may not support (power, PCIe on some boards) give None."""
        nvml = self.nvml
        try:
            return fn()
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (
                getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4),
            ):
                return None
            raise

    def _util_samples(self, index: int, handle: Any) -> tuple[float, ...]:
        nvml = self.nvml
        last = self._last_sample_ts.get(index, 0)
        try:
            _, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, last)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (
                getattr(nvml, "NVML_ERROR_NOT_FOUND", 6),
                getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
            ):
                return ()
            raise
        fresh = sorted((s for s in samples if s.timeStamp > last), key=lambda s: s.timeStamp)
        if not fresh:
            return ()
        self._last_sample_ts[index] = fresh[-1].timeStamp
        if last == 0:
            fresh = fresh[-1:]  # the first call returns the whole buffer; keep only the newest
        return tuple(float(s.sampleValue.uiVal) for s in fresh)

    def _read_all(self) -> tuple[GpuReading, ...]:
        nvml = self.nvml
        out = []
        for index, handle in self._handles:
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = self._optional(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            power = self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
            clock = self._optional(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            tx = self._optional(lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES))
            rx = self._optional(lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES))
            procs = self._optional(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or ()
            uuid = self._optional(lambda: nvml.nvmlDeviceGetUUID(handle))
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            out.append(
                GpuReading(
                    index=index,
                    util_pct=float(util.gpu),
                    mem_used_mib=_mib(mem.used) if mem is not None else None,
                    mem_total_mib=_mib(mem.total) if mem is not None else None,
                    power_w=power / 1000.0 if power is not None else None,
                    sm_clock_mhz=float(clock) if clock is not None else None,
                    pcie_tx_kbs=float(tx) if tx is not None else None,
                    pcie_rx_kbs=float(rx) if rx is not None else None,
                    pids=tuple(sorted({int(p.pid) for p in procs})),
                    util_samples=self._util_samples(index, handle),
                    uuid=uuid,
                )
            )
        return tuple(out)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if self._pending is None or self._pending.done():
            shutdown = getattr(self.nvml, "nvmlShutdown", None)
            if shutdown is not None:
                worker.submit(shutdown)
        worker.close()
