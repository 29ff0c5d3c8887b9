"""How fast the detector calls a deadlock, and that it never calls a healthy run one.

    .venv/bin/python bench/detection.py                 # replay part only (about a minute)
    .venv/bin/python bench/detection.py --live          # plus `soak run` against the simulator

Replay part (the simulator's engine under a virtual clock, tests/fixtures/traces/make.py):
  - N pp_deadlocks (default 24) injected at random times into random agentic runs
    (random seed, concurrency, NVML-style 200 ms samples or the simulator's dcgm
    readings): detected_at - onset, where onset is the injection time;
  - healthy runs of at least 66 simulated minutes (cold 230K prefills, a start-up
    compile pause, idle gaps, spec-decode bursts), plus the checked-in healthy
    fixtures: incidents must be zero.
Live part (--live): ``soak run`` with the simulator as target, ``on_hang: restart``,
pp_deadlocks at random times (the simulator's ``mtbf`` trigger, restarted up to N
times): per incident detected_at - onset and GPUs-free - onset, from the run's
summary.json and the simulator's own fault onsets in events.jsonl.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from soak.detect import Detector, DetectorConfig  # noqa: E402
from soak.records import Topology  # noqa: E402
from soak.detect.replay import replay  # noqa: E402
from soak.store.rundir import read_samples  # noqa: E402


def _load_make():
    spec = importlib.util.spec_from_file_location("trace_make", ROOT / "tests" / "fixtures" / "traces" / "make.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["trace_make"] = module
    spec.loader.exec_module(module)
    return module


def _stats(values: list[float]) -> str:
    if not values:
        return "n=0"
    return (f"n={len(values)} median={statistics.median(values):.2f}s "
            f"p90={sorted(values)[int(0.9 * (len(values) - 1))]:.2f}s max={max(values):.2f}s min={min(values):.2f}s")


def replay_deadlocks(make, n: int, rng: random.Random, config: DetectorConfig) -> tuple[list[float], list[str]]:
    latencies, problems = [], []
    for k in range(n):
        fault_at = rng.uniform(40.0, 400.0)
        scenario = make.Scenario(
            f"bench_pp_deadlock_{k}", fault_at + 40.0, sessions=rng.choice([1, 4, 8, 12]),
            seed=1000 + k, fault="pp_deadlock", fault_at=fault_at, nvml_samples=rng.random() < 0.5,
            think_s=(0.5, rng.choice([3.0, 10.0, 30.0])),
        )
        result = replay(make.record(scenario), Detector(config, topology=Topology.pipeline(8)))
        if len(result.decisions) != 1:
            problems.append(f"{scenario.name}: {len(result.decisions)} incidents")
            continue
        d = result.decisions[0]
        onset = make.T0 + fault_at
        if d.rule != "pp_tail_stall":
            problems.append(f"{scenario.name}: rule {d.rule}")
        latencies.append(d.decided_at - onset)
        print(f"  {scenario.name}: sessions={scenario.sessions} nvml={scenario.nvml_samples} "
              f"onset={fault_at:.1f}s rule={d.rule} detected_after={d.decided_at - onset:.2f}s "
              f"onset_estimate_error={d.onset_at - onset:+.2f}s", flush=True)
    return latencies, problems


def healthy_scenarios(make, minutes: float):
    base = [
        dict(sessions=12), dict(sessions=1, turn_growth=(15_000, 25_000), think_s=(0.5, 2.0)),
        dict(sessions=4, startup_pause_s=120.0), dict(sessions=6, idle=((300.0, 420.0), (700.0, 900.0))),
        dict(sessions=8, spec_acceptance=0.95, think_s=(0.0, 20.0), nvml_samples=True),
        dict(sessions=2, think_s=(20.0, 90.0)),
    ]
    total, k = 0.0, 0
    while total < minutes * 60:
        shape = base[k % len(base)]
        duration = 1200.0
        yield make.Scenario(f"bench_healthy_{k}", duration, seed=2000 + k, **shape)
        total += duration
        k += 1


def replay_healthy(make, minutes: float, config: DetectorConfig) -> tuple[float, int, list[str]]:
    simulated, incidents, lines = 0.0, 0, []
    for scenario in healthy_scenarios(make, minutes):
        result = replay(make.record(scenario), Detector(config, topology=Topology.pipeline(8)))
        simulated += result.duration_s
        incidents += len(result.decisions)
        lines.append(f"  {scenario.name}: {result.duration_s / 60:.1f} simulated min, {len(result.decisions)} incidents "
                     + "".join(f" [{d.rule}: {d.reasons[0]}]" for d in result.decisions))
        print(lines[-1], flush=True)
    for path in sorted((ROOT / "tests" / "fixtures" / "traces").glob("healthy_*.jsonl.gz")):
        result = replay(read_samples(path), Detector(config, topology=Topology.pipeline(8)))
        simulated += result.duration_s
        incidents += len(result.decisions)
        print(f"  {path.name}: {result.duration_s / 60:.1f} simulated min, {len(result.decisions)} incidents", flush=True)
    return simulated, incidents, lines


LIVE_CONFIG = """\
name: bench-detection-{k}
duration: {duration}s
seed: {k}
target:
  kind: simulator
  # This bench times the GPU rule (pp_tail_stall). At time_scale x the harness's 5-s
  # shm-broadcast interval is 5/x wall s, so the log rule would decide first: leave
  # vLLM's 60 s.
  ringbuffer_warning_interval: null
  sim:
    time_scale: {time_scale}
    seed: {seed}
    faults:
      - kind: pp_deadlock
        at: {at}s
