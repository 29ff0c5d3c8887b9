"""The same 4-build bisect run locally (one segment at a time) and on a real
single-node Slurm with 2 CPUs (two segments at once), in one sitting, wall time
side by side (issue 38's acceptance). Starts and stops its own cluster
(soak.rigs.slurm); needs Debian's slurm-wlm and munge.

    python bench/bisect_cluster.py [--seeds 1 2 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from soak.rigs.slurm import start_cluster  # noqa: E402


def bisect_file(folder: Path, *, seed: int, executor: dict) -> Path:
    def sim(wall_mtbf: str) -> dict:
        return {"kind": "simulator", "sim": {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "wall_mtbf": wall_mtbf}]}}

    doc = {"name": f"bench-{executor['kind']}-{seed}", "base": str(ROOT / "workloads" / "bisect-demo" / "base.yaml"),
           "segment": "5s", "stop_at": 0.95, "seed": seed, "budget": {"segments": 24},
           "rates": {"mtbf_min": "1s", "mtbf_max": "1h", "max_ratio": None}, "executor": executor,
           "builds": [{"label": f"b{i + 1}", "target": sim("10m" if i < 2 else "1s")} for i in range(4)]}
    path = folder / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(path: Path, out: Path, env: dict) -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "soak", "bisect", str(path), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    wall = time.monotonic() - started
    doc = json.loads((out / "bisect.json").read_text())
    return {"wall_s": wall, "exit": done.returncode, "segments": len(doc["segments"]),
            "at_risk_s": sum(s["exposure_s"] for s in doc["segments"]),
            "named": doc["builds"][doc["now"]["posterior"]["best"]]["label"], "state": doc["now"]["state"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="soak-bisect-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows = []
    with start_cluster(Path(tempfile.mkdtemp(prefix="soak-slurm-")) / "c", ctld_port=16917, node_port=16918) as cluster:
        for seed in args.seeds:
            local = run(bisect_file(work, seed=seed, executor={"kind": "local"}), work / f"local-{seed}", env)
            slurm = run(bisect_file(work, seed=seed, executor={"kind": "slurm", "slots": 2, "overhead": "2m",
                                                               "poll": "0.5s"}),
                        work / f"slurm-{seed}", {**cluster.env, **env})
            rows.append((seed, local, slurm))
    print("4 simulated builds (b3 first bad: good wall MTBF 10 min, bad 1 s), segments of 5 s at risk, stop at 0.95")
    print(f"{'seed':>4}  {'local: wall':>11} {'segs':>4} {'named':>5}   {'slurm x2: wall':>14} {'segs':>4} {'named':>5}"
          f"   {'ratio':>5}")
    for seed, local, slurm in rows:
        print(f"{seed:>4}  {local['wall_s']:>10.1f}s {local['segments']:>4} {local['named']:>5}   "
              f"{slurm['wall_s']:>13.1f}s {slurm['segments']:>4} {slurm['named']:>5}   "
              f"{slurm['wall_s'] / local['wall_s']:>5.2f}")
    total_l = sum(r[1]["wall_s"] for r in rows)
    total_s = sum(r[2]["wall_s"] for r in rows)
    print(f"total  local {total_l:.1f} s, slurm (2 at once) {total_s:.1f} s, ratio {total_s / total_l:.2f}")
    print(f"run directories: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
