"""``soak sim``: the simulated PP vLLM server in the foreground.

Flags map one to one onto ``SimConfig`` (``--config FILE`` reads a YAML/JSON
sim section first; flags given override it). Faults: ``--fault
KIND[:key=value,...]``, repeatable, e.g. ``--fault pp_deadlock:at=5m`` or
``--fault crash:after_requests=20``.

Simulator-only endpoints:
  GET  /sim/state   JSON: gpus (index, util_pct, mem_used_mib, mem_total_mib,
                    power_w, pids), processes {api_server, engine_core, workers},
                    fault {kind, active, onset_at (unix s)}, time_scale
  GET  /sim/dcgm    the simulated GPUs in dcgm-exporter's text format
  POST /sim/fault   {"kind": "pp_deadlock", ...}: inject a fault now
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

_FLAGS: list[tuple[str, str, type, str]] = [
    # (flag, SimConfig field, type, help)
    ("--model", "model", str, "served model name (default deepseek-v4-flash)"),
    ("--pipeline-parallel-size", "pp_size", int, "pipeline stages = simulated GPUs = workers (default 8)"),
    ("--time-scale", "time_scale", float, "simulated seconds per wall second (default 1)"),
    ("--seed", "seed", int, "seed for spec-decode acceptance and random faults (default 0)"),
    ("--block-size", "block_size", int, "KV block size in tokens (default 256)"),
    ("--max-num-seqs", "max_num_seqs", int, "max running requests (default 12)"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget of one step (default 256)"),
    ("--max-model-len", "max_model_len", int, "context limit in tokens (default 327680)"),
    ("--kv-cache-blocks", "kv_cache_blocks", int, "KV capacity in blocks (default 12288)"),
    ("--num-speculative-tokens", "num_speculative_tokens", int, "draft tokens per decode step; 0 turns spec decode off (default 5)"),
    ("--spec-acceptance", "spec_acceptance", float, "probability a draft token is accepted (default 0.7)"),
    ("--stage-time", "stage_time", str, "fixed time of one stage per step, simulated seconds (default 0.002)"),
    ("--stage-time-per-token", "stage_time_per_token", float, "extra stage time per scheduled token (default 6e-6)"),
    ("--startup-delay", "startup_delay", str, "loading time: connections are refused this long after start (default 0)"),
    ("--default-output-tokens", "default_output_tokens", int, "EOS after this many tokens when max_tokens is absent (default 256)"),
    ("--near-tie-rate", "near_tie_rate", float, "share of positions whose top two tokens nearly tie (default 0.02)"),
    ("--near-tie-flip", "near_tie_flip", float,
     "chance the batch's composition flips a near tie to the runner-up; 0: batch-invariant (default 0.3)"),
    ("--decode-util-pct", "decode_util_pct", float, "GPU utilization during decode steps (default 60)"),
    ("--gpu-mem-total-mib", "gpu_mem_total_mib", int, "simulated GPU memory (default 24576)"),
    ("--gpu-mem-used-mib", "gpu_mem_used_mib", int, "memory a live worker holds (default 22800)"),
    ("--hostname", "hostname", str, "Hostname label of /sim/dcgm (default sim-host)"),
    ("--show-hidden-metrics-for-version", "show_hidden_metrics_for_version", str, "0.10 shows the hidden deprecated metrics"),
    ("--log-stats-interval", "log_stats_interval", str, "period of the 'Avg prompt throughput' line; 0 turns it off (default 10s)"),
    ("--worker-backend", "worker_backend", str, "cpu (python -m soak.sim.worker) or cuda (python -m soak.rigs.cuda_worker)"),
    ("--worker-own-session", "worker_own_session", int, "this worker rank calls setsid (kill-path tests)"),
    ("--vllm-version", "vllm_version", str, "behave as this vLLM version: 0.11.2 (default) or 0.33.0"),
    ("--engine-death-shutdown", "engine_death_shutdown", str,
     "the API server exits this long after EngineDeadError (default 5s) unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"),
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument("--config", type=Path, help="YAML or JSON file with a sim section (SimConfig fields)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--no-processes", action="store_true", help="do not start the engine-core/worker process tree")
    for flag, field, type_, help_text in _FLAGS:
        parser.add_argument(flag, dest=f"sim_{field}", metavar=field.upper(), type=type_, default=None, help=help_text)
    parser.add_argument(
        "--enable-prompt-tokens-details",
        dest="sim_enable_prompt_tokens_details",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="usage.prompt_tokens_details.cached_tokens (default on)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[:k=v,...]",
        help="pp_deadlock | all_idle_deadlock | crash | slow | metrics_stall | corrupt_output | corrupt_then_deadlock | "
        "lying_usage | other_model | replay | collapse, with trigger at=, after_requests=, mtbf= (simulated s), pp_deadlock also wall_mtbf= (wall s of load) "
        "and the fault's own settings; repeatable",
    )


def parse_fault_flag(text: str) -> dict[str, Any]:
    from soak.errors import ArgumentError

    kind, _, rest = text.partition(":")
    fault: dict[str, Any] = {"kind": kind.strip()}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ArgumentError(f"--fault {text}: expected key=value, got {item!r}")
        try:
            fault[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fault[key.strip()] = value.strip()
    return fault


def _next_launch(config: Path) -> int:
    """How many times this config has started a simulator before (a run's restarts
    start it again): counted in a file beside it; 0 where that cannot be kept."""
    counter = config.with_name(config.name + ".launches")
    try:
        before = int(counter.read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        before = 0
    try:
        counter.write_text(f"{before + 1}\n", encoding="ascii")
    except OSError:
        return 0
    return before


def build_config(args: argparse.Namespace):
    """SimConfig from --config and the flags; bad input raises ConfigError / ArgumentError."""
    from pydantic import ValidationError

    from soak.configbase import read_yaml, validation_error_to_config_error
    from soak.errors import ArgumentError, ConfigError
    from soak.sim.config import SimConfig

    data: dict[str, Any] = {}
    source = "<flags>"
    if args.config is not None:
        loaded = read_yaml(args.config)
        if isinstance(loaded, dict) and "target" in loaded and isinstance(loaded["target"], dict):
            loaded = loaded["target"].get("sim", {})
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError("expected a mapping of simulator settings", path=args.config)
        data.update(loaded)
        source = str(args.config)
        walls = [f for f in data.get("faults") or [] if isinstance(f, dict) and f.get("wall_mtbf") is not None]
        # only a wall_mtbf draw depends on it: no counter file otherwise; 0 is "not given"
        # (the harness writes the whole SimConfig, launch: 0 included, before every start)
        if walls and not data.get("launch"):
            data["launch"] = _next_launch(Path(args.config))
    for key, value in vars(args).items():
        if key.startswith("sim_") and value is not None:
            data[key[4:]] = value
    keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "")
    if keep_alive.strip() not in ("", "0") and "keep_alive_on_engine_death" not in data:
        data["keep_alive_on_engine_death"] = True  # as vLLM reads it: any value but 0
    ringbuffer = os.environ.get("VLLM_RINGBUFFER_WARNING_INTERVAL", "").strip()
    if ringbuffer and data.get("ringbuffer_warning_interval") is None:
        try:  # as vLLM reads it; fractions allowed here, for time-scaled tests
            data["ringbuffer_warning_interval"] = float(ringbuffer)
        except ValueError:
            raise ArgumentError(f"VLLM_RINGBUFFER_WARNING_INTERVAL={ringbuffer!r} is not a number of seconds") from None
    if args.fault:
        data["faults"] = list(data.get("faults", [])) + [parse_fault_flag(f) for f in args.fault]
    for i, fault in enumerate(data.get("faults", []) or []):
        from soak.sim.config import FAULT_KINDS

        if isinstance(fault, dict) and fault.get("kind") not in FAULT_KINDS:
            raise ConfigError(f"unknown kind {fault.get('kind')!r}, known: {', '.join(FAULT_KINDS)}", path=source, field=f"faults[{i}].kind")
    try:
        return SimConfig.model_validate(data)
    except ValidationError as exc:
        err = validation_error_to_config_error(exc, source)
        if args.config is None:
            raise ArgumentError(err.one_line()) from exc
        raise err from exc


def main(args: argparse.Namespace) -> int:
    config = build_config(args)
    from soak.sim.serve import serve

    return serve(
        config,
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        spawn_processes=not args.no_processes,
        argv=sys.argv[1:],
    )
