"""Real hangs inside vLLM's own code, from the fault injector's plan: one soak run,
one fault per server launch, each measured against the injector's own stamp.

    .venv/bin/python bench/real_vllm_hangs.py CONFIG [--per-form 6]
        [--forms skip_send,lag_send,spin_last] [--step 60] [--out DIR] [--duration 120m]

CONFIG launches the real server (bench/real-vllm-hangs.yaml). This script writes
a copy beside the run (``DIR.yaml``) whose target.env carries the plan,
``SOAK_VLLM_FAULTS`` (the forms cycled, ``--per-form`` times each, then ``none``)
and ``SOAK_VLLM_FAULT_STATE`` (``DIR.faults/``), with ``response.on_hang:
restart``: the harness kills each hung tree and relaunches, and the next launch
gets the next fault (scripts/real_vllm_faults.py). Wrap it in
``flock /tmp/soak-real-vllm.lock`` where several people share the machine.

While the run goes, it follows server.log for the injector's stamps
(``SOAK_FAULT_INJECTED``) and, two seconds after each, reads every process of
that launch's tree (state, % of a core over one second, the /dev/shm files it
holds); after the harness's incident it checks what is left of the tree. Once
every fault has had its incident (and the healthy launch after them has served
``--healthy`` seconds) the run is stopped (SIGTERM, as a supervisor: a SIGINT
from a background job is ignored by an inherited SIG_IGN, soak.run.signals).

Per hang it prints: the form, detection delay from the stamp, the rule, the
stage the incident names (the stage left waiting: the sender's next stage for a
send fault, the last stage for spin_last/sigstop), the faulty rank the
diagnosis names (``soak diagnose INCIDENT --json``; 'n/a' if nothing names a
rank), processes and /dev/shm files left; then per form the median and max
delay and each acceptance goal of issue 34. Writes hangs.json into the run dir.
A fault whose launch is not killed within ``--give-up`` seconds of its stamp is
recorded as undetected and its tree SIGKILLed here, so the plan goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from soak.respond.target_tree import same_process_pid as alive

FORMS = {
    "skip_send": "skip_send:rank=0:step={step}",
    "lag_send": "lag_send:rank=0:step={step}",
    "extra_send": "extra_send:rank=0:step={step}",
    "spin_last": "spin_last:step={step}",
    "sigstop": "sigstop:step={step}",
}
SEND_FORMS = ("skip_send", "lag_send", "extra_send")
FAST_RULES = ("stage_cpu_stall", "pp_tail_stall")  # the stage rules: the "right rule"
HANG_RULES = (*FAST_RULES, "generation_frozen", "client_stall", "log_signature")
MARK, PLAN_MARK = "SOAK_FAULT_INJECTED ", "SOAK_FAULT_PLAN "
GOAL_MEDIAN_S, GOAL_MAX_S = 10.0, 20.0


def plan_for(forms: list[str], per_form: int, step: int) -> list[str]:
    """The forms cycled (a, b, c, a, b, c, ...), then one healthy launch."""
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        raise SystemExit(f"unknown form {unknown[0]!r}, known: {', '.join(FORMS)}")
    return [FORMS[f].format(step=step) for _ in range(per_form) for f in forms] + ["none"]


def form_of(entry: str) -> str:
    return entry.split(":", 1)[0]


def plan_config(config: Path, dest: Path, *, plan: list[str], state_dir: Path, max_restarts: int,
                port: int | None = None) -> Path:
    """CONFIG with the plan in target.env, restarts on, the workload path made absolute
    (and the server on ``port``, where given)."""
    obj = yaml.safe_load(config.read_text())
    workload = obj.get("workload")
    if isinstance(workload, str) and not Path(workload).is_absolute():
        obj["workload"] = str((config.parent / workload).resolve())
    target = obj.setdefault("target", {})
    if port is not None:
        command = list(target.get("command") or [])
        if "--port" in command:
            command[command.index("--port") + 1] = str(port)
        target["command"] = command
        target["base_url"] = re.sub(r":\d+$", f":{port}", str(target.get("base_url", "")).rstrip("/"))
    target["env"] = {**(target.get("env") or {}),
                     "SOAK_VLLM_FAULTS": ",".join(plan), "SOAK_VLLM_FAULT_STATE": str(state_dir)}
    target["env"].pop("SOAK_VLLM_FAULT", None)
    obj["response"] = {**(obj.get("response") or {}), "on_hang": "restart", "max_restarts": max_restarts}
    dest.write_text(yaml.safe_dump(obj, sort_keys=False))
    return dest


def read_stamps(text: str, mark: str = MARK) -> list[dict]:
    out = []
    for line in text.splitlines():
        if mark in line:
            try:
                out.append(json.loads(line.split(mark, 1)[1]))
            except ValueError:
                continue
    return out


class Tail:
    """The complete lines a growing file has gained since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset, self._partial = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return []
        self._offset += len(data)
        *whole, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in whole]


