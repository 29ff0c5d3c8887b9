"""Long soak: what a day of `soak run` costs, and whether it stays small, fast and sharp.

    .venv/bin/python bench/long_soak.py                                   # 24 sim-hours, 64 and 256 streams
    .venv/bin/python bench/long_soak.py --sim-hours 2 --time-scale 120 --streams 16 --quiet-variant 16
    .venv/bin/python bench/long_soak.py --tree before=/tmp/bb8ef36 --tree after=.   # side by side, one sitting

Each run is ``soak run`` against the simulator (a launched target, restarted by
the harness) at ``--time-scale``: ``--sim-hours`` simulated hours take
sim_hours x 3600 / time_scale wall seconds. The agentic workload runs at each
``--streams`` N (closed loop, N sessions). The bench injects a pp_deadlock
(``POST /sim/fault``) at the wall time of each ``--deadlocks-at`` simulated
hour; the config says ``on_hang: restart``, so the harness detects, captures,
kills, restarts and goes on. Per run it prints:

- harness CPU-seconds (the ``soak run`` process alone, not the simulator) per
  wall hour of load and per million streamed tokens;
- harness RSS at simulated hour 1 and at the end of the load (and the peak);
- run-directory bytes per simulated hour, by part. Probes sample on the wall
  clock and requests on the simulator's, so the line "per real hour" adds the
  wall-rate parts per wall hour to the sim-rate parts per simulated hour: what
  an hour of a real-time soak would write;
- ``soak report``'s wall time and peak RSS on the run directory;
- detected_at - onset for each injected deadlock;
- the end: seconds from load_stopped to the harness's exit (the report);
- with ``--quiet-variant N``: the same run at N streams with the live view and
  the exporter off, beside the run with them on (the exporter scraped every 5 s
  by the bench, as Prometheus would): what the two cost.

``--report-hours H`` (default 24) also writes a synthetic run of H hours at the
real probe rates (8 GPUs every 0.5 s with NVML sub-samples, /metrics and
/health every 1.5 s, client progress every 1 s, a request every 3 s: a
12-session agentic soak) through each tree's own run store, and times
``soak report`` on it: the 24-hour report goal (<= 15 s, <= 1 GB) at real rates.

Every ``--tree NAME=PATH`` (default: this checkout) is run with the same
settings, all runs in parallel unless ``--serial``: give the machine enough
cores (each run is a harness and a simulator).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# response.evidence.samples_window: the wall seconds of samples the evidence ring keeps
RING_WALL_S = 300.0

CONFIG = """\
name: long-soak-{label}
duration: {duration_s:.1f}s
seed: 1
target:
  kind: simulator
  sim:
    time_scale: {time_scale}
    seed: 3
    max_num_seqs: {streams}
    max_num_batched_tokens: {batched}
    kv_cache_blocks: {kv_blocks}
workload:
  kind: synthetic_agentic
  min_context_tokens: {ctx_min}
  max_context_tokens: {ctx_max}
  start_context_tokens: {{dist: uniform, low: {ctx_min}, high: {ctx_start_high}}}
  shared_prefix_tokens: {shared}
  tool_result_tokens: {{dist: lognormal, median: 1500, sigma: 0.6, min: 64, max: 8000}}
  output_tokens: {{dist: lognormal, median: 96, sigma: 0.5, min: 8, max: 1024}}
  think_time_s: {{dist: lognormal, median: {think}, sigma: 0.5, min: 0, max: 20}}
load:
  mode: closed
  concurrency: {streams}
response:
  on_hang: restart
  max_restarts: {restarts}
exporter:
  enabled: {exporter}
  port: {port}
view:
  mode: "{view}"
  plain_interval: 30s
"""

# --thresholds: what a nightly with SLOs judges at its end (whole-run and windowed
# figures; the windowed ones read every request and server sample of the run).
THRESHOLDS = """\
thresholds:
  ttft_p99: "< 10m"
  error_rate: "< 50%"
  output_tokens_per_s: "> 0"
  e2e_p90: {threshold: "< 10m", window: 60s}
  prefix_hit_ratio: {threshold: "> 0", window: 60s}
