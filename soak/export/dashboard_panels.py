"""The soak dashboard's panels: declarative data (titles, queries,
units, mappings), laid out and serialized by ``soak.export.dashboard``.

Every query goes through the ``$datasource`` variable and filters on the
``box`` label (``$box``; "All" also matches series without the label), so the
same dashboard serves any Prometheus that scrapes the harness, the server and
dcgm-exporter.
"""

from __future__ import annotations

from soak.export.grafana import Panel, Target

BOX = 'box=~"$box"'

_DETECTOR_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "healthy", "color": "green", "index": 0},
            "1": {"text": "suspect", "color": "orange", "index": 1},
            "2": {"text": "hung", "color": "red", "index": 2},
        },
    }
]
_RULE_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "-1": {"text": "inactive", "color": "transparent", "index": 0},
            "0": {"text": "clear", "color": "green", "index": 1},
            "1": {"text": "pending", "color": "orange", "index": 2},
            "2": {"text": "fired", "color": "red", "index": 3},
        },
    }
]
# Grey, not red: no harness to scrape is the normal state between nights.
NO_RUN_GREY = "#808080"
_RUN_MAPPINGS = [
    {"type": "value", "options": {"0": {"text": "no run", "color": NO_RUN_GREY, "index": 0},
                                  "1": {"text": "running", "color": "green", "index": 1}}},
    {"type": "special", "options": {"match": "null+nan", "result": {"text": "no run", "color": NO_RUN_GREY, "index": 2}}},
]
_DETECTOR_THRESHOLDS = {
    "mode": "absolute",
    "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 1}, {"color": "red", "value": 2}],
}
# The PP deadlock leaves one GPU at 0 % beside busy ones: idle is red, busy
# green, so the stalled stage is the one red row. (Busy is not progress: the
# token-rate panels beside it tell a spinning pipeline from a working one.)
_UTIL_THRESHOLDS = {
    "mode": "absolute",
    "steps": [{"color": "red", "value": None}, {"color": "yellow", "value": 10}, {"color": "green", "value": 90}],
}


def _rate(metric: str, window: str = "$__rate_interval") -> str:
    return f"rate({metric}{{{BOX}}}[{window}])"


def _quantile(q: float, bucket: str) -> str:
    return f"histogram_quantile({q}, sum by (le) ({_rate(bucket)}))"