def tree_of(engine_pid: int) -> list[psutil.Process]:
    """The launch's tree: the engine's parent (the API server) and everything under it."""
    try:
        engine = psutil.Process(engine_pid)
        api = engine.parent() or engine
        return [api, *api.children(recursive=True)]
    except psutil.Error:
        return []


def snapshot(procs: list[psutil.Process], window_s: float = 1.0) -> list[dict]:
    """Each process's title, state and % of a core over the window."""
    from soak.proc.shm import shm_paths_of

    before = {}
    for p in procs:
        try:
            t = p.cpu_times()
            before[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    time.sleep(window_s)
    rows = []
    for p in procs:
        try:
            t = p.cpu_times()
            cmd = p.cmdline()
            rows.append({"pid": p.pid, "title": (cmd[0].strip() if cmd else p.name())[:60], "state": p.status(),
                         "cpu_pct": round(100 * (t.user + t.system - before.get(p.pid, 0.0)) / window_s),
                         "shm": sorted(shm_paths_of(p.pid))})
        except psutil.Error:
            continue
    return rows


@dataclass
class Watcher:
    """Follows one run directory: stamps, per-stamp process readings, and what the
    incident that ends each launch leaves behind."""

    out: Path
    give_up_s: float = 120.0
    stamps: list[dict] = field(default_factory=list)
    launches: dict[int, dict] = field(default_factory=dict)  # plan index -> the SOAK_FAULT_PLAN line
    readings: dict[int, list[dict]] = field(default_factory=dict)  # stamp pid -> snapshot
    after_kill: dict[int, dict] = field(default_factory=dict)  # stamp pid -> leftovers
    given_up: list[int] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def incidents(self) -> list[dict]:
        return [e for e in list(self.events) if e.get("type") == "incident"]

    def _run(self) -> None:
        pending: list[threading.Thread] = []
        log, events = Tail(self.out / "server.log"), Tail(self.out / "events.jsonl")
        while True:
            for line in events.lines():
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue
            text = "\n".join(log.lines())
            for line in read_stamps(text, PLAN_MARK):
                self.launches.setdefault(line.get("plan"), line)
            for stamp in read_stamps(text):
                self.stamps.append(stamp)
                thread = threading.Thread(target=self._follow, args=(stamp,), daemon=True)
                thread.start()
                pending.append(thread)
            if self.stop.is_set():
                break
            self.stop.wait(0.2)
        for thread in pending:
            thread.join(timeout=10)

    def _follow(self, stamp: dict) -> None:
        procs = tree_of(stamp["engine_pid"])
        pids = [p.pid for p in procs]
        time.sleep(max(0.0, stamp["ts"] + 2.0 - time.time()))
        self.readings[stamp["pid"]] = snapshot(procs)
        shm = sorted({s for row in self.readings[stamp["pid"]] for s in row["shm"]})
        deadline = stamp["ts"] + self.give_up_s
        while not self.stop.is_set():
            if any(stamp["pid"] in (i.get("killed_pids") or []) for i in self.incidents()):
                break
            if time.time() > deadline:
                # undetected: end the launch here so the plan goes on (the harness sees it gone)
                self.given_up.append(stamp["pid"])
                for p in procs:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                break
            time.sleep(0.2)
        time.sleep(2.0)
        self.after_kill[stamp["pid"]] = {"tree": pids, "left": [pid for pid in pids if alive(pid)],
                                         "shm_before": shm, "shm_left": [s for s in shm if os.path.exists(s)]}


def rank_in(obj: Any) -> int | None:
    """The faulty rank a diagnosis names: ``faulty_rank`` (soak diagnose --json),
    ``faulty.rank`` (diagnosis.json), or the one odd rank of a diverged group (the
    flight-recorder match). Never guessed from prose: a blocked rank is not the faulty one."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("faulty_rank"), int):
        return obj["faulty_rank"]
    faulty = obj.get("faulty")
    if isinstance(faulty, dict) and isinstance(faulty.get("rank"), int):
        return faulty["rank"]
    for group in obj.get("groups") or []:
        odd = group.get("odd_ranks") if isinstance(group, dict) else None
        if group.get("kind") not in (None, "none") and odd and len(odd) == 1:
            return int(odd[0])
    return None


def diagnosed_rank(incident_dir: Path) -> tuple[int | None, str]:
    """The faulty rank the incident's diagnosis names (its diagnosis.json, else
    `soak diagnose INCIDENT --json`), and the diagnosis' line."""
    try:
        recorded = json.loads((incident_dir / "diagnosis.json").read_text())
    except (OSError, ValueError):
        recorded = None
    if rank_in(recorded) is not None:
        return rank_in(recorded), str(recorded.get("line", ""))[:200]
    done = subprocess.run([sys.executable, "-m", "soak", "diagnose", str(incident_dir), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    try:
        obj = json.loads(done.stdout)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        return rank_in(obj), str(obj.get("line", ""))[:200]
    text = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return None, text[0][:200] if text else ""


def incident_stage(incident_dir: Path) -> int | None:
    try:
        decision = json.loads((incident_dir / "incident.json").read_text())["decision"]
    except (OSError, ValueError, KeyError):
        return None
    evidence = decision.get("evidence") or {}
    for where in (evidence, evidence.get("signals") or {}):
        for key in ("stage", "tail_stage", "stalled_stage"):
            if isinstance(where.get(key), int):
                return where[key]
    return None


def py_spy_where(incident_dir: Path, pid: int) -> str:
    """The main thread's innermost frame in vLLM (or the innermost at all), from the bundle's dump."""
    try:
        text = (incident_dir / f"py-spy-{pid}.txt").read_text(errors="replace")
    except OSError:
        return "no dump"
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith("Thread ") and "MainThread" in x), None)
    if start is None:
        return "no main thread"
    status = re.search(r"\((\w+)\)", lines[start])
    frames = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        frames.append(line.strip())
    pick = next((f for f in frames if "vllm/" in f), frames[0] if frames else "?")
    return f"{status.group(1) if status else '?'}: {pick}"


