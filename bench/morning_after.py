"""The morning after: a simulated night with two hangs and restarts, its report.html
and screenshots of it, as a person would open them at 09:00.

    .venv/bin/python bench/morning_after.py OUT_DIR [--sim-minutes 66] [--time-scale 24]

One ``soak run`` against the simulator at ``--time-scale``: ``--sim-minutes``
simulated minutes take sim_minutes x 60 / time_scale wall seconds (66 minutes at
24x: 165 s), as in bench/long_soak.py (probes sample on the wall clock, the
simulator's requests on its own). Every start of the simulator deadlocks its
pipeline (pp_deadlock, vllm#53402) ``--hang-at`` of the way into the night; its
shm-broadcast and watchdog lines are pushed past the night, so the GPU rule
(pp_tail_stall: upstream busy, the last stage dark) decides, as on a server
whose log says nothing. ``on_hang: restart``: the harness captures, kills,
restarts and goes on, so the night holds two hangs and two restarts. A TTFT
threshold tight enough to breach puts a ✗ in the thresholds table.

Writes to OUT_DIR: ``run/`` (the run directory, report.html inside),
``terminal.txt`` (the run's stdout: its end-of-run block), ``report.png`` (the
whole page), ``incident-1.png`` (the first incident's card alone, its zoom
included) and ``report-top.png`` (the first screen: banner, thresholds). Prints
the verdict line and the paths.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def night_config(*, sim_minutes: float, time_scale: float, hang_at: float) -> dict:
    wall_s = sim_minutes * 60 / time_scale
    return {
        "name": "morning-after",
        "build": "rc-2",
        "duration": f"{wall_s:.0f}s",
        "target": {"kind": "simulator", "sim": {"time_scale": time_scale, "faults": [{
            "kind": "pp_deadlock", "at": f"{sim_minutes * hang_at:.1f}m",
            "ringbuffer_warning_interval": "100h", "watchdog_timeout": "100h", "execute_timeout": "100h"}]}},
        "workload": {"kind": "synthetic_agentic", "min_context_tokens": 2000, "max_context_tokens": 8000,
                     "start_context_tokens": {"dist": "uniform", "low": 2000, "high": 3000},
                     "shared_prefix_tokens": 1000, "tool_result_tokens": {"dist": "uniform", "low": 200, "high": 400},
                     "output_tokens": 24, "think_time_s": 0.2, "tokenizer": {"kind": "estimate"}},
        "load": {"concurrency": 4, "drain": "5s"},
        "exporter": {"enabled": False},
        "view": {"mode": "plain", "plain_interval": "10s"},
        "response": {"on_hang": "restart", "max_restarts": 4,
                     "evidence": {"py_spy": False, "flight_recorder_wait": "0.5s"}},
        "thresholds": {"ttft_p99": {"threshold": ["< 100ms"]}, "error_rate": {"threshold": ["< 1%"]},
                       "tpot_p99": {"threshold": ["< 50ms"]}},
    }


def incident_page(report: Path, out: Path, number: int = 1) -> Path | None:
    """A page holding the report's styles and one incident card: the card's crop."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(report.read_text(encoding="utf-8"), "html.parser")
    cards = soup.select("div.incident")
    if len(cards) < number:
        return None
    style = soup.find("style")
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'>{style}</head><body><main>"
                   f"{cards[number - 1]}</main></body></html>", encoding="utf-8")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the run, the terminal text and the screenshots")
    parser.add_argument("--sim-minutes", type=float, default=66.0)
    parser.add_argument("--time-scale", type=float, default=24.0)
    parser.add_argument("--hang-at", type=float, default=0.38, help="fraction of the night at which each start hangs")
    args = parser.parse_args()
    if args.sim_minutes <= 0 or args.time_scale <= 0 or not 0 < args.hang_at < 1:
        print("morning_after: --sim-minutes and --time-scale must be positive, --hang-at in (0, 1)", file=sys.stderr)
        return 2
    from browser import screenshot

    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / "run"
    if run_dir.exists():
        print(f"morning_after: {run_dir} exists; give an empty folder", file=sys.stderr)
        return 2
    config_path = args.out / "night.yaml"
    config_path.write_text(yaml.safe_dump(night_config(sim_minutes=args.sim_minutes, time_scale=args.time_scale,
                                                       hang_at=args.hang_at), sort_keys=False), encoding="utf-8")
    began = time.monotonic()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "soak", "run", str(config_path), "--out", str(run_dir)],
                          capture_output=True, text=True, env=env, timeout=args.sim_minutes * 60 / args.time_scale + 600)
    (args.out / "terminal.txt").write_text(done.stdout + (f"\n[stderr]\n{done.stderr}" if done.stderr else ""),
                                           encoding="utf-8")
    wall = time.monotonic() - began
    report = run_dir / "report.html"
    if not report.is_file():
        print(f"morning_after: no report.html (exit {done.returncode}); see {args.out / 'terminal.txt'}",
              file=sys.stderr)
        return 1
    shots = [screenshot(report, args.out / "report.png", width=1300, height=9000),
             screenshot(report, args.out / "report-top.png", width=1300, height=900)]
    card = incident_page(report, args.out / "incident-1.html")
    if card is not None:
        shots.append(screenshot(card, args.out / "incident-1.png", width=1300, height=1500))
    last = [line for line in done.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
    print(f"soak run exited {done.returncode} after {wall:.0f} s: {last[0]}")
    for path in [report, args.out / "terminal.txt", *shots]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