workload:
  kind: synthetic_agentic
  min_context_tokens: 190000
  max_context_tokens: 230000
  start_context_tokens: {{dist: uniform, low: 190000, high: 193000}}
  shared_prefix_tokens: 12000
  tool_result_tokens: {{dist: lognormal, median: 1500, sigma: 0.6, min: 64, max: 8000}}
  output_tokens: {{dist: lognormal, median: 64, sigma: 0.5, min: 8, max: 512}}
  think_time_s: {{dist: lognormal, median: 0.5, sigma: 0.5, min: 0, max: 5}}
load:
  mode: closed
  concurrency: 4
response:
  on_hang: restart
  max_restarts: {restarts}
exporter:
  port: 0
"""


def _poll_onsets(run_dir: Path, proc, onsets: set, deadline: float) -> None:
    """Watch the simulator's /sim/state for each fault onset (wall seconds) while the run lasts."""
    import json
    import urllib.request

    port_file = run_dir / "sim.port"
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            port = int(port_file.read_text().strip())
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/state", timeout=1) as resp:
                fault = json.loads(resp.read()).get("fault") or {}
            if fault.get("onset_at"):
                onsets.add(round(float(fault["onset_at"]), 6))
        except (OSError, ValueError):
            pass
        time.sleep(0.1)


