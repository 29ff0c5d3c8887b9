"""The words of the config reference the models' source does not hold (soak.configref.walk).

Descriptions here win over the source's comments; keys are canonical
(``target.launched.command``) or ``Class.field`` (every variant that inherits it).
Kept short: the source's own comments are the reference wherever they exist.
"""

from __future__ import annotations

from typing import Any, Callable

PAGE_HEAD = """# Config reference

Every key of a run config, generated from the config models (regenerate with
`{regenerate}`; a test fails when this page is stale).
`soak validate --explain KEY` prints one entry.

Keys are dotted paths. Where a section is one of several kinds (`target`,
`workload`, `corpus`, `tokenizer`, `probes.gpu`, `target.sim.faults[]`), the kind is
part of the key: `target.launched.command` is `command` under `target:` with
`kind: launched`. The YAML leaves the kind out of the path (`target.command`), as
error lines do; `--explain` takes either. Durations take a unit: `250ms`, `30s`,
`5m`, `1h30m` (a bare number is read as seconds, with a warning). A distribution
is a number (constant) or `{{dist: uniform, low: A, high: B}}`,
`{{dist: lognormal, median: M, sigma: S, min: A, max: B}}`.
Each example is a complete YAML fragment that validates.
"""

SECTION_PURPOSES: dict[str, str] = {
    "name": "The run's name, in the run directory's name and the report.",
    "build": "The build label history groups nights by.",
    "duration": "How long the load runs.",
    "warmup": "Load before the judged time starts.",
    "seed": "The seed of every random draw.",
}

# one sentence where the section's docstring opens with a list
SECTION_SUMMARIES: dict[str, str] = {
    "target": "The server under test: the simulator (the default), a command the harness launches, "
              "or a server already running (attached).",
}