def panels() -> list[list[Panel]]:
    """The dashboard, row by row (each inner list fills one or more grid lines)."""
    stat_opts = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "background"}
    return [
        [
            Panel(
                "Detector",
                "stat",
                [Target(f"max(soak_detector_state{{{BOX}}})", "detector")],
                width=4,
                height=4,
                description="soak's detector now: healthy, suspect or hung.",
                mappings=_DETECTOR_MAPPINGS,
                thresholds=_DETECTOR_THRESHOLDS,
                options=stat_opts,
            ),
            Panel(
                "Incidents this run",
                "stat",
                [Target(f"sum(soak_incidents_total{{{BOX}}}) or vector(0)", "incidents")],
                width=4,
                height=4,
                thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}]},
                options=stat_opts,
            ),
            Panel(
                "Time remaining",
                "stat",
                [Target(f"max(soak_run_time_remaining_seconds{{{BOX}}})", "remaining")],
                width=4,
                height=4,
                unit="s",
                options={**stat_opts, "colorMode": "none"},
            ),
            Panel(
                "Run now",
                "stat",
                [Target(f'max(up{{job="soak",{BOX}}})', "run")],
                width=4,
                height=4,
                description=(
                    "running while Prometheus reaches the harness's exporter; no run (grey) once it has gone, "
                    "as after every night that ended. How the night went is in the annotations (run started, "
                    "incidents, run ended) and on the nights dashboard; a harness that died mid-run has no "
                    "'run ended' annotation."
                ),
                mappings=_RUN_MAPPINGS,
                thresholds={"mode": "absolute", "steps": [{"color": NO_RUN_GREY, "value": None},
                                                          {"color": "green", "value": 1}]},
                options=stat_opts,
            ),
            Panel(
                "Run",
                "table",
                # Every run of the time range, not only one running now: at 09:00 the table names last night's.
                # (run!="": before the run starts the exporter's info has no labels yet.)
                [Target(f'last_over_time(soak_run_info{{run!="",{BOX}}}[$__range])', "", instant=True, table=True)],
                width=8,
                height=4,
                description="The runs of the time range: name, workload and target.",
                options={"showHeader": True},
                transformations=[
                    {
                        "id": "organize",
                        "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}},
                    }
                ],
            ),
        ],
        [
            Panel(
                "GPU utilization (harness)",
                "state-timeline",
                [Target(f"max by (gpu) (soak_gpu_utilization_percent{{{BOX}}})", "GPU {{gpu}}")],
                width=12,
                height=9,
                description="As the run's GPU source sampled it. One red row beside green ones: the last pipeline stage idle while NCCL spins on the others.",
                unit="percent",
                min=0,
                max=100,
                thresholds=_UTIL_THRESHOLDS,
                options={"showValue": "never", "mergeValues": False, "rowHeight": 0.8, "alignValue": "left"},
            ),
            Panel(
                "GPU utilization (dcgm-exporter)",
                "state-timeline",
                [Target(f"max by (gpu) (DCGM_FI_DEV_GPU_UTIL{{{BOX}}})", "GPU {{gpu}}")],
                width=12,
                height=9,
                description="dcgm-exporter's reading, when one is scraped.",
                unit="percent",
                min=0,
                max=100,
                thresholds=_UTIL_THRESHOLDS,
                options={"showValue": "never", "mergeValues": False, "rowHeight": 0.8, "alignValue": "left"},
            ),
        ],
        [
            Panel(
                "Stage CPU (no GPUs)",
                "state-timeline",
                [Target(f"max by (stage) (soak_stage_cpu_percent{{{BOX}}})", "stage {{stage}}")],
                width=24,
                height=6,
                description=(
                    "Each pipeline stage's worker CPU, % of one core, when the server has no GPUs (vLLM's CPU "
                    "build; probes.gpu stage_cpu). Not a GPU reading: a stuck gloo pipeline sleeps where NCCL "
                    "would spin, and a deaf last stage spins alone."
                ),
                unit="percent",
                min=0,
                max=100,
                thresholds=_UTIL_THRESHOLDS,
                options={"showValue": "never", "mergeValues": False, "rowHeight": 0.8, "alignValue": "left"},
            ),
        ],
        [
            Panel(
                "Generated tokens",
                "timeseries",
                [
                    Target(f"sum({_rate('vllm:generation_tokens_total')})", "server generated"),
                    Target(f"sum({_rate('soak_client_streamed_tokens_total')})", "client streamed (content chunks)"),
                    Target(f"sum({_rate('soak_generated_tokens_total')})", "client generated (finished requests)"),
                ],
                width=8,
                description="Decode, from vLLM's /metrics beside what the client received. A flat line at 0 with "
                "requests running is a hang or a long prefill; the detector tells which. Prompt tokens have a "
                "panel of their own: thousands of times more per second, they would flatten this line.",
                unit="short",
                min=0,
            ),
            Panel(
                "Prompt tokens (prefill)",
                "timeseries",
                [
                    Target(f"sum({_rate('vllm:prompt_tokens_total')})", "server prompt"),
                    Target(f"sum({_rate('soak_prompt_tokens_total')})", "client prompt (finished requests)"),
                ],
                width=8,
                description="Prompt tokens per second, server and client: agentic contexts run to hundreds of "
                "thousands of tokens a turn.",
                unit="short",
                min=0,
            ),
            Panel(
                "Requests: running, waiting, in flight",
                "timeseries",
                [
                    Target(f"sum(vllm:num_requests_running{{{BOX}}})", "running (server)"),
                    Target(f"sum(vllm:num_requests_waiting{{{BOX}}})", "waiting (server)"),
                    Target(f"sum(soak_requests_in_flight{{{BOX}}})", "in flight (client)"),
                ],
                width=8,
                unit="short",
            ),
        ],
        [
            Panel(
                "Prefix-cache hit ratio",
                "timeseries",
                [
                    Target(
                        f"sum({_rate('vllm:prefix_cache_hits_total', '5m')}) / sum({_rate('vllm:prefix_cache_queries_total', '5m')})",
                        "hits / queries (tokens)",
                    )
                ],
                width=8,
                description="rate(hits) / rate(queries), both in tokens, as vLLM counts them.",
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "Spec-decode acceptance",
                "timeseries",
                [
                    Target(
                        f"sum({_rate('vllm:spec_decode_num_accepted_tokens_total', '5m')}) / sum({_rate('vllm:spec_decode_num_draft_tokens_total', '5m')})",
                        "accepted / drafted tokens",
                    )
                ],
                width=8,
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "KV-cache usage",
                "timeseries",
                [Target(f"max(vllm:kv_cache_usage_perc{{{BOX}}})", "KV usage")],
                width=8,
                unit="percentunit",
                min=0,
                max=1,
            ),
        ],
        [
            Panel(
                "Time to first token",
                "timeseries",
                [
                    Target(_quantile(0.5, "vllm:time_to_first_token_seconds_bucket"), "p50 server"),
                    Target(_quantile(0.99, "vllm:time_to_first_token_seconds_bucket"), "p99 server"),
                    Target(_quantile(0.5, "soak_ttft_seconds_bucket"), "p50 client"),
                    Target(_quantile(0.99, "soak_ttft_seconds_bucket"), "p99 client"),
                ],
                width=12,
                unit="s",
            ),
            Panel(
                "Inter-token latency",
                "timeseries",
                [
                    Target(_quantile(0.5, "vllm:inter_token_latency_seconds_bucket"), "p50 server"),
                    Target(_quantile(0.99, "vllm:inter_token_latency_seconds_bucket"), "p99 server"),
                    Target(_quantile(0.5, "soak_request_mean_itl_seconds_bucket"), "p50 client (per-request mean)"),
                    Target(_quantile(0.99, "soak_request_max_itl_seconds_bucket"), "p99 client (per-request longest gap)"),
                ],
                width=12,
                unit="s",
            ),
        ],
        [
            Panel(
                "Detector rules",
                "state-timeline",
                [
                    Target(f"max(soak_detector_state{{{BOX}}})", "verdict"),
                    Target(f"max by (rule) (soak_detector_rule_state{{{BOX}}})", "{{rule}}"),
                ],
                width=12,
                description="The verdict (healthy, suspect, hung) and each rule (inactive, clear, pending, fired).",
                mappings=_RULE_MAPPINGS,
                overrides=[
                    {
                        "matcher": {"id": "byName", "options": "verdict"},
                        "properties": [{"id": "mappings", "value": _DETECTOR_MAPPINGS}],
                    }
                ],
                thresholds=_DETECTOR_THRESHOLDS,
                options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8},
            ),
            Panel(
                "Finished requests by outcome",
                "timeseries",
                [Target(f"sum by (outcome) ({_rate('soak_requests_total')})", "{{outcome}}")],
                width=6,
                unit="reqps",
            ),
            Panel(
                "Context length",
                "timeseries",
                [
                    Target(f"max(soak_context_length_tokens{{{BOX}}})", "last request"),
                    Target(_quantile(0.5, "soak_request_prompt_tokens_bucket"), "p50"),
                ],
                width=6,
                unit="short",
            ),
        ],
        [
            Panel(
                "End-to-end latency",
                "timeseries",
                [
                    Target(_quantile(0.5, "vllm:e2e_request_latency_seconds_bucket"), "p50 server"),
                    Target(_quantile(0.99, "vllm:e2e_request_latency_seconds_bucket"), "p99 server"),
                    Target(_quantile(0.99, "soak_e2e_request_latency_seconds_bucket"), "p99 client"),
                ],
                width=8,
                unit="s",
            ),
            Panel(
                "GPU memory used",
                "timeseries",
                [Target(f"max by (gpu) (soak_gpu_memory_used_bytes{{{BOX}}})", "GPU {{gpu}}")],
                width=8,
                unit="bytes",
            ),
            Panel(
                "GPU power",
                "timeseries",
                [Target(f"max by (gpu) (soak_gpu_power_watts{{{BOX}}})", "GPU {{gpu}}")],
                width=8,
                unit="watt",
            ),
        ],
        [
            Panel(
                "Client: longest silence on a stream",
                "timeseries",
                [Target(f"max(soak_client_max_silence_seconds{{{BOX}}})", "silence")],
                width=12,
                unit="s",
            ),
            Panel(
                "Probes ok",
                "state-timeline",
                [Target(f"min by (probe) (soak_probe_ok{{{BOX}}})", "{{probe}}")],
                width=12,
                mappings=[
                    {"type": "value", "options": {"0": {"text": "failing", "color": "red"}, "1": {"text": "ok", "color": "green"}}}
                ],
                thresholds={"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]},
                options={"showValue": "never", "mergeValues": True},
            ),
        ],
        # Is it fixed? Only runs with a prove: section move these (docs/prove.md).
        [
            Panel(
                "Is it fixed? (prove:)",
                "state-timeline",
                # One row per state; the row at 1 is where the test stands. A run without prove:
                # exports all four at 0 (so the panel is empty rows, never "No data").
                [Target(f"max by (decision) (soak_prove_decision{{{BOX}}})", "{{decision}}")],
                width=6,
                description="The sequential test's state over the run: undecided, accepted (fixed), rejected, truncated.",
                mappings=[{"type": "value", "options": {"0": {"text": " ", "color": "transparent"},
                                                        "1": {"text": "now", "color": "blue"}}}],
                overrides=[{"matcher": {"id": "byName", "options": name},
                            "properties": [{"id": "mappings", "value": [{"type": "value", "options": {
                                "0": {"text": " ", "color": "transparent"}, "1": {"text": name, "color": color}}}]}]}
                           for name, color in (("accepted", "green"), ("rejected", "red"),
                                               ("undecided", "blue"), ("truncated", "orange"))],
                options={"showValue": "never", "mergeValues": True},
            ),
            Panel(
                "Proof: clean time at risk against the accept line",
                "timeseries",
                [Target(f"max(soak_prove_exposure_seconds{{{BOX}}})", "time at risk"),
                 Target(f"max(soak_prove_accept_at_seconds{{{BOX}}})", "accepted at (with the hangs so far)")],
                width=12,
                unit="s",
                description="The test accepts where the first line meets the second; each hang moves the second up.",
            ),
            Panel(
                "Proof: hangs against the reject line",
                "timeseries",
                [Target(f"max(soak_prove_hangs{{{BOX}}})", "hangs"),
                 Target(f"max(soak_prove_reject_at_hangs{{{BOX}}})", "rejected at")],
                width=6,
            ),
        ],
    ]
