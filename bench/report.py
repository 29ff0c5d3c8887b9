"""Bench: render the report of a 66-minute run directory (budget: under 10 s).

    .venv/bin/python bench/report.py [--keep DIR]

Writes a realistic 66-minute run with tests/fixtures/runs/generate.py (GPU every
0.5 s for 8 GPUs with NVML sub-samples, /metrics every ~1.5 s, client progress
every 1 s, a request every ~3 s), then times ``soak report``'s work
(``write_report``: read, summarize, plot, write) in this process, and prints the
time, its parts and the ratio to the 10 s budget.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 10.0


def _generator():
    spec = importlib.util.spec_from_file_location("run_generator", REPO / "tests" / "fixtures" / "runs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write the run here and keep it (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.keep or Path(tmp) / "bench-66m"
        t0 = time.perf_counter()
        _generator().bench_run(run_dir)
        gen_s = time.perf_counter() - t0
        sizes = {p.name: p.stat().st_size for p in run_dir.iterdir() if p.is_file()}
        lines = {name: sum(1 for _ in (run_dir / name).open("rb")) for name in ("samples.jsonl", "requests.jsonl")}

        import matplotlib  # noqa: F401  (imports are not the report's work; count them apart)
        import scipy.stats  # noqa: F401

        from soak.report import render
        from soak.report.rundir import load_run

        t0 = time.perf_counter()
        run = load_run(run_dir)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = render.build(run)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        render.render_html(model)
        html_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        written = render.write_report(run_dir)
        total_s = time.perf_counter() - t0

        duration_min = (run.summary.duration_s or 0) / 60
        print(f"run: {duration_min:.0f} min of load, samples.jsonl {lines['samples.jsonl']} lines "
              f"({sizes['samples.jsonl'] / 1e6:.1f} MB), requests.jsonl {lines['requests.jsonl']} lines, "
              f"{run.gpu_util.shape[1]} GPUs x {run.gpu_util.shape[0]} GPU samples (generated in {gen_s:.1f} s)")
        print(f"parts: read {load_s:.2f} s, summarize+plots {build_s:.2f} s, html {html_s:.2f} s")
        print(f"soak report (write_report, end to end): {total_s:.2f} s; budget {BUDGET_S:.0f} s; "
              f"ratio {total_s / BUDGET_S:.2f} of budget")
        print(f"report.html {written.html.stat().st_size / 1e3:.0f} kB, junit.xml {written.junit.stat().st_size} B")
        return 0 if total_s < BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