_ENABLED = "Switch this rule or step on or off."
DESCRIPTIONS: dict[str, str] = {
    "duration": "How long the load runs (--duration overrides it).",
    "target.kind": "Which server: simulator (started by the harness, the default), launched (a command the "
                   "harness starts) or attached (a server already running at base_url).",
    "workload.kind": "What the requests are: synthetic agentic sessions, a replay of captured requests, "
                     "or a Mooncake trace.",
    "corpus.kind": "Where the text the prompts are made of comes from.",
    "tokenizer.kind": "How prompt tokens are counted: auto (the simulator's tokenizer, else the target's "
                      "/tokenize), target, local (a tokenizer.json) or estimate.",
    "gpu.kind": "Where GPU readings come from (auto: the simulator's GPUs, else NVML; stage_cpu: no GPU).",
    "faults.kind": "Which fault the simulator injects.",
    "name": "The run's name: part of the run directory's name, shown in the report and history.",
    "warmup": "Load applied before the judged time starts (must be shorter than duration).",
    "seed": "Seeds every random draw (sessions, sizes, think times): the same seed, the same plan.",
    "_TargetBase.ready_poll_interval": "How often /health and /v1/models are asked while the target starts.",
    "_TargetBase.tp_size": "The server's tensor-parallel size. None: read from the launch command's vLLM flags, else 1.",
    "_TargetBase.block_size": "The server's KV block size, for the plan's block arithmetic. None: the launch "
                              "command's --block-size, else 16 (the simulator: its own).",
    "SimConfig.model": "The model name the simulator serves.",
    "SimConfig.pp_size": "Pipeline stages (one worker process and simulated GPU each).",
    "SimConfig.time_scale": "How much faster than real time the simulated engine runs.",
    "SimConfig.seed": "Seeds the simulator's draws (acceptance, fault onsets).",
    "SimConfig.block_size": "KV block size, in tokens.",
    "SimConfig.max_num_seqs": "Requests scheduled at once (vLLM's --max-num-seqs).",
    "SimConfig.max_num_batched_tokens": "Tokens per engine step (vLLM's --max-num-batched-tokens).",
    "SimConfig.max_model_len": "The longest context the simulator accepts (vLLM's --max-model-len).",
    "SimConfig.kv_cache_blocks": "KV cache blocks the simulated engine has.",
    "SimConfig.num_speculative_tokens": "Draft tokens per step (0: no speculative decoding).",
    "SimConfig.stage_time": "Fixed time of one pipeline stage per step: a step takes "
                            "pp_size x (stage_time + stage_time_per_token x tokens).",
    "SimConfig.stage_time_per_token": "Time of one stage per token of the step.",
    "SimConfig.gpu_mem_total_mib": "Each simulated GPU's memory.",
    "SimConfig.gpu_mem_used_mib": "Memory each simulated GPU shows in use (model share and KV cache).",
    "SimConfig.gpu_power_idle_w": "Power a simulated GPU draws idle.",
    "SimConfig.gpu_power_busy_w": "Power a simulated GPU draws busy.",
    "SimConfig.hostname": "The Hostname label of the simulated dcgm-exporter.",
    "SimConfig.enable_prompt_tokens_details": "Report cached prompt tokens in usage "
                                              "(vLLM's --enable-prompt-tokens-details).",
    "SimConfig.engine_death_shutdown": "How long after the engine dies the API server shuts itself down.",
    "SimConfig.show_hidden_metrics_for_version": "vLLM's --show-hidden-metrics-for-version.",
    "SimConfig.log_stats_interval": "How often the simulator logs vLLM's stats line.",
    "SimConfig.process_name_prefix": "The prefix of the workers' process titles (VLLM::Worker_PP0).",
    "SimConfig.worker_backend": "What a worker runs: cpu (a simulated load) or cuda (a real kernel, for GPU tests).",
    "SimConfig.faults": "Faults to inject, each tagged by kind; each fires once, when its first trigger is due.",
    "FaultTrigger.at": "Fire this long (simulated) after start-up.",
    "FaultTrigger.after_requests": "Fire when request N+1 arrives.",
    "FaultTrigger.mtbf": "Fire at an exponential draw with this mean (simulated seconds), seeded.",
    "PpDeadlockFault.seq_id": "The sequence id the simulated NCCL watchdog line names.",
    "AllIdleDeadlockFault.ringbuffer_warning_interval": "How often the stuck step logs the shm-broadcast line; "
                                                        "None: the server's.",
    "CrashFault.exit_code": "The API server's exit status.",
    "SlowFault.pause": "How long every stage stays busy with no token (a compile pause).",
    "LaunchedTarget.env": "Environment variables for the server, on top of the harness's own.",
    "LaunchedTarget.cwd": "The server's working directory (None: the harness's).",
    "LaunchedTarget.base_url": "Where the launched server listens (scheme://host:port, no /v1).",
    "LaunchedTarget.stop_timeout": "How long the server may take to stop after SIGTERM before its tree is SIGKILLed.",
    "AttachedTarget.base_url": "Where the running server listens (scheme://host:port, no /v1).",
    "SyntheticAgenticConfig.min_context_tokens": "The smallest context a session's turn has.",
    "SyntheticAgenticConfig.max_context_tokens": "A session ends before its context would pass this; "
                                                 "the slot starts a new one.",
    "SyntheticAgenticConfig.start_context_tokens": "A session's first context: the shared prefix plus the "
                                                   "repository it reads.",
    "SyntheticAgenticConfig.shared_prefix_tokens": "The prefix every session shares (the system prompt and tools).",
    "SyntheticAgenticConfig.tool_call_tokens": "Tokens of each assistant tool call appended to the context.",
    "SyntheticAgenticConfig.tool_result_tokens": "Tokens of each tool result appended to the context.",
    "SyntheticAgenticConfig.output_tokens": "Tokens each turn asks the server to generate (max_tokens).",
    "think_time_s": "Seconds between a turn's answer and the session's next turn.",
    "SyntheticAgenticConfig.at_max": "What a session does at max_context_tokens.",
    "SyntheticAgenticConfig.max_sessions": "Stop after this many sessions (None: until the duration ends).",
    "corpus_max_bytes": "At most this much corpus text is read.",
    "DirectoryCorpus.path": "The folder the corpus text is read from.",
    "DirectoryCorpus.glob": "Which files of the folder are read.",
    "FilesCorpus.paths": "The files the corpus text is read from.",
    "LocalTokenizer.path": "The tokenizer.json to count tokens with.",
    "EstimateTokenizer.chars_per_token": "Count tokens as characters over this.",
    "SyntheticAgenticConfig.context_chunk_tokens": "Tokens of each repository chunk sessions are built from.",
    "SyntheticAgenticConfig.context_chunks": "How many such chunks the corpus is cut into.",
    "SyntheticAgenticConfig.tool_result_pool": "How many distinct tool results are drawn from.",
    "ignore_eos": "Ask the server to generate max_tokens whatever the model says (vLLM's ignore_eos).",
    "ServiceAssumptions.prefill_tokens_per_s": "The prefill speed the plan assumes (only the request count "
                                               "depends on it).",
    "ServiceAssumptions.decode_tokens_per_s": "The decode speed per request the plan assumes.",
    "ReplayJsonlConfig.path": "The JSONL file of captured requests, one a line.",
    "replay": "timestamps: send at the trace's own offsets; closed_loop: each session's next request after the "
              "last one finished.",
    "time_scale": "Divide the trace's time gaps by this (2: twice as fast).",
    "ReplayJsonlConfig.timestamp_unit": "The unit of the lines' timestamp.",
    "ReplayJsonlConfig.default_max_tokens": "max_tokens for a request that gives none.",
    "max_tokens_override": "Send this max_tokens on every request instead of the trace's.",
    "limit": "Replay only the first N lines.",
    "ReplayJsonlConfig.count_tokens": "Count every request's prompt tokens before the run (for the plan).",
    "MooncakeTraceConfig.path": "The Mooncake trace file (JSONL).",
    "MooncakeTraceConfig.block_tokens": "Tokens per hash id's text block.",
    "load.mode": "closed: concurrency sessions, each sending its next turn after the last; open: turns at rate "
                 "per second.",
    "load.concurrency": "Sessions in flight (closed), or the most requests in flight (open).",
    "load.burstiness": "Shape of the gamma gaps between arrivals in open mode (1: Poisson).",
    "load.max_requests": "Stop after this many requests (None: the duration decides).",
    "load.drain": "At the end, wait this long for requests in flight to finish.",
    "load.timeouts.connect": "Connecting to the server, per request.",
    "load.timeouts.first_token": "A request's wait for its first token.",
    "load.timeouts.stall": "The longest gap between two chunks of a stream.",
    "load.timeouts.total": "One request, from start to its last token.",
    "NvmlGpu.indices": "Which GPUs to read (None: every GPU).",
    "NvmlGpu.stages": "per_process only: the pipeline size (None: count the stages seen).",
    "DcgmGpu.url": "The dcgm-exporter's /metrics URL.",
    "DcgmGpu.indices": "Which GPUs to read (None: every GPU it lists).",
    "probes.gpu_interval": "How often GPU readings are taken.",
    "probes.metrics_interval": "How often the server's /metrics is scraped.",
    "probes.health_interval": "How often /health is asked.",
    "probes.process_interval": "How often the server's process tree is read (/proc).",
    "probes.client_interval": "How often the client's stream progress is sampled.",
    "probes.log_interval": "How often the server log is read for new lines.",
    "PpTailStallConfig.low_pct": "At or under this utilization the last stage is idle.",
    "PpTailStallConfig.high_pct": "At or over this an upstream stage is spinning.",
    "LearnedThreshold.safety_factor": "The threshold is the longest recent healthy gap times this.",
    "LearnedThreshold.floor": "The learned threshold is never below this.",
    "LearnedThreshold.ceiling": "The learned threshold is never above this.",
    "ServerGoneConfig.health_window": "The failed /health answers must span at least this long.",
    "NoSuccessCriterion.window": "Fail after this long of nothing but failed requests.",
    "NoSuccessCriterion.min_failures": "The stretch of failures must also hold at least this many.",
    "WorkEvidenceCriterion.min_tokens": "Generated tokens owed in every full window.",
    "criteria.stop_on_breach": "End the soak at once (exit 1) when a criterion is breached for good.",
    "response.max_restarts": "With on_hang restart: at most this many restarts, then the run stops.",
    "EvidenceConfig.enabled": "Collect evidence into incidents/N/ before the kill.",
    "EvidenceConfig.log_tail_bytes": "The end of the server log copied into the bundle.",
    "EvidenceConfig.metrics_timeout": "The last /metrics scrape's deadline.",
    "EvidenceConfig.gpu_timeout": "The GPU snapshot's deadline.",
    "EvidenceConfig.py_spy": "Dump every target process's Python stacks with py-spy.",
    "EvidenceConfig.py_spy_native": "Also native frames (py-spy --native, slower).",
    "EvidenceConfig.py_spy_timeout": "One py-spy dump's deadline.",
    "EvidenceConfig.budget": "The whole bundle's deadline: the kill never waits longer.",
    "response.gpu_poll_interval": "How often the GPUs are read while waiting for their release.",
    "exporter.enabled": "Serve the harness's Prometheus metrics while the run goes.",
    "view.refresh": "How often the live view on a terminal is redrawn.",
    "view.plain_interval": "How often a status line is printed when stdout is not a terminal.",
    "thresholds.<metric>.threshold": "One expression (\"< 90s\") or a list of them; the metric is a name "
                                     "such as ttft_p99, tpot_p50, error_rate.",
    "pushgateway.job": "The Pushgateway job the night is pushed under.",
    "pushgateway.timeout": "The whole push's deadline.",
    "prove.broken_build": "Take the broken MTBF from this build's nights (with history).",
    "prove.max_hangs": "Truncation: the test ends undecided at this many hangs.",
}
for _cls in ("StdlibCorpus", "DirectoryCorpus", "FilesCorpus"):
    DESCRIPTIONS[f"{_cls}.max_bytes"] = DESCRIPTIONS["corpus_max_bytes"]
