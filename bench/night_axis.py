"""report.html on a real night's time axis, without a night: a recorded short run
(bench/morning_after.py's, at time scale) spliced onto a 66-minute wall-clock
axis at its own sampling cadence, then rendered by the pure report.

    .venv/bin/python bench/night_axis.py RECORDED_RUN OUT_DIR [--minutes 66] [--hangs-at 25.1,50]

Why: the simulator runs a night at ``time_scale`` (66 minutes in 165 s), but the
probes sample on the wall clock, so morning_after's report shows a 2.8-minute
axis. Stretching its timestamps 24x would fake the density (a GPU reading every
12 s, a 3-second stall drawn as 77 s). Splicing keeps what a real night has:
readings every 0.5 s and 1 s, each hang exactly as recorded (the onset, the
detection, the kill, the restart, seconds long), placed ``--hangs-at`` minutes
into a night whose healthy load is the recorded healthy stretch repeated.

The pieces: the recorded start, copies of its healthy stretch, each incident's
episode (from 10 s before its onset to 10 s after its ``restart_done``), and the
recorded end. Every timestamp of a piece (samples, requests, events, incident
files; ``mono`` too) moves by the piece's offset; a counter carries on from the
piece before (a restart's reset inside an episode stays a reset to zero).
summary.json is judged again from the spliced directory (``write_report``).
Writes OUT_DIR/run (the run directory, report.html inside) and prints the axis.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from soak.jsonl import read_jsonl as _read_jsonl  # noqa: E402

TIME_KEYS = frozenset({"ts", "started_at", "ended_at", "onset_at", "detected_at", "mono", "started_mono",
                       "ended_mono", "covered_from", "covered_to", "last_progress_at"})
GAUGES = frozenset({"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"})
CLIENT_COUNTERS = ("tokens_total", "bytes_total", "requests_done")
MARGIN_S = 10.0


def read_jsonl(path: Path) -> list[dict]:
    return [v for _, v in _read_jsonl(path) if isinstance(v, dict)]


def shift(obj: Any, delta: float) -> Any:
    """``obj`` with every time field moved by ``delta`` seconds."""
    if isinstance(obj, dict):
        return {k: (v + delta if k in TIME_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
                    else shift(v, delta)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shift(v, delta) for v in obj]
    return obj


class Counters:
    """Counters that carry on across pieces: each piece's first reading continues
    from the last one written, grown at the piece's own first rate over the time
    between them (a step of no growth at every seam would read as a dip); a drop
    inside a piece (a restart) starts from zero."""

    def __init__(self) -> None:
        self.last_out: dict[str, tuple[float, float]] = {}  # key -> (time, value) last written
        self.last_in: dict[str, float] = {}
        self.offset: dict[str, float] = {}
        self.rate: dict[str, float] = {}

    def new_piece(self, rows: list[dict]) -> None:
        """``rows``: the piece's samples, for the rate of its first step."""
        self.last_in.clear()
        self.offset.clear()
        firsts: dict[str, list[tuple[float, float]]] = {}
        for s in rows:
            for key, v in _counter_values(s):
                if len(firsts.setdefault(key, [])) < 2:
                    firsts[key].append((s["ts"], v))
        self.rate = {k: max(0.0, (b[1] - a[1]) / (b[0] - a[0])) for k, (a, b) in
                     ((k, vs) for k, vs in firsts.items() if len(vs) == 2) if b[0] > a[0]}

    def value(self, key: str, t: float, v: float) -> float:
        if key not in self.offset:
            if key in self.last_out:
                then, out = self.last_out[key]
                self.offset[key] = out + self.rate.get(key, 0.0) * max(0.0, t - then) - v
            else:
                self.offset[key] = 0.0
        elif v < self.last_in[key]:
            self.offset[key] = 0.0  # the server restarted: its counter counts from zero
        self.last_in[key] = v
        self.last_out[key] = (t, v + self.offset[key])
        return v + self.offset[key]


def _counter_values(s: dict) -> list[tuple[str, float]]:
    if s.get("kind") == "server" and isinstance(s.get("values"), dict):
        return [("server." + k, v) for k, v in s["values"].items() if k not in GAUGES and isinstance(v, (int, float))]
    if s.get("kind") == "client":
        return [("client." + k, s[k]) for k in CLIENT_COUNTERS if isinstance(s.get(k), (int, float))]
    return []


def _sample(s: dict, delta: float, counters: Counters) -> dict:
    s = shift(s, delta)
    t = s["ts"]
    if s.get("kind") == "server" and isinstance(s.get("values"), dict):
        s["values"] = {k: counters.value("server." + k, t, v) if k not in GAUGES and isinstance(v, (int, float)) else v
                       for k, v in s["values"].items()}
    elif s.get("kind") == "client":
        for k in CLIENT_COUNTERS:
            if isinstance(s.get(k), (int, float)):
                s[k] = counters.value("client." + k, t, s[k])
    return s


class SpliceError(ValueError):
    """A recording this script cannot splice: one line, said about events.jsonl."""


# The shortest healthy stretch worth repeating: the loops below fill a night with copies of it.
MIN_HEALTHY_S = 1.0