def live(args) -> bool:
    """``soak run`` against the simulator, on_hang: restart, deadlocks at random times."""
    import json
    import subprocess
    import tempfile
    import threading

    rng = random.Random(args.seed + 1)
    per_run = 4
    runs = -(-args.live_deadlocks // per_run)
    detect, free, problems = [], [], []
    with tempfile.TemporaryDirectory(prefix="soak-bench-detection-") as tmp:
        for k in range(runs):
            at = rng.uniform(30.0, 200.0)  # simulated seconds after each (re)start
            cfg = Path(tmp) / f"run{k}.yaml"
            cfg.write_text(LIVE_CONFIG.format(k=k, duration=600, time_scale=args.time_scale, seed=100 + k,
                                              at=round(at, 1), restarts=per_run - 1))
            run_dir = Path(tmp) / f"run{k}"
            proc = subprocess.Popen([sys.executable, "-m", "soak", "run", str(cfg), "--out", str(run_dir)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            onsets: set = set()
            watcher = threading.Thread(target=_poll_onsets, args=(run_dir, proc, onsets, time.monotonic() + 900))
            watcher.start()
            try:
                out, _ = proc.communicate(timeout=900)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                watcher.join()
            summary = json.loads((run_dir / "summary.json").read_text())
            truth = sorted(onsets)
            for incident in summary["incidents"]:
                record = json.loads((run_dir / incident["evidence"] / "incident.json").read_text())["record"]
                before = [t for t in truth if t <= incident["detected_at"]]
                if not before:
                    problems.append(f"run {k} incident {incident['number']}: no simulator onset seen")
                    continue
                onset = before[-1]
                detect.append(incident["detected_at"] - onset)
                if record.get("gpus_free_at"):
                    free.append(record["gpus_free_at"] - onset)
                else:
                    problems.append(f"run {k} incident {incident['number']}: GPUs never shown free")
                if incident["rule"] != "pp_tail_stall":
                    problems.append(f"run {k} incident {incident['number']}: rule {incident['rule']}")
                print(f"  live run {k} incident {incident['number']}: fault at {at:.0f} sim-s x{args.time_scale:g}, "
                      f"rule={incident['rule']} detected_after={detect[-1]:.2f}s "
                      f"gpus_free_after={free[-1] if free else float('nan'):.2f}s "
                      f"(onset estimate error {incident['onset_at'] - onset:+.2f}s)", flush=True)
            if len(summary["incidents"]) != per_run:
                problems.append(f"run {k}: {len(summary['incidents'])} incidents, expected {per_run}; "
                                f"last output: {out.strip().splitlines()[-1:]}")
    print()
    print(f"live pp_deadlock detected_at - onset:  {_stats(detect)}")
    print(f"live pp_deadlock GPUs free - onset:    {_stats(free)}  (goal: median <= 10 s, max <= 20 s)")
    for p in problems:
        print(f"PROBLEM: {p}")
    return not problems and bool(free) and statistics.median(free) <= 10 and max(free) <= 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="detection latency and false positives")
    parser.add_argument("--deadlocks", type=int, default=24)
    parser.add_argument("--healthy-minutes", type=float, default=66.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--live", action="store_true", help="also run soak run against the simulator")
    parser.add_argument("--live-deadlocks", type=int, default=20)
    parser.add_argument("--skip-replay", action="store_true", help="only the live part")
    parser.add_argument("--time-scale", type=float, default=8.0)
    args = parser.parse_args(argv)
    make = _load_make()
    config = DetectorConfig()
    rng = random.Random(args.seed)

    if args.skip_replay:
        print(f"live: soak run against the simulator, {args.live_deadlocks} pp_deadlocks", flush=True)
        return 0 if live(args) else 1
    started = time.monotonic()
    print(f"replay: {args.deadlocks} pp_deadlocks at random times", flush=True)
    latencies, problems = replay_deadlocks(make, args.deadlocks, rng, config)
    print(f"replay: healthy runs, at least {args.healthy_minutes:g} simulated minutes", flush=True)
    simulated, incidents, _ = replay_healthy(make, args.healthy_minutes, config)
    wall = time.monotonic() - started

    print()
    print(f"pp_deadlock detected_at - onset (replay): {_stats(latencies)}  (goal: median <= 10 s, max <= 20 s)")
    print(f"healthy replay: {simulated / 60:.1f} simulated minutes, {incidents} incidents (goal: 0)")
    print(f"replay wall time: {wall:.1f}s for {(simulated + sum(latencies)) / 60:.0f}+ simulated minutes")
    ok = not problems and incidents == 0 and latencies and statistics.median(latencies) <= 10 and max(latencies) <= 20
    for p in problems:
        print(f"PROBLEM: {p}")
    if args.live:
        print(f"live: soak run against the simulator, {args.live_deadlocks} pp_deadlocks", flush=True)
        ok = live(args) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
