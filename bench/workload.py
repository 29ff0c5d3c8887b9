"""Workload build costs for agentic-pp8: plan, one 230K-token body, 64 live sessions.

    .venv/bin/python bench/workload.py

Prints the time and peak memory to build a 66-minute plan (corpus read,
calibration with the simulator's tokenizer, plan), the median time to build a
turn's body near 230K tokens (beside json.dumps of the same request, the naive
way), and the process's memory with 64 live sessions at their largest turn.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from soak.config import load_run_config  # noqa: E402
from soak.workload import SimCounter, build_workload  # noqa: E402


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def main() -> None:
    path = REPO / "workloads" / "agentic-pp8.yaml"
    config = load_run_config(path)
    rss_start = rss_mb()

    async def build_and_plan():
        t0 = time.perf_counter()
        workload = build_workload(config.workload, base_dir=path.parent, seed=config.seed, model="deepseek-v4-flash")
        t1 = time.perf_counter()
        await workload.calibrate(SimCounter())
        t2 = time.perf_counter()
        plan = workload.plan(duration_s=config.duration, concurrency=config.load.concurrency, block_size=256)
        t3 = time.perf_counter()
        return workload, plan, (t1 - t0, t2 - t1, t3 - t2)

    tracemalloc.start()
    await build_and_plan()  # traced once for the peak (tracing slows it), then timed untraced
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    workload, plan, (corpus_s, calibrate_s, plan_s) = await build_and_plan()
    print(f"66-minute agentic-pp8 plan: {corpus_s + calibrate_s + plan_s:.2f} s total (corpus {corpus_s:.2f} s, "
          f"calibration {calibrate_s:.2f} s, plan {plan_s:.3f} s), peak traced memory {peak / 2**20:.1f} MiB")
    print(f"  plan: {plan.requests} requests, {plan.sessions} sessions, hit ratio {plan.hit_ratio:.4f}, "
          f"prompt tokens {plan.prompt_tokens_min}-{plan.prompt_tokens_max}")

    # one body near 230K tokens: time next_turn() on the last turns of many sessions
    ours, naive, sizes = [], [], []
    for index in range(40):
        session = workload.new_session(index)
        turns = session.turns_planned
        for number in range(turns):
            start = time.perf_counter()
            turn = session.next_turn()
            elapsed = time.perf_counter() - start
            if number >= turns - 3:  # the largest turns: 220K-230K tokens
                ours.append(elapsed)
                sizes.append(turn.planned_prompt_tokens)
                request = json.loads(turn.body)
                start = time.perf_counter()
                json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode()
                naive.append(time.perf_counter() - start)
    ours_ms, naive_ms = statistics.median(ours) * 1e3, statistics.median(naive) * 1e3
    print(f"body of one turn at {min(sizes):,}-{max(sizes):,} tokens: median {ours_ms:.3f} ms over {len(ours)} bodies "
          f"(json.dumps of the same request: {naive_ms:.3f} ms, {naive_ms / ours_ms:.1f}x slower)")

    # 64 live sessions, each at its largest turn
    del ours, naive
    gc.collect()
    before = rss_mb()
    live = []
    for index in range(64):
        session = workload.new_session(100 + index)
        last = None
        while (turn := session.next_turn()) is not None:
            last = turn
        live.append((session, last))
    gc.collect()
    after = rss_mb()
    print(f"64 live sessions at their largest turn (each holding its last body): process RSS {after:.0f} MiB "
          f"(harness before the workload {rss_start:.0f} MiB, with workload and no sessions {before:.0f} MiB, "
          f"sessions add {after - before:.0f} MiB)")
    live_sessions_only = [s for s, _ in live]
    del live
    gc.collect()
    print(f"  same 64 sessions without their last bodies: process RSS {rss_mb():.0f} MiB ({len(live_sessions_only)} sessions)")


if __name__ == "__main__":
    asyncio.run(main())