"""


@dataclass
class Run:
    tree: str
    root: Path
    streams: int
    quiet: bool
    dir: Path
    label: str = ""
    rc: int | None = None
    wall_s: float = 0.0
    cpu: list[tuple[float, float, int]] = field(default_factory=list)  # (t since start, cpu s, rss bytes)
    load_start: float | None = None  # monotonic, from the bench's view (run_started event)
    onsets: list[float] = field(default_factory=list)  # unix wall, the simulator's own onset_at
    injected: list[float] = field(default_factory=list)
    scrapes: int = 0
    problems: list[str] = field(default_factory=list)
    exit_mono: float | None = None
    exit_wall: float | None = None
    start_mono: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _events(run_dir: Path) -> list[dict]:
    out = []
    try:
        with open(run_dir / "events.jsonl", "rb") as fh:
            for raw in fh:
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def drive(run: Run, args, port: int | None) -> None:
    """Start ``soak run``, sample its CPU and RSS, inject the deadlocks, scrape the exporter."""
    import psutil

    wall_s = args.sim_hours * 3600 / args.time_scale
    ctx_min, ctx_max = (int(x) for x in args.context.split(":"))
    cfg = run.dir.with_suffix(".yaml")
    cfg.write_text(CONFIG.format(
        label=run.label, duration_s=wall_s, time_scale=args.time_scale, streams=run.streams,
        batched=args.batched_tokens, kv_blocks=max(12288, run.streams * (ctx_max // 256 + 8) * 2),
        ctx_min=ctx_min, ctx_max=ctx_max, ctx_start_high=min(ctx_max, ctx_min + max(1, (ctx_max - ctx_min) // 10)),
        shared=min(12000, ctx_min // 2), think=args.think, restarts=len(args.deadlocks_at) + 2,
        exporter="false" if run.quiet else "true", port=port or 0, view="off" if run.quiet else "plain")
        + (THRESHOLDS if args.thresholds else ""))
    log = open(run.dir.with_suffix(".log"), "w")
    run.start_mono = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "soak", "run", str(cfg), "--out", str(run.dir)],
                            cwd=run.root, env=env_for(run.root), stdout=log, stderr=subprocess.STDOUT)
    ps = psutil.Process(proc.pid)
    due = [h * 3600 / args.time_scale for h in args.deadlocks_at]
    next_scrape = 0.0
    while proc.poll() is None:
        now = time.monotonic()
        try:
            with ps.oneshot():
                t = ps.cpu_times()
                run.cpu.append((now - run.start_mono, t.user + t.system, ps.memory_info().rss))
        except psutil.Error:
            pass
        if run.load_start is None:
            if any(e.get("type") == "load_started" for e in _events(run.dir)):
                run.load_start = now
        elif due and now - run.load_start >= due[0]:
            due.pop(0)
            try:
                sim_port = int((run.dir / "sim.port").read_text().strip())
                described = _post(f"http://127.0.0.1:{sim_port}/sim/fault", {"kind": "pp_deadlock"})
                run.injected.append(time.time())
                onset = described.get("onset_at")
                if onset is None:
                    onset = (_get_json(f"http://127.0.0.1:{sim_port}/sim/state").get("fault") or {}).get("onset_at")
                if onset is not None:
                    run.onsets.append(float(onset))
                else:
                    run.problems.append(f"no onset reported for the deadlock at {now - run.load_start:.0f} s")
            except (OSError, ValueError) as exc:
                run.problems.append(f"inject at {now - run.load_start:.0f} s failed: {exc}")
        if port and not run.quiet and now >= next_scrape:
            next_scrape = now + 5.0
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    resp.read()
                run.scrapes += 1
            except OSError:
                pass
        time.sleep(0.5)
    run.exit_mono = time.monotonic()
    run.exit_wall = time.time()
    run.rc = proc.returncode
    run.wall_s = run.exit_mono - run.start_mono
    log.close()


def report_cost(root: Path, run_dir: Path) -> tuple[float, float, int]:
    """``soak report DIR`` in a child: (wall s, CPU s, peak RSS bytes)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "soak", "report", str(run_dir)], cwd=root, env=env_for(root),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()[-1:] if proc.stderr else []
        raise RuntimeError(f"soak report {run_dir} exited {proc.returncode}: {err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def dir_parts(run_dir: Path) -> dict[str, int]:
    parts: dict[str, int] = {}
    for p in run_dir.rglob("*"):
        if not p.is_file():
            continue
        rel = p.relative_to(run_dir)
        name = rel.parts[0]
        if name.startswith("samples"):
            key = "samples"
        elif name in ("requests.jsonl", "events.jsonl", "server.log", "incidents"):
            key = name
        elif name in ("report.html", "junit.xml", "summary.json"):
            key = "report"
        else:
            key = "other"
        parts[key] = parts.get(key, 0) + p.stat().st_size
    return parts


def analyse(run: Run, args) -> dict:
    out: dict = {"tree": run.tree, "streams": run.streams, "quiet": run.quiet, "rc": run.rc, "problems": run.problems}
    events = _events(run.dir)
    try:
        summary = json.loads((run.dir / "summary.json").read_text())
    except (OSError, ValueError):
        run.problems.append("no summary.json")
        return out
    ts = {e["type"]: e["ts"] for e in events if isinstance(e.get("ts"), (int, float))}
    first = {}
    for e in events:
        first.setdefault(e.get("type"), e.get("ts"))
    load_s = (ts.get("load_stopped", 0) - first.get("load_started", 0)) if "load_started" in first else 0
    # The bench's samples against the run's own clock: load_started is at run.load_start (to 0.5 s).
    ls = (run.load_start - run.start_mono) if run.load_start else 0.0
    le = ls + load_s
    during = [c for c in run.cpu if ls <= c[0] <= le]
    if len(during) >= 2:
        cpu_load = during[-1][1] - during[0][1]
        hours = (during[-1][0] - during[0][0]) / 3600
    else:
        cpu_load, hours = float("nan"), float("nan")
    tokens = summary.get("tokens", {}).get("generated") or 0
    hour1 = ls + 3600 / args.time_scale
    rss_h1 = next((c[2] for c in run.cpu if c[0] >= hour1), None)
    rss_at = {f"h{h:g}": next((round(c[2] / 1e6, 1) for c in run.cpu if c[0] >= ls + h * 3600 / args.time_scale), None)
              for h in (1, 2, 6, 12, 18) if h < args.sim_hours}
    # One sample is one allocator moment (the end sample once caught the report
    # starting): each RSS figure is the median of the wall minute from its mark.
    def rss_median(start: float, stop: float) -> float | None:
        window = [c[2] for c in run.cpu if start <= c[0] < stop]
        return statistics.median(window) if window else None
    rss_h1 = rss_median(hour1, hour1 + 60) or rss_h1
    rss_end = rss_median(le - 61, le - 1) or (during[-1][2] if during else None)
    # A real-time day passes the evidence ring's 300 wall seconds in its first
    # five minutes; at time scale 24 hour 1 comes first, so growth is also shown
    # from the later of the two.
    ring_full = max(hour1, ls + RING_WALL_S)
    rss_ring_full = rss_median(ring_full, ring_full + 60)
    out.update(
        wall_load_s=load_s, tokens=tokens, requests=summary.get("requests", {}),
        cpu_load_s=cpu_load, cpu_per_wall_h=cpu_load / hours if hours else None,
        cpu_per_mtok=cpu_load / (tokens / 1e6) if tokens else None,
        rss_h1=rss_h1, rss_end=rss_end, rss_ring_full=rss_ring_full, rss_peak=max((c[2] for c in run.cpu), default=None),
        rss_trajectory_mb=rss_at,
        # the end of the run: load_stopped (the run's own clock) to the harness's exit
        end_s=(run.exit_wall - ts["load_stopped"]) if run.exit_wall and "load_stopped" in ts else None,
        # the harness's CPU from load_stopped to its last sample (the report child not included)
        end_cpu_s=(run.cpu[-1][1] - during[-1][1]) if during and run.cpu else None,
        scrapes=run.scrapes, restarts=summary.get("restarts"),
    )
    parts = dir_parts(run.dir)
    out["bytes"] = parts
    sim_hours = load_s * args.time_scale / 3600
    wall_hours = load_s / 3600
    total = sum(v for k, v in parts.items() if k != "report")
    out["bytes_per_sim_h"] = total / sim_hours if sim_hours else None
    wall_rate = parts.get("samples", 0) + parts.get("events.jsonl", 0)
    sim_rate = parts.get("requests.jsonl", 0) + parts.get("server.log", 0)
    out["bytes_per_real_h"] = (wall_rate / wall_hours if wall_hours else 0) + (sim_rate / sim_hours if sim_hours else 0)
    incidents = summary.get("incidents") or []
    lat = []
    for onset in run.onsets:
        after = [i for i in incidents if isinstance(i.get("detected_at"), (int, float)) and i["detected_at"] >= onset]
        if after:
            lat.append(round(min(i["detected_at"] for i in after) - onset, 2))
        else:
            run.problems.append(f"deadlock at onset {onset:.0f} never detected")
    out["detect_s"] = lat
    out["incidents"] = len(incidents)
    try:
        wall, cpu, rss = report_cost(run.root, run.dir)
        out["report"] = {"wall_s": wall, "cpu_s": cpu, "rss": rss}
    except RuntimeError as exc:
        run.problems.append(str(exc))
    return out


SYNTH = r"""
import json, math, random, sys, time
from pathlib import Path
from soak.clock import ManualClock
from soak.samples import ClientSample, GpuReading, GpuSample, GpuSource, HealthSample, RequestRecord, ServerSample
from soak.store.store import RunStore
out, hours = Path(sys.argv[1]), float(sys.argv[2])
rng = random.Random(24)
T0 = 1764690000.0
end = T0 + hours * 3600
store = RunStore(out, clock=ManualClock(T0))
store.write_config({"name": "synthetic-%gh" % hours, "duration": hours * 3600})
store.event("run_started", ts=T0, run_id="synthetic", target="simulator", duration_s=hours * 3600, warmup_s=0.0)
store.event("load_started", ts=T0 + 1)
nxt = {"gpu": T0 + 1, "server": T0 + 1, "client": T0 + 1, "request": T0 + 8}
gen = prompt = q = h = 0.0
tokens = done = n = 0
ctx = [rng.uniform(190000, 205000) for _ in range(12)]
while True:
    kind = min(nxt, key=nxt.get)
    t = nxt[kind]
    if t >= end:
        break
    if kind == "gpu":
        gpus = tuple(GpuReading(index=i, util_pct=round(max(0, min(100, rng.gauss(88 if i < 7 else 80, 8))), 1),
                                mem_used_mib=21800.0 + i, mem_total_mib=24576.0, power_w=round(300 + rng.random() * 20, 1),
                                pids=(4100 + i,), util_samples=tuple(round(rng.uniform(70, 100), 1) for _ in range(3)),
                                uuid="GPU-%08d" % i) for i in range(8))
        store.on_sample(GpuSample(ts=t, source=GpuSource.NVML, gpus=gpus))
        nxt[kind] = t + 0.5
    elif kind == "server":
        gen += 95 * 1.5; prompt += 1100 * 1.5; q += 2200 * 1.5; h += 2100 * 1.5
        store.on_sample(ServerSample(ts=t, ok=True, latency_s=0.004, values={
            "generation_tokens": round(gen), "prompt_tokens": round(prompt), "prefix_cache_queries": round(q),
            "prefix_cache_hits": round(h), "num_requests_running": 12.0, "num_requests_waiting": 0.0,
            "kv_cache_usage_perc": 0.7, "time_to_first_token_seconds_sum": 1000.0, "time_to_first_token_seconds_count": 300.0,
            "e2e_request_latency_seconds_sum": 9000.0, "e2e_request_latency_seconds_count": 300.0,
            "spec_decode_num_drafts": gen / 3, "spec_decode_num_draft_tokens": gen, "spec_decode_num_accepted_tokens": gen * 0.7}))
        store.on_sample(HealthSample(ts=t + 0.01, ok=True, status=200, latency_s=0.002))
        nxt[kind] = t + 1.5
    elif kind == "client":
        tokens += 95; done += rng.random() < 0.33
        store.on_sample(ClientSample(ts=t, in_flight=12, bytes_total=tokens * 30, tokens_total=tokens,
                                     requests_done=done, max_silence_s=round(rng.uniform(0, 0.3), 2), streaming=10))
        nxt[kind] = t + 1.0
    else:
        n += 1; s = n % 12
        ctx[s] = ctx[s] + rng.uniform(600, 2500)
        if ctx[s] > 230000: ctx[s] = rng.uniform(190000, 193000)
        p = int(ctx[s]); o = rng.randint(40, 300); ttft = rng.lognormvariate(math.log(4.0), 0.5)
        store.on_request(RequestRecord(request_id="r%07d" % n, session="s%02d-%d" % (s, n // 200), turn=n // 12,
            started_at=t - ttft - 0.1 * o, ended_at=t, outcome="ok", prompt_tokens=p, planned_prompt_tokens=p,
            cached_tokens=int(p * 0.94), output_tokens=o, ttft_s=round(ttft, 4), itl_mean_s=0.1, itl_p50_s=0.095,
            itl_p99_s=0.22, itl_max_s=0.3, tpot_s=0.1, e2e_s=round(ttft + 0.1 * o, 3), bytes_sent=p * 4,
            bytes_received=o * 30, http_status=200, finish_reason="length"))
        nxt[kind] = t + 3.0 * rng.uniform(0.5, 1.5)
store.event("load_stopped", ts=end)
store.event("run_ended", ts=end + 1, verdict="pass", reason="duration", exit_code=0)
store.close()
"""


def synthetic_report(root: Path, out: Path, hours: float) -> dict:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", SYNTH, str(out), str(hours)], cwd=root, env=env_for(root), check=True)
    gen_s = time.monotonic() - started
    parts = dir_parts(out)
    wall, cpu, rss = report_cost(root, out)
    return {"hours": hours, "bytes": parts, "gen_s": gen_s, "report_wall_s": wall, "report_cpu_s": cpu, "report_rss": rss}


def short_run_end(root: Path, work: Path, label: str) -> float | None:
    """A 5-second run: seconds from load_stopped to the harness's exit (the end of a short run)."""
    cfg = work / f"short-{label}.yaml"
    cfg.write_text(CONFIG.format(
        label=f"short-{label}", duration_s=5, time_scale=20, streams=4, batched=2048, kv_blocks=12288,
        ctx_min=4000, ctx_max=8000, ctx_start_high=4400, shared=1000, think=0.05, restarts=0,
        exporter="false", port=0, view="off"))
    run_dir = work / f"short-{label}"
    subprocess.run([sys.executable, "-m", "soak", "run", str(cfg), "--out", str(run_dir)], cwd=root, env=env_for(root),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    exited = time.time()
    stopped = [e["ts"] for e in _events(run_dir) if e.get("type") == "load_stopped"]
    return exited - stopped[-1] if stopped else None


def _mb(v) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="a source tree to run (repeat; default: this checkout as 'this')")
    parser.add_argument("--streams", default="64,256", help="concurrent streams, comma-separated (default 64,256)")
    parser.add_argument("--sim-hours", type=float, default=24.0)
    parser.add_argument("--time-scale", type=float, default=24.0, help="simulated seconds per wall second (default 24)")
    parser.add_argument("--deadlocks-at", default="1,12,23", help="simulated hours of the injected pp_deadlocks")
    parser.add_argument("--quiet-variant", default="", help="stream counts also run with the live view and exporter off")
    parser.add_argument("--context", default="190000:230000", help="agentic context tokens MIN:MAX")
    parser.add_argument("--think", type=float, default=1.5, help="median think time (wall s)")
    parser.add_argument("--batched-tokens", type=int, default=2048, help="the simulator's --max-num-batched-tokens")
    parser.add_argument("--report-hours", type=float, default=24.0, help="synthetic real-rate run to report on (0: none)")
    parser.add_argument("--short-run", action="store_true", help="also time the end of a 5-second run per tree")
    parser.add_argument("--thresholds", action="store_true",
                        help="the runs judge thresholds at their end (two of them windowed), as a nightly with SLOs")
    parser.add_argument("--serial", action="store_true", help="one run at a time (default: all at once)")
    parser.add_argument("--keep", type=Path, help="keep run directories here")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    args.deadlocks_at = [float(h) for h in args.deadlocks_at.split(",") if h.strip()]
    args.deadlocks_at = [h for h in args.deadlocks_at if h < args.sim_hours]
    streams = [int(s) for s in args.streams.split(",") if s.strip()]
    quiet = [int(s) for s in args.quiet_variant.split(",") if s.strip()]
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [("this", ROOT)]

    work = args.keep or Path(tempfile.mkdtemp(prefix="soak-long-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    for name, root in trees:
        for n in streams:
            runs.append(Run(name, root, n, False, work / f"{name}-{n}", label=f"{name}-{n}"))
        for n in quiet:
            runs.append(Run(name, root, n, True, work / f"{name}-{n}-quiet", label=f"{name}-{n}-quiet"))
    print(f"long soak: {args.sim_hours:g} sim-hours at time scale {args.time_scale:g} "
          f"({args.sim_hours * 3600 / args.time_scale:.0f} wall s a run), deadlocks at sim hours "
          f"{', '.join(f'{h:g}' for h in args.deadlocks_at)}, {len(runs)} runs "
          f"({'serial' if args.serial else 'in parallel'}), work dir {work}", flush=True)

    synth: dict = {}
    threads = []
    if args.report_hours > 0:
        def one_synthetic(name: str, root: Path) -> None:
            synth[name] = synthetic_report(root, work / f"{name}-synthetic-{args.report_hours:g}h", args.report_hours)

        for name, root in trees:  # beside the live runs: it is one more core's work
            th = threading.Thread(target=one_synthetic, args=(name, root))
            th.start()
            if args.serial:
                th.join()
            threads.append(th)
    for run in runs:
        port = None if run.quiet else free_port()
        th = threading.Thread(target=drive, args=(run, args, port))
        th.start()
        if args.serial:
            th.join()
        threads.append(th)
    for th in threads:
        th.join()
    results = [analyse(run, args) for run in runs]

    shorts = {}
    if args.short_run:
        for name, root in trees:
            shorts[name] = [short_run_end(root, work, f"{name}-{k}") for k in range(3)]

    print()
    head = (f"{'tree':<8} {'N':>4} {'view+exp':>8} {'rc':>3} {'load s':>7} {'Mtok':>6} {'CPU s':>7} {'CPU/wall-h':>10} "
            f"{'CPU/Mtok':>8} {'RSS h1 MB':>9} {'RSS end':>8} {'growth':>7} {'MB/sim-h':>8} {'MB/real-h':>9} "
            f"{'report s':>8} {'rep MB':>7} {'end s':>6} {'end CPU':>7}  detected_at-onset s")
    print(head)
    for r in results:
        if "tokens" not in r:
            print(f"{r['tree']:<8} {r['streams']:>4} {'off' if r['quiet'] else 'on':>8} {r['rc']!s:>3}  no result: {r['problems']}")
            continue
        growth = (r["rss_end"] / r["rss_h1"] - 1) * 100 if r.get("rss_h1") and r.get("rss_end") else float("nan")
        rep = r.get("report") or {}
        print(f"{r['tree']:<8} {r['streams']:>4} {'off' if r['quiet'] else 'on':>8} {r['rc']!s:>3} {r['wall_load_s']:>7.0f} "
              f"{r['tokens'] / 1e6:>6.2f} {r['cpu_load_s']:>7.1f} {r['cpu_per_wall_h'] or float('nan'):>10.0f} "
              f"{r['cpu_per_mtok'] or float('nan'):>8.1f} {_mb(r['rss_h1']):>9} {_mb(r['rss_end']):>8} {growth:>+6.1f}% "
              f"{_mb(r['bytes_per_sim_h']):>8} {_mb(r['bytes_per_real_h']):>9} {rep.get('wall_s', float('nan')):>8.2f} "
              f"{_mb(rep.get('rss')):>7} {r['end_s'] or float('nan'):>6.2f} {r.get('end_cpu_s') or float('nan'):>7.2f}  {r['detect_s']}")
    print()
    for r in results:
        if "bytes" in r:
            parts = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(r["bytes"].items()))
            print(f"{r['tree']}-{r['streams']}{'-quiet' if r['quiet'] else ''}: RSS MB by sim hour {r['rss_trajectory_mb']}, "
                  f"end {_mb(r['rss_end'])}, peak {_mb(r['rss_peak'])}; requests {r['requests']}, "
                  f"incidents {r['incidents']}, restarts {r['restarts']}, exporter scrapes {r['scrapes']}; {parts}")
        for p in r["problems"]:
            print(f"  PROBLEM: {p}")
    for name, s in synth.items():
        total = sum(v for k, v in s["bytes"].items() if k != "report")
        print(f"{name}: synthetic {s['hours']:g} h at real probe rates: run dir {total / 1e6:.1f} MB "
              f"({total / 1e6 / s['hours']:.2f} MB/h; samples {s['bytes'].get('samples', 0) / 1e6:.1f} MB, "
              f"requests {s['bytes'].get('requests.jsonl', 0) / 1e6:.1f} MB); soak report {s['report_wall_s']:.2f} s wall, "
              f"{s['report_cpu_s']:.2f} CPU s, peak RSS {s['report_rss'] / 1e6:.0f} MB")
    for name, ends in shorts.items():
        ok = [e for e in ends if e is not None]
        print(f"{name}: 5-second run, load_stopped -> exit: {', '.join(f'{e:.2f}' for e in ok)} s"
              + (f" (median {statistics.median(ok):.2f} s)" if ok else ""))
    # Against the goals, per run.
    print()
    for r in results:
        if "tokens" not in r:
            continue
        goals = []
        if r.get("rss_h1") and r.get("rss_end"):
            goals.append(f"RSS h1->end {(r['rss_end'] / r['rss_h1'] - 1) * 100:+.1f}% (goal <= +5%)")
        if r.get("rss_ring_full") and r.get("rss_end"):
            goals.append(f"RSS ring-full->end {(r['rss_end'] / r['rss_ring_full'] - 1) * 100:+.1f}%")
        if len(r["detect_s"]) >= 2 and r["detect_s"][0] > 0:
            goals.append(f"detection last/first {r['detect_s'][-1] / r['detect_s'][0]:.2f} (goal within 0.9-1.1, or both small)")
        print(f"{r['tree']}-{r['streams']}{'-quiet' if r['quiet'] else ''}: " + "; ".join(goals))
    for name, s in synth.items():
        print(f"{name}: {s['hours']:g} h report {s['report_wall_s']:.1f} s / {s['report_rss'] / 1e9:.2f} GB (goal <= 15 s, <= 1 GB); "
              f"run dir {sum(v for k, v in s['bytes'].items() if k != 'report') / 1e6 / s['hours']:.1f} MB/h (goal <= 25)")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "synthetic": synth, "short": shorts}, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
