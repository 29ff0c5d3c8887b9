"""Server metrics: ``/metrics`` text -> ServerSample.values keyed by metric_names keys.

``parse_metrics`` is pure: prometheus_client's parser over the sample lines the
table can read (a broken line of another family does not fail the scrape), then
a lookup of each key of the one table under its exposed name and its aliases. Counters are found
with or without ``_total``; hidden deprecated names stand in for current ones.
Values are summed over label sets; histograms give ``<key>_sum`` and ``<key>_count``.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from soak.bounds import InputRejected, fetch
from soak.clock import Clock
from soak.errors import MetricsUnavailable
from soak.metric_names import VLLM_METRICS, MetricSpec, MetricType
from soak.samples import ServerSample

if TYPE_CHECKING:
    from soak.versions import VllmProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParsedMetrics:
    values: Mapping[str, float]
    # keys expected on every vLLM 0.11 server that the text lacked
    missing: tuple[str, ...]


# A sample line's metric name; a line that does not start with one is left for
# the parser to reject.
_SAMPLE_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def sample_names(table: Mapping[str, MetricSpec]) -> frozenset[str]:
    """Every sample name ``lookup`` can read for ``table``."""
    names: set[str] = set()
    for spec in table.values():
        for name in _candidates(spec):
            base = name[: -len("_total")] if name.endswith("_total") else name
            names.update((name, base, f"{base}_total", f"{name}_sum", f"{name}_count"))
    return frozenset(names)


def _only(text: str, names: frozenset[str]) -> str:
    """The sample lines of ``names`` (and any line that is not a sample line).

    A real vLLM's /metrics is 600-700 lines, mostly histogram buckets and
    families soak never reads; prometheus_client parses them at about 45 us a
    line, 30 ms a scrape, every second of a soak. Comments go too: a sample with
    no ``# TYPE`` is still summed under its own name."""
    kept = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = _SAMPLE_NAME.match(line)
        if name is None or name.group() in names:
            kept.append(line)
    return "\n".join(kept) + "\n"


def sums_by_sample_name(text: str, names: frozenset[str] | None = None) -> dict[str, float]:
    """The value of every sample (of ``names`` only, when given) summed over its
    label sets, by sample name."""
    sums: dict[str, float] = defaultdict(float)
    if names is not None:
        text = _only(text, names)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] += float(sample.value)
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsUnavailable(f"unparsable /metrics text: {exc}") from exc
    return dict(sums)


def _candidates(spec: MetricSpec) -> tuple[str, ...]:
    return (spec.exposed, *spec.aliases)


def lookup(spec: MetricSpec, sums: Mapping[str, float]) -> dict[str, float]:
    """The values one table entry contributes, or {} when absent."""
    for name in _candidates(spec):
        if spec.type is MetricType.HISTOGRAM:
            if f"{name}_count" in sums:
                return {f"{spec.key}_sum": sums.get(f"{name}_sum", 0.0), f"{spec.key}_count": sums[f"{name}_count"]}
            continue
        if spec.type is MetricType.COUNTER:
            base = name[: -len("_total")] if name.endswith("_total") else name
            for sample_name in (f"{base}_total", base):
                if sample_name in sums:
                    return {spec.key: sums[sample_name]}
            continue
        if name in sums:
            return {spec.key: sums[name]}
    return {}


_VLLM_SAMPLE_NAMES = sample_names(VLLM_METRICS)


def parse_metrics(
    text: str, table: Mapping[str, MetricSpec] = VLLM_METRICS, *, profile: "VllmProfile | None" = None
) -> ParsedMetrics:
    """``missing`` lists the keys the server should expose and does not: with a
    version ``profile``, only families that version has (0.33 has no
    ``time_per_output_token_seconds``)."""
    sums = sums_by_sample_name(text, _VLLM_SAMPLE_NAMES if table is VLLM_METRICS else sample_names(table))
    values: dict[str, float] = {}
    missing: list[str] = []
    for key, spec in table.items():
        found = lookup(spec, sums)
        if found:
            values.update(found)
        elif not spec.hidden and not spec.spec_decode_only and (profile is None or profile.exposes(spec.exposed)):
            missing.append(key)
    return ParsedMetrics(values, tuple(missing))


class MetricsProbe:
    """Scrapes ``{base_url}/metrics``; a failed scrape is a sample with ok=False."""

    name = "metrics"

    def __init__(
        self,
        base_url: str,
        *,
        session,
        clock: Clock,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self._session = session
        self._clock = clock
        self._timeout_s = timeout_s
        self._warn = warn or log.warning
        self._warned: set[str] = set()
        # Set once the server's GET /version is known (soak.versions.profile_for).
        self.version_profile: "VllmProfile | None" = None

    async def collect(self) -> list[ServerSample]:
        import aiohttp

        started = time.monotonic()
        ts = self._clock.now()
        try:
            # Bounded in total time and decompressed bytes: a bomb or a trickle is a failed sample.
            resp = await fetch(self._session, self.url, total_s=self._timeout_s)
            if resp.status != 200:
                raise MetricsUnavailable(f"GET {self.url}: HTTP {resp.status}")
            parsed = parse_metrics(resp.text(), profile=self.version_profile)
        except MetricsUnavailable as exc:
            return [ServerSample(ts, False, error=str(exc), latency_s=time.monotonic() - started)]
        except InputRejected as exc:
            error = str(exc) if self.url in str(exc) else f"GET {self.url}: {exc}"
            return [ServerSample(ts, False, error=error, latency_s=time.monotonic() - started)]
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"GET {self.url}: {type(exc).__name__}: {exc}".rstrip(": ")
            return [ServerSample(ts, False, error=error, latency_s=time.monotonic() - started)]
        new = [k for k in parsed.missing if k not in self._warned]
        if new:
            self._warned.update(new)
            self._warn(f"{self.url} lacks {', '.join(new)}: rules that need them degrade")
        return [ServerSample(ts, True, parsed.values, parsed.missing, latency_s=time.monotonic() - started)]

    async def aclose(self) -> None:
        pass