for _field in ("think_time_s", "ignore_eos", "replay", "time_scale", "max_tokens_override", "limit"):
    for _cls in ("SyntheticAgenticConfig", "ReplayJsonlConfig", "MooncakeTraceConfig"):
        DESCRIPTIONS.setdefault(f"{_cls}.{_field}", DESCRIPTIONS[_field])
for _cls in ("PpTailStallConfig", "SequentialConfig", "StageCpuStallConfig", "LearnedThreshold", "LogSignatureConfig",
             "ServerGoneConfig", "ErrorRateCriterion", "NoSuccessCriterion", "WorkEvidenceCriterion"):
    DESCRIPTIONS[f"{_cls}.enabled"] = _ENABLED
DESCRIPTIONS["enabled"] = _ENABLED  # any section's on/off switch without words of its own

UNITS: dict[str, str] = {
    "load.rate": "requests per second",
    "oracle.tie_margin": "nats",
    "oracle.max_share": "fraction of server time",
    "target.simulator.sim.time_scale": "x real time",
}
EXAMPLES: dict[str, Any] = {
    "target.launched.command": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"],
    "target.attached.base_url": "http://127.0.0.1:8000",
    "target.launched.base_url": "http://127.0.0.1:8000",
    "target.simulator.model": "meta-llama/Llama-3.1-8B-Instruct",
    "target.launched.model": "meta-llama/Llama-3.1-8B-Instruct",
    "target.attached.model": "meta-llama/Llama-3.1-8B-Instruct",
    "target.launched.api_key_env": "VLLM_API_KEY",
    "target.launched.env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
    "probes.gpu.dcgm.url": "http://127.0.0.1:9400/metrics",
    "pushgateway.url": "http://127.0.0.1:9091",
    "pushgateway.grouping": {"box": "rtx3090-01"},
    "thresholds.<metric>.threshold": "< 90s",
    "prove.truncate": "auto",
    "build": "vllm-0.11.2-pp8",
    "workload.synthetic_agentic.min_context_tokens": 150000,
    "workload.synthetic_agentic.start_context_tokens": {"dist": "uniform", "low": 192000, "high": 200000},
    "detector.pp_tail_stall.stage_cpu.low_pct": 30.0,
    "detector.stage_cpu_stall.asleep_pct": 30.0,
    "prove.broken_mtbf": "20m",
    "prove.target_mtbf": "200m",
    "prove.ratio": 10,
    "prove.broken_build": "vllm-0.11.2",
    "prove.history": "runs",
}


def _prove(name: str) -> dict[str, Any]:
    """A prove: section that names each quantity once (its validator's rule)."""
    broken = {"broken_build": "vllm-0.11.2", "history": "runs"} if name in ("broken_build", "history") \
        else {"broken_mtbf": "20m"}
    return {"prove": {**broken, **({} if name == "ratio" else {"target_mtbf": "200m"})}}


for _kind in ("simulator", "attached"):
    EXAMPLES[f"target.{_kind}.api_key_env"] = "VLLM_API_KEY"
# a YAML key prefix -> what else its examples need to pass the cross-field rules
COMPANIONS: dict[str, Any | Callable[[str], Any]] = {
    "load.rate": {"load": {"mode": "open"}},
    "load.mode": {"load": {"rate": 2.0}},
    "prove.": _prove,
}
