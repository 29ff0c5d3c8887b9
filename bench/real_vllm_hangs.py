"""Real hangs in vLLM's own code: SIGSTOP the last pipeline stage's worker at a
random moment while `soak run` drives it, and measure detected_at minus the stop.

    .venv/bin/python bench/real_vllm_hangs.py CONFIG [--hangs 5] [--out DIR]
        [--min-delay 5] [--max-delay 40] [--seed 1]

CONFIG launches the real server (examples/real-vllm-launch.yaml) with
`response.on_hang: restart` and `max_restarts` >= hangs - 1; the harness
relaunches vLLM after each kill and this script stops the new worker again.
The stop is chosen only once the new server has generated tokens, a uniform
random delay after that. The worker is found by its title (VLLM::Worker_PP<last>)
among the descendants of the `soak run` process this script started, never by
name alone.

Prints one line per hang and the median/max of detected_at - stop, and writes
hangs.json into the run directory. It also checks, after each kill, that no
process of the killed tree is left and that its /dev/shm segments are gone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil


def generation_tokens(base_url: str) -> float | None:
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except Exception:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def find_worker(root: psutil.Process, title: str) -> psutil.Process | None:
    try:
        for proc in root.children(recursive=True):
            try:
                cmd = proc.cmdline()
            except psutil.Error:
                continue
            if cmd and cmd[0].strip() == title:
                return proc
    except psutil.Error:
        return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--hangs", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--duration", default="60m")
    parser.add_argument("--min-delay", type=float, default=5.0)
    parser.add_argument("--max-delay", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--base-url", default="http://127.0.0.1:8124")
    parser.add_argument("--pp", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out or f"runs/real-hangs-{time.strftime('%Y%m%dT%H%M%S')}")
    title = f"VLLM::Worker_PP{args.pp - 1}"
    soak = subprocess.Popen(
        [sys.executable, "-m", "soak", "run", args.config, "--out", str(out), "--duration", args.duration],
        stdout=open(str(out) + ".out", "wb"), stderr=subprocess.STDOUT,
    )
    root = psutil.Process(soak.pid)
    stops: list[dict] = []
    started = time.time()
    try:
        while len(stops) < args.hangs and soak.poll() is None:
            worker = find_worker(root, title)
            if worker is None:
                time.sleep(1.0)
                continue
            before = generation_tokens(args.base_url)
            if before is None:
                time.sleep(1.0)
                continue
            # the new server has to be generating before the stop means anything
            deadline = time.time() + 600
            while time.time() < deadline and soak.poll() is None:
                now_tokens = generation_tokens(args.base_url)
                if now_tokens is not None and now_tokens > before:
                    break
                time.sleep(1.0)
            delay = rng.uniform(args.min_delay, args.max_delay)
            time.sleep(delay)
            try:
                api = worker.parent().parent()  # EngineCore's parent: the API server
                tree = [api, *api.children(recursive=True)]
                tree_pids = [p.pid for p in tree]
                shm_before = _shm_of(tree_pids)
                worker.send_signal(signal.SIGSTOP)
            except psutil.Error as exc:
                print(f"worker vanished before the stop: {exc}", flush=True)
                continue
            stop_at = time.time()
            print(f"hang {len(stops) + 1}: SIGSTOP {title} pid {worker.pid} at {stop_at:.3f} ({delay:.1f}s after generation resumed)", flush=True)
            # wait for the harness to kill it
            while soak.poll() is None and worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.2)
            gone_at = time.time()
            time.sleep(2.0)
            left = [pid for pid in tree_pids if psutil.pid_exists(pid) and _alive(pid)]
            shm_left = [p for p in shm_before if os.path.exists(p)]
            stops.append({"pid": worker.pid, "stop_at": stop_at, "worker_gone_at": gone_at, "tree": tree_pids,
                          "left_after_kill": left, "shm_before": sorted(shm_before), "shm_left": shm_left})
    finally:
        if soak.poll() is None and len(stops) >= args.hangs:
            # let the last response finish, then end the run like an operator would
            time.sleep(20)
            soak.send_signal(signal.SIGINT)
        try:
            soak.wait(timeout=900)
        except subprocess.TimeoutExpired:
            soak.kill()
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    incidents = summary.get("incidents", [])
    rows = []
    for stop, inc in zip(stops, incidents):
        rows.append({**stop, "rule": inc.get("rule"), "kind": inc.get("kind"), "detected_at": inc.get("detected_at"),
                     "detect_s": round(inc["detected_at"] - stop["stop_at"], 2) if inc.get("detected_at") else None,
                     "killed_pids": inc.get("killed_pids")})
    for i, row in enumerate(rows, 1):
        print(f"hang {i}: rule {row['rule']} detected {row['detect_s']}s after the stop; left after kill: "
              f"{row['left_after_kill']}; shm left: {row['shm_left']}")
    delays = [r["detect_s"] for r in rows if r["detect_s"] is not None]
    if delays:
        print(f"{len(delays)} hangs: detected_at - stop median {statistics.median(delays):.1f}s max {max(delays):.1f}s")
    print(f"incidents {len(incidents)}, stops {len(stops)}, wall {time.time() - started:.0f}s, exit {soak.returncode}")
    if out.exists():
        (out / "hangs.json").write_text(json.dumps({"stops": stops, "rows": rows}, indent=1))
    return 0 if delays and len(delays) == len(stops) else 1


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _shm_of(pids: list[int]) -> set[str]:
    from soak.proc.shm import shm_paths_of

    out: set[str] = set()
    for pid in pids:
        out |= shm_paths_of(pid)
    return out


if __name__ == "__main__":
    sys.exit(main())