def pieces(events: list[dict], *, minutes: float, hangs_at: list[float]) -> tuple[list[tuple[float, float, float]], float]:
    """(source from, source to, destination from) of each piece, and the new end of load."""
    start = next((e["ts"] for e in events if e.get("type") == "run_started"), None)
    stopped = next((e["ts"] for e in events if e.get("type") == "load_stopped"), None)
    if start is None or stopped is None:
        raise SpliceError("no run_started or no load_stopped event: not a whole recorded run")
    onsets = {e["number"]: e["onset_at"] for e in events if e.get("type") == "incident" and e.get("onset_at")}
    if not onsets:
        raise SpliceError("no incident with an onset_at: there is no hang to place on the night")
    restarted = {e["number"]: e["ts"] for e in events if e.get("type") == "restart_done"}
    episodes = [(onsets[n] - MARGIN_S, restarted[n] + MARGIN_S, onsets[n]) for n in sorted(onsets) if n in restarted]
    healthy = (start + MARGIN_S, min(onsets.values()) - MARGIN_S)
    if healthy[1] - healthy[0] < MIN_HEALTHY_S:
        raise SpliceError(f"the first onset is {min(onsets.values()) - start:.1f} s after run_started; the night is "
                          f"filled with the healthy load before it, which needs {2 * MARGIN_S + MIN_HEALTHY_S:.0f} s")
    end = start + minutes * 60.0
    out = [(start - 60.0, healthy[1], start - 60.0)]  # the recorded start, set-up events included
    at = healthy[1]
    for (lo, hi, onset), minute in zip(episodes, hangs_at):
        due = start + minute * 60.0 - (onset - lo)
        while at < due:
            length = min(healthy[1] - healthy[0], due - at)
            out.append((healthy[0], healthy[0] + length, at))
            at += length
        out.append((lo, hi, at))
        at += hi - lo
    tail = stopped - MARGIN_S
    while at < end - MARGIN_S:
        length = min(healthy[1] - healthy[0], end - MARGIN_S - at)
        out.append((healthy[0], healthy[0] + length, at))
        at += length
    out.append((tail, tail + 3600.0, at))  # the recorded end: load_stopped, run_ended and after
    return out, at + MARGIN_S


def splice(src: Path, dst: Path, *, minutes: float, hangs_at: list[float]) -> float:
    events = list(read_jsonl(src / "events.jsonl"))
    plan, end = pieces(events, minutes=minutes, hangs_at=hangs_at)
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for name in ("config.yaml", "plan.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    samples = list(read_jsonl(src / "samples.jsonl"))
    requests = list(read_jsonl(src / "requests.jsonl"))
    counters = Counters()
    out_samples, out_requests, out_events = [], [], []
    for index, (lo, hi, to) in enumerate(plan):
        delta = to - lo
        rows = [s for s in samples if lo <= s.get("ts", -1) < hi]
        counters.new_piece(rows)
        out_samples += [_sample(s, delta, counters) for s in rows]
        for r in requests:
            if lo <= (r.get("ended_at") or -1) < hi:
                r = shift(r, delta)
                r["request_id"] = f"{r.get('request_id')}-{index}"
                out_requests.append(r)
        for e in events:
            if lo <= e.get("ts", -1) < hi:
                e = shift(e, delta)
                if e.get("type") == "run_started":
                    e["duration_s"] = end - e["ts"]
                out_events.append(e)
    for path in sorted((src / "incidents").glob("*/incident.json")):
        number = json.loads(path.read_text()).get("number")
        onset = next(e["onset_at"] for e in events if e.get("type") == "incident" and e.get("number") == number)
        delta = next(to - lo for lo, hi, to in plan if lo <= onset < hi)  # its episode, or the recorded end
        (dst / "incidents" / path.parent.name).mkdir(parents=True)
        for f in path.parent.iterdir():
            if f.suffix == ".json":
                (dst / "incidents" / path.parent.name / f.name).write_text(json.dumps(shift(json.loads(f.read_text()), delta)))
            elif f.suffix == ".jsonl":
                lines = [json.dumps(shift(json.loads(line), delta)) for line in f.read_text().splitlines() if line]
                (dst / "incidents" / path.parent.name / f.name).write_text("\n".join(lines) + "\n")
            else:
                shutil.copy(f, dst / "incidents" / path.parent.name / f.name)
    for name, rows, key in (("samples.jsonl", out_samples, "ts"), ("requests.jsonl", out_requests, "ended_at"),
                            ("events.jsonl", out_events, "ts")):
        rows.sort(key=lambda r: r.get(key) or 0)
        (dst / name).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    config = (dst / "config.yaml").read_text()
    (dst / "config.yaml").write_text("\n".join(f"duration: {minutes * 60:.0f}s" if line.startswith("duration:") else line
                                               for line in config.splitlines()) + "\n")
    return end - next(e["ts"] for e in out_events if e.get("type") == "run_started")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recorded", type=Path, help="a recorded run with incidents and restarts (morning_after's run/)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--minutes", type=float, default=66.0)
    parser.add_argument("--hangs-at", default="25.1,50", help="minutes into the night of each recorded incident's onset")
    args = parser.parse_args()
    from soak.report.render import write_report

    try:
        span = splice(args.recorded, args.out / "run", minutes=args.minutes,
                      hangs_at=[float(x) for x in args.hangs_at.split(",")])
    except SpliceError as exc:
        print(f"night_axis: {args.recorded / 'events.jsonl'}: {exc}", file=sys.stderr)
        return 2
    written = write_report(args.out / "run")
    print(f"axis {span / 60:.1f} min; {written.html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
