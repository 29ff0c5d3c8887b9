"""/metrics parsing against checked-in real-format text, and the probe over real HTTP."""

from __future__ import annotations

import pytest
from aiohttp import web

from soak.clock import ManualClock
from soak.errors import MetricsUnavailable
from soak.metric_names import VLLM_METRICS
from soak.probes.metrics import MetricsProbe, parse_metrics
from ports import free_port  # per-worker ports: tests/ports.py

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def test_vllm_0_11_text_gives_every_key_summed_over_label_sets():
    parsed = parse_metrics((FIXTURES / "vllm_0_11.txt").read_text())
    v = parsed.values
    assert parsed.missing == ()
    assert v["num_requests_running"] == 7 and v["num_requests_waiting"] == 2
    assert v["kv_cache_usage_perc"] == pytest.approx(0.8124)
    assert v["generation_tokens"] == 48213  # from vllm:generation_tokens_total, not _created
    assert v["prompt_tokens"] == 12841552
    assert v["request_success"] == 51 + 7 + 1  # finished_reason label sets summed
    assert v["prefix_cache_hits"] / v["prefix_cache_queries"] == pytest.approx(12127232 / 12901376)
    assert v["spec_decode_num_accepted_tokens_per_pos"] == 14022 + 7915 + 3990 + 1570 + 685
    assert v["iteration_tokens_total_count"] == 51977
    assert v["time_to_first_token_seconds_sum"] == pytest.approx(187.25)
    # the process_* and python_* families of the real server are not keys of the table
    assert all(k.split("_sum")[0].split("_count")[0] in VLLM_METRICS for k in v)


def test_bare_counters_and_hidden_deprecated_names_stand_in():
    """An exporter without ``_total`` and with only the deprecated gpu_* names."""
    parsed = parse_metrics((FIXTURES / "vllm_hidden_names.txt").read_text())
    v = parsed.values
    assert v["generation_tokens"] == 77 and v["prompt_tokens"] == 4096
    assert v["request_success"] == 3
    assert v["kv_cache_usage_perc"] == 0.25  # from vllm:gpu_cache_usage_perc
    assert v["prefix_cache_queries"] == 4096 and v["prefix_cache_hits"] == 3840
    assert "kv_cache_usage_perc" not in parsed.missing
    assert "num_preemptions" in parsed.missing  # absent here, and said so
    assert not any(VLLM_METRICS[k].hidden or VLLM_METRICS[k].spec_decode_only for k in parsed.missing)


def test_unparsable_text_is_a_metrics_error():
    with pytest.raises(MetricsUnavailable):
        parse_metrics('vllm:num_requests_running{engine="0" 3\n')


@pytest.mark.parametrize("name", ["metrics/vllm_0_11.txt", "metrics/vllm_hidden_names.txt", "real_vllm/metrics.txt"])
def test_reading_only_the_tables_samples_gives_what_the_whole_text_gives(name):
    """The probe hands prometheus_client only the sample lines it reads (a real
    server's text is mostly buckets): the values must be those of the whole text."""
    from prometheus_client.parser import text_string_to_metric_families

    from soak.probes.metrics import lookup

    text = (FIXTURES.parent / name).read_text()
    whole: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            whole[sample.name] = whole.get(sample.name, 0.0) + sample.value
    expected: dict[str, float] = {}
    for spec in VLLM_METRICS.values():
        expected.update(lookup(spec, whole))
    assert len(expected) >= 10
    assert dict(parse_metrics(text).values) == expected


def test_a_broken_line_of_a_family_soak_never_reads_leaves_the_scrape_readable():
    text = (FIXTURES / "vllm_0_11.txt").read_text() + 'custom_exporter_metric{path="/a" 3\n'
    assert parse_metrics(text).values["generation_tokens"] == 48213
    with pytest.raises(MetricsUnavailable):  # a broken line of one it reads still fails the scrape
        parse_metrics(text + 'vllm:generation_tokens_total{engine="0" 3\n')
    with pytest.raises(MetricsUnavailable):  # and so does text that is no exposition at all
        parse_metrics("<html>502 Bad Gateway</html>\n")


async def test_probe_scrapes_and_warns_once_per_missing_metric(serve, session):
    base = await serve({"/metrics": (FIXTURES / "vllm_hidden_names.txt").read_text()})
    warnings: list[str] = []
    clock = ManualClock(1_800_000_000.0)
    probe = MetricsProbe(base, session=session, clock=clock, warn=warnings.append)
    (first,) = await probe.collect()
    clock.advance(1)
    (second,) = await probe.collect()
    assert first.ok and second.ok
    assert first.ts == 1_800_000_000.0 and second.ts == 1_800_000_001.0
    assert second.values["generation_tokens"] == 77
    assert "num_preemptions" in second.missing
    assert len(warnings) == 1 and "num_preemptions" in warnings[0] and base in warnings[0]


async def test_probe_turns_http_errors_and_refusals_into_failed_samples(serve, session):
    async def broken(request):
        return web.Response(status=500, text="boom")

    base = await serve({"/metrics": broken})
    clock = ManualClock()
    (sample,) = await MetricsProbe(base, session=session, clock=clock).collect()
    assert not sample.ok and "HTTP 500" in sample.error
    (garbled,) = await MetricsProbe(await serve({"/metrics": "vllm:num_requests_running{a=\n"}), session=session,
                                    clock=clock).collect()
    assert not garbled.ok and "unparsable" in garbled.error
    # nothing listens on the port of a closed server
    refused_base = await serve({})
    port = free_port()  # a port no test listens on
    (refused,) = await MetricsProbe(f"http://127.0.0.1:{port}", session=session, clock=clock).collect()
    assert not refused.ok and refused.error
    assert refused_base
