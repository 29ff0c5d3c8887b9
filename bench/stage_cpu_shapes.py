"""What each pipeline shape looks like through the stage-CPU source, and how soon
the detector calls the stuck ones (docs/detection.md, "Stage CPU").

    python bench/stage_cpu_shapes.py [--stages 3] [--repeat 3] [--seconds 12]

For each shape of ``soak.rigs.stage_cpu`` (healthy, deadlock, stopped, idle,
cold): the per-stage readings (percent of one core, CPU time plus run-queue
wait) and each worker's state letter every 0.5 s, and the time from the rig's
own timestamp of the shape's start to the detector's decision. The client is
synthetic: one request in flight whose tokens move while the pipeline works
(not in the stuck shapes, nor while stage 0 works alone in the cold one; none in
flight in the idle shape).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from soak.clock import SystemClock
from soak.detect.config import DetectorConfig
from soak.detect.detector import Detector
from soak.probes.build import stage_cpu_source
from soak.proc.cpu import read_cpu
from soak.records import Topology
from soak.samples import ClientSample


async def one(shape: str, *, stages: int, after: float, seconds: float, show: bool) -> float | None:
    proc = subprocess.Popen([sys.executable, "-m", "soak.rigs.stage_cpu", "--stages", str(stages), "--shape", shape,
                             "--after", str(after), "--duration", str(seconds + after + 5)],
                            stdout=subprocess.PIPE, text=True)
    info = json.loads(proc.stdout.readline())
    try:
        clock = SystemClock()
        source = stage_cpu_source(clock=clock, root_pid=lambda: info["root"], proc=None,
                                  topology=Topology.pipeline(stages))
        await source.open()
        detector = Detector(DetectorConfig(), topology=Topology.pipeline(stages))
        tokens = 0
        end = time.time() + after + seconds
        while time.time() < end:
            now = clock.now()
            sample = await source.read()
            started = time.time() >= info["fault_at"]
            # tokens move while the pipeline works: not in a stuck shape, nor during the cold stretch
            if not started or shape in ("healthy", "idle") or (shape == "cold" and time.time() > info["fault_at"] + 4):
                tokens += 1
            detector.observe(sample)
            detector.observe(ClientSample(ts=now, in_flight=0 if shape == "idle" and started else 1,
                                          bytes_total=tokens, tokens_total=tokens, requests_done=0, streaming=1))
            assessment = detector.assess(now)
            if show:
                cpu = read_cpu(int(p) for p in info["workers"].values())
                states = "".join(cpu[int(p)].state if int(p) in cpu else "?" for p in info["workers"].values())
                print(f"{shape:9s} t={time.time() - info['fault_at']:+5.1f}s "
                      f"{' '.join(f'{g.util_pct:5.1f}' for g in sample.gpus) or '-':24s} {states} "
                      f"{assessment.state.value}")
            if assessment.new_incidents:
                decision = assessment.new_incidents[0]
                took = time.time() - info["fault_at"]
                print(f"{shape:9s} DECIDED {decision.rule} {took:.1f}s after the shape began: {decision.reasons[0]}")
                return took
            await asyncio.sleep(0.5)
        return None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0)
    args = parser.parse_args()
    for shape in ("healthy", "deadlock", "stopped", "idle", "cold"):
        times = [asyncio.run(one(shape, stages=args.stages, after=3.0, seconds=args.seconds, show=(i == 0)))
                 for i in range(args.repeat)]
        got = [t for t in times if t is not None]
        print(f"== {shape}: {len(got)}/{len(times)} decided"
              + (f", median {statistics.median(got):.1f}s max {max(got):.1f}s" if got else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