def rows_for(out: Path, watcher: Watcher, pp: int = 2) -> list[dict]:
    incidents = watcher.incidents()
    rows = []
    for stamp in watcher.stamps:
        launch = watcher.launches.get(stamp.get("plan")) or {}
        form = stamp["kind"] if not launch else form_of(launch.get("fault", stamp["kind"]))
        inc = next((i for i in incidents if stamp["pid"] in (i.get("killed_pids") or [])), None)
        row: dict[str, Any] = {"plan": stamp.get("plan"), "form": form, "stamp": stamp,
                               "undetected": stamp["pid"] in watcher.given_up}
        faulty = stamp["rank"]
        row["faulty_rank"] = faulty
        row["expected_stage"] = faulty + 1 if form in SEND_FORMS else pp - 1
        readings = watcher.readings.get(stamp["pid"], [])
        if inc is not None:
            bundle = out / inc.get("evidence", f"incidents/{inc.get('number')}")
            rank, line = diagnosed_rank(bundle)
            row.update({"incident": inc.get("number"), "rule": inc.get("rule"), "kind": inc.get("kind"),
                        "detect_s": round(inc["detected_at"] - stamp["ts"], 2),
                        "stage_named": incident_stage(bundle), "diagnosed_rank": rank, "diagnose_line": line,
                        "processes": [{**r, "py_spy": py_spy_where(bundle, r["pid"])} for r in readings]})
        else:
            row["processes"] = readings
        row.update(watcher.after_kill.get(stamp["pid"], {}))
        rows.append(row)
    return rows


def goals(rows: list[dict]) -> dict[str, Any]:
    """Issue 34's acceptance, per form and overall."""
    by_form: dict[str, Any] = {}
    for form in sorted({r["form"] for r in rows}):
        mine = [r for r in rows if r["form"] == form]
        delays = [r["detect_s"] for r in mine if r.get("detect_s") is not None]
        by_form[form] = {
            "hangs": len(mine), "detected": len(delays),
            "median_s": round(statistics.median(delays), 2) if delays else None,
            "max_s": max(delays) if delays else None,
            "fast": bool(delays) and len(delays) == len(mine) and statistics.median(delays) <= GOAL_MEDIAN_S
            and max(delays) <= GOAL_MAX_S,
            "right_rule": all(r.get("rule") in FAST_RULES for r in mine),
            "right_stage": all(r.get("stage_named") == r["expected_stage"] for r in mine),
            "rank_named": all(r.get("diagnosed_rank") == r["faulty_rank"] for r in mine)
            if form in SEND_FORMS else None,
            "nothing_left": all(not r.get("left") and not r.get("shm_left") and "left" in r for r in mine),
        }
    return by_form


def print_rows(rows: list[dict], by_form: dict) -> None:
    for r in rows:
        print(f"hang {r['plan']}: {r['form']:<10} detect {r.get('detect_s', 'never')}s rule {r.get('rule')} "
              f"stage {r.get('stage_named', 'n/a')} (expected {r['expected_stage']}) "
              f"diagnosed rank {r.get('diagnosed_rank') if r.get('diagnosed_rank') is not None else 'n/a'} "
              f"(faulty {r['faulty_rank']}); left {r.get('left')}; shm left {len(r.get('shm_left', []))}"
              f"/{len(r.get('shm_before', []))}", flush=True)
        for p in r.get("processes", []):
            print(f"    {p['title']:<22} {p['state']:<9} {p['cpu_pct']:>4}%  {p.get('py_spy', '')}")
    for form, g in by_form.items():
        print(f"{form}: {g['detected']}/{g['hangs']} detected, median {g['median_s']}s max {g['max_s']}s; "
              f"goals: <=10s median & <=20s max {g['fast']}, right rule {g['right_rule']}, right stage "
              f"{g['right_stage']}, faulty rank named {g['rank_named']}, nothing left {g['nothing_left']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--per-form", type=int, default=6)
    parser.add_argument("--forms", default="skip_send,lag_send,spin_last")
    parser.add_argument("--step", type=int, default=60, help="the step (send or receive) each fault fires at")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--duration", default="120m")
    parser.add_argument("--give-up", type=float, default=120.0)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--healthy", type=float, default=0.0,
                        help="seconds the healthy launch after the last fault serves before the stop")
    parser.add_argument("--port", type=int, default=None, help="the server's port (CONFIG's otherwise)")
    args = parser.parse_args()
    plan = plan_for([f.strip() for f in args.forms.split(",") if f.strip()], args.per_form, args.step)
    out = args.out or Path(f"runs/real-hangs-{time.strftime('%Y%m%dT%H%M%S')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    config = plan_config(args.config, out.with_name(out.name + ".yaml"), plan=plan,
                         state_dir=out.with_name(out.name + ".faults"), max_restarts=len(plan),
                         port=args.port)
    print(f"plan: {','.join(plan)}", flush=True)
    started = time.time()
    soak = subprocess.Popen([sys.executable, "-m", "soak", "run", str(config), "--out", str(out),
                             "--duration", args.duration],
                            stdout=open(str(out) + ".out", "wb"), stderr=subprocess.STDOUT)
    watcher = Watcher(out, give_up_s=args.give_up)
    thread = watcher.start()
    faults = len(plan) - 1
    try:
        while soak.poll() is None:
            done = [s for s in watcher.stamps if s["pid"] in watcher.after_kill]
            relaunched = [e for e in list(watcher.events) if e.get("type") == "restart_done"]
            if len(done) >= faults and (args.healthy <= 0 or len(relaunched) >= faults
                                        and time.time() - relaunched[faults - 1]["ts"] >= args.healthy):
                break
            time.sleep(1.0)
    finally:
        if soak.poll() is None:
            soak.send_signal(signal.SIGTERM)
        try:
            soak.wait(timeout=900)
        except subprocess.TimeoutExpired:
            soak.kill()
        watcher.stop.set()
        thread.join(timeout=30)
    rows = rows_for(out, watcher, pp=args.pp)
    by_form = goals(rows)
    print_rows(rows, by_form)
    late = [e for e in watcher.incidents() if not any(e.get("number") == r.get("incident") for r in rows)]
    print(f"incidents that no fault explains (false alarms): {len(late)}")
    print(f"faults {faults}, stamps {len(watcher.stamps)}, incidents {len(watcher.incidents())}, "
          f"wall {time.time() - started:.0f}s, exit {soak.returncode}")
    if out.exists():
        (out / "hangs.json").write_text(json.dumps({"plan": plan, "rows": rows, "goals": by_form,
                                                    "unexplained_incidents": late}, indent=1))
    return 0 if len(rows) == faults and all(r.get("detect_s") is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
