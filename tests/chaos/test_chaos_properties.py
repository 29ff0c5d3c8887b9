"""The chaos property (issue 32): for every night hypothesis draws from the chaos
server's grammar (tests/chaos/strategies.py), a real ``soak run`` against the
fake keeps the invariants of CONTRACTS.md "Invariants a nightly relies on":

- work: ``pass`` only with positive evidence in the fake's ground truth: the
  night's ``criteria.work_evidence`` (WORK: windows, floor, gap, start-up) met
  by the requests the fake finished with tokens (with tight thresholds, also no
  gap between generated tokens past the bound); a working server passes; a
  fail names its reasons;
- exit codes of CONTRACTS' table, verdict and exit agree, no traceback, errors
  are one line on stderr;
- bounded: the harness's peak RSS and its wall time;
- the kill hits the target or nothing: a decoy and a proxy in front survive, a
  launched fake (daemonized or not) does not outlive the harness;
- traffic only to the target: the redirect sink receives nothing, no redirect
  is followed;
- no secret in any file of the run directory (gz segments inflated), stderr or
  stdout;
- readers are total: every complete .jsonl line is JSON, summary.json is there,
  ``soak report DIR`` and ``soak history DIR`` exit 0, no traceback;
- history.csv has no cell a spreadsheet would evaluate (a /version formula).

CI makes SHARDS x a few runs (one shard per target kind, so xdist spreads them);
``SOAK_CHAOS_EXAMPLES=200`` runs more, ``SOAK_CHAOS_SEED`` draws other nights,
``SOAK_CHAOS_SHRINK=1`` shrinks a failure to a minimal spec (slow: each try is a
run), ``SOAK_CHAOS_COLLECT=FILE`` writes every night's findings to a JSONL file
instead of stopping at the first failing one (for a survey of a branch).
docs/chaos.md says more.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, note, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run"))
from soakrun_helpers import SMALL_WORKLOAD, kill_group_if_born_before, pid_alive, soak_cmd, write_config  # noqa: E402
from ports import free_port  # noqa: E402

from chaos.server import READER_LINE_BOUND, WORK_DESPITE, ChaosServer, phase, spec  # noqa: E402
from chaos.strategies import TARGETS, completion, forwarder_refused, refusable, scenarios, well_behaved  # noqa: E402

SERVER = Path(__file__).with_name("server.py")
SHARDS = len(TARGETS)
EXAMPLES = int(os.environ.get("SOAK_CHAOS_EXAMPLES", "16"))
SEED = int(os.environ.get("SOAK_CHAOS_SEED", "32"))
COLLECT = os.environ.get("SOAK_CHAOS_COLLECT")

DURATION_S = 6.0
DRAIN_S = 2.0
STARTUP_TIMEOUT_S = 5.0
# "tight" thresholds: the bound on time since the last generated token, after a
# start-up grace, that a 5 s night can exercise.
GRACE_S = 1.0
BOUND_S = 1.5
SLACK_S = 1.0  # scrape and assess intervals, a loaded CI box
RSS_CAP_MB = 256  # the harness runs near 90 MB here; the bombs inflate to 256-768 MB, huge lines are 2-64 MB
WALL_MARGIN_S = 25.0  # evidence, stopping the target, summary; a loaded box
EXIT_CODES = {0, 1, 2, 3, 4, 99, 130}

# The work every night owes (criteria.work_evidence in each night's config):
# small enough that a 6 s night judges three full windows, a start-up and the
# gaps between productive requests, loose enough that a working fake (a request
# of at most 16 tokens every few tenths of a second per slot) meets it on a
# loaded box.
WORK = {"window": 2.0, "min_requests": 2, "min_tokens": 4, "max_gap": 1.5, "startup": 2.0}
WORK_CONFIG = {key: f"{value}s" if isinstance(value, float) else value for key, value in WORK.items()}
# Where the harness's load start and a client's end fall against the fake's clock:
# the load starts before the fake sees its first request, a client reads an end
# after the fake wrote it.
TRUTH_SLACK_S = 0.5
CRITERIA = {"no_success": {"window": "2s"}, "work_evidence": WORK_CONFIG}

TIGHT_DETECTOR = {
    "generation_frozen": {"floor": f"{GRACE_S}s", "ceiling": f"{BOUND_S}s", "startup_grace": f"{GRACE_S}s"},
    "client_stall": {"floor": f"{GRACE_S}s", "ceiling": f"{BOUND_S}s"},
}


@dataclass
class Night:
    scenario: dict[str, Any]
    run_dir: Path
    exit_code: int
    stderr: str
    stdout: str
    wall_s: float
    wall_bound_s: float
    maxrss_mb: float
    truth: dict[str, Any] | None
    decoy_alive: bool
    proxy_alive: bool | None
    leftover: bool  # the launched server still ran after the harness exited
    report_rc: int | None
    report_err: str
    history_dir: Path
    history_rc: int | None
    history_err: str


def _start(cmd: list[str], port_file: Path, what: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} did not start")
        time.sleep(0.02)
    return proc, int(port_file.read_text())


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # the fake writes its final ground truth
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


# The harness's own peak RSS: ru_maxrss of a child carries its parent's high-water
# mark across fork and exec (Linux sets it from the old mm at exec), so a harness
# spawned by a grown pytest worker would report the worker's RSS. This small
# wrapper forks the harness and writes the harness's own ru_maxrss (KiB), then
# exits as the harness did.
_MEASURED = ("import os, signal, sys\n"
             "pid = os.fork()\n"
             "if pid == 0:\n"
             "    os.execvp(sys.argv[2], sys.argv[2:])\n"
             "_, status, usage = os.wait4(pid, 0)\n"
             "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
             "code = os.waitstatus_to_exitcode(status)\n"
             "if code < 0:\n"
             "    signal.signal(-code, signal.SIG_DFL)\n"
             "    os.kill(os.getpid(), -code)\n"
             "os._exit(code)\n")


def _wait4(pid: int, timeout_s: float, *, group: bool = False) -> tuple[int, float]:
    """Exit code and peak RSS (MiB) of the child ``pid`` (and the children it reaped);
    ``group``: past the time, the child's whole process group is killed."""
    deadline = time.monotonic() + timeout_s
    while True:
        got, status, usage = os.wait4(pid, os.WNOHANG)
        if got == pid:
            return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024
        if time.monotonic() > deadline:
            if group:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return -9, usage.ru_maxrss / 1024
        time.sleep(0.05)


def _config(scenario: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "chaos",
        "duration": f"{DURATION_S}s",
        "target": target,
        "workload": {**SMALL_WORKLOAD, "tokenizer": {"kind": "estimate"}},
        "load": {"concurrency": 3, "drain": f"{DRAIN_S}s"},
        "probes": {"gpu": {"kind": "none"}, "metrics_interval": "0.5s", "health_interval": "0.5s"},
        "response": {"kill_timeout": "3s", "evidence": {"py_spy": False, "flight_recorder": False, "budget": "3s"}},
        "criteria": CRITERIA,
        "exporter": {"enabled": False},
        "view": {"mode": "plain", "plain_interval": "1s"},
    }
    if scenario["detector"] == "tight":
        config["detector"] = TIGHT_DETECTOR
    if scenario["target"] == "proxy" and not scenario.get("find_root_by_port", True):
        config["response"]["find_root_by_port"] = False  # no kill target: an incident kills nothing
    config.update(scenario.get("config") or {})  # a night that needs other sections whole (tests/chaos/test_prefill_wire.py)
    return config


def run_night(tmp: Path, scenario: dict[str, Any]) -> Night:
    s = scenario["spec"]
    secret = s["secret"]
    secrets = scenario["config_secrets"]
    spec_path, truth_path, fake_log = tmp / "spec.json", tmp / "truth.json", tmp / "fake.log"
    spec_path.write_text(json.dumps(s), encoding="utf-8")
    run_dir = tmp / "run"
    userinfo = f"chaos:{secret}@" if "base_url_userinfo" in secrets else ""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    fake = proxy = None
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             stdin=subprocess.DEVNULL)
    try:
        common = {"startup_timeout": f"{STARTUP_TIMEOUT_S}s", "ready_poll_interval": "0.2s"}
        if scenario["target"] in ("launched", "launched_daemon"):
            port = free_port()
            command = [sys.executable, str(SERVER), "--spec", str(spec_path), "--truth", str(truth_path),
                       "--port", str(port)]
            if scenario["target"] == "launched_daemon":
                # A service wrapper that daemonizes: the command's own process exits at once.
                command = ["setsid", "-f", *command]
            if "launch_flag_api_key" in secrets:
                command += ["--api-key", secret]
            if "launch_flag_db_url" in secrets:
                command += ["--db-url", f"postgres://chaos:{secret}@127.0.0.1:5432/db"]
            launch_env = {}
            if "launch_env_db_url" in secrets:
                launch_env["DB_URL"] = f"postgres://chaos:{secret}@127.0.0.1:5432/db"
            if "launch_env_hf_token" in secrets:
                launch_env["HF_TOKEN"] = secret
            target = {"kind": "launched", "command": command, "env": launch_env, "stop_timeout": "3s",
                      "base_url": f"http://{userinfo}127.0.0.1:{port}", **common}
        else:
            fake, port = _start([sys.executable, str(SERVER), "--spec", str(spec_path), "--truth", str(truth_path),
                                 "--port", "0", "--port-file", str(tmp / "fake.port"), "--log", str(fake_log)],
                                tmp / "fake.port", "the chaos server")
            if scenario["target"] == "proxy":
                proxy, port = _start([sys.executable, str(SERVER), "--forward-to", str(port), "--port-file",
                                      str(tmp / "proxy.port")], tmp / "proxy.port", "the proxy")
            target = {"kind": "attached", "base_url": f"http://{userinfo}127.0.0.1:{port}", "log_path": str(fake_log),
                      **common}
            if scenario["target"] == "attached_pid":
                target["pid"] = fake.pid
        if "api_key_env" in secrets:
            env["CHAOS_API_KEY"] = secret
            target["api_key_env"] = "CHAOS_API_KEY"
        config_path = write_config(tmp / "chaos.yaml", _config(scenario, target))
        wall_bound = STARTUP_TIMEOUT_S + DURATION_S + DRAIN_S + WALL_MARGIN_S
        with open(tmp / "stdout", "w") as out, open(tmp / "stderr", "w") as err:
            started = time.monotonic()
            rss_file = tmp / "harness.maxrss"
            harness = subprocess.Popen([sys.executable, "-c", _MEASURED, str(rss_file),
                                        *soak_cmd("run", str(config_path), "--out", str(run_dir), "--no-html")],
                                       stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                       start_new_session=True)
            exit_code, _ = _wait4(harness.pid, wall_bound + 60, group=True)
            harness.returncode = exit_code
            maxrss = int(rss_file.read_text()) / 1024 if rss_file.exists() else 0.0
            wall = time.monotonic() - started
        proxy_alive = None if proxy is None else proxy.poll() is None
        decoy_alive = decoy.poll() is None and pid_alive(decoy.pid)
        leftover = False
        if scenario["target"] in ("launched", "launched_daemon"):
            deadline = time.monotonic() + 2  # a last SIGKILL may still be landing
            while _launched_fake(truth_path, spec_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            leftover = _launched_fake(truth_path, spec_path) is not None
    finally:
        _stop(fake)
        _stop(proxy)
        decoy.kill()
        decoy.wait()
        _kill_launched(run_dir, truth_path, spec_path)
    report = subprocess.run(soak_cmd("report", str(run_dir)), capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL) if run_dir.is_dir() else None
    # soak history reads the night as a nightly's history job would (history.csv is opened in spreadsheets).
    history = subprocess.run(soak_cmd("history", str(run_dir), "--out", str(tmp / "history")), capture_output=True,
                             text=True, timeout=120, stdin=subprocess.DEVNULL) if run_dir.is_dir() else None
    truth = _read_truth(truth_path)
    return Night(scenario=scenario, run_dir=run_dir, exit_code=exit_code,
                 stderr=(tmp / "stderr").read_text(errors="replace"), stdout=(tmp / "stdout").read_text(errors="replace"),
                 wall_s=wall, wall_bound_s=wall_bound, maxrss_mb=maxrss, truth=truth, decoy_alive=decoy_alive,
                 proxy_alive=proxy_alive, leftover=leftover, report_rc=None if report is None else report.returncode,
                 report_err="" if report is None else report.stderr, history_dir=tmp / "history",
                 history_rc=None if history is None else history.returncode,
                 history_err="" if history is None else history.stderr)


def _launched_roots(run_dir: Path) -> list[tuple[int, float]]:
    """(root PID, when it was seen ready) of every launched server the run's events name."""
    roots = []
    try:
        for line in (run_dir / "events.jsonl").read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("type") == "target_ready" and isinstance(event.get("root_pid"), int):
                roots.append((event["root_pid"], float(event.get("ts", 0))))
    except OSError:
        pass
    return roots


def _launched_fake(truth_path: Path, spec_path: Path) -> int | None:
    """The PID of this night's fake if it still runs, found by what it says about
    itself (the truth file) and checked by its command line (a daemonized one is
    in no tree the harness started)."""
    import psutil

    truth = _read_truth(truth_path)
    pid = truth.get("pid") if truth else None
    if not isinstance(pid, int):
        return None
    try:
        proc = psutil.Process(pid)
        if str(spec_path) in proc.cmdline() and pid_alive(pid):
            return pid
    except psutil.Error:
        pass
    return None


def _kill_launched(run_dir: Path, truth_path: Path, spec_path: Path) -> None:
    """A launched fake the harness left running (a bug the checks report) must not outlive the test."""
    for pid, ts in _launched_roots(run_dir):
        kill_group_if_born_before(pid, ts)
    pid = _launched_fake(truth_path, spec_path)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)


def _read_truth(path: Path) -> dict[str, Any] | None:
    for _ in range(20):  # the fake may be replacing it right now
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except ValueError:
            time.sleep(0.05)
    return None


# -- the invariants ------------------------------------------------------------


def work_violations(truth: dict[str, Any] | None, *, tight: bool, load_s: float = DURATION_S,
                    drain_s: float = DRAIN_S) -> list[str]:
    """Why a ``pass`` is not backed by what the fake really did (empty: it is).

    The fake's own record must meet the night's ``criteria.work_evidence``
    (``WORK``), from its first completion request (the load's start) for
    ``load_s``, requests finishing in the drain included: the first request with
    generated tokens within ``startup``, every full ``window`` at its floor of
    requests and tokens, never ``max_gap`` without one, each give or take
    TRUTH_SLACK_S. With tight detector thresholds also no gap between generated
    tokens past the detector's bound after its grace."""
    if truth is None or truth.get("first_request_wall") is None:
        return ["pass, but the server never received a completion request"]
    t_load = truth["first_request_wall"]
    t_end = t_load + load_s
    slack = TRUTH_SLACK_S
    rounding = 0.01  # the fake writes its walls to the hundredth
    ends = sorted((wall, n) for wall, n in zip(truth["completed_ok_walls"], truth["completed_ok_tokens"])
                  if t_load - rounding <= wall <= t_end + drain_s + rounding)
    out = []
    if not ends:
        out.append(f"pass, but no request finished with generated tokens (received {truth['requests_received']}: "
                   f"{truth['requests_by_kind']}; tokens streamed {truth['tokens_total']})")
    else:
        walls = [wall for wall, _ in ends]
        if walls[0] - t_load > WORK["startup"] + slack:
            out.append(f"pass, but the first request with generated tokens finished at load "
                       f"+{walls[0] - t_load:.1f}s (start-up {WORK['startup']}s)")
        points = walls + [max(t_end, walls[-1])]
        gap, at = max((b - a, a) for a, b in zip(points, points[1:]))
        if gap > WORK["max_gap"] + slack:
            out.append(f"pass, but no request finished with generated tokens for {gap:.1f}s from load "
                       f"+{at - t_load:.1f}s (max_gap {WORK['max_gap']}s)")
        window = WORK["window"]
        for k in range(int(load_s / window + 1e-9)):
            lo, hi = t_load + k * window - slack, t_load + (k + 1) * window + rounding
            inside = [n for wall, n in ends if lo <= wall < hi]
            if len(inside) < WORK["min_requests"] or sum(inside) < WORK["min_tokens"]:
                out.append(f"pass, but window {k} (load +{k * window:g}s to +{(k + 1) * window:g}s) had "
                           f"{len(inside)} request(s) with {sum(inside)} generated tokens (floor "
                           f"{WORK['min_requests']} and {WORK['min_tokens']})")
                break
    if tight:
        times = sorted(int(ds) / 10 for ds, n in truth["tokens_by_ds"].items() if n > 0)
        start = t_load + GRACE_S
        points = [start] + [t for t in times if start < t < t_end] + [t_end]
        gap, at = max((b - a, a) for a, b in zip(points, points[1:]))
        if gap > BOUND_S + SLACK_S:
            out.append(f"pass, but no token generated for {gap:.1f}s from load +{at - t_load:.1f}s "
                       f"(bound {BOUND_S}s after a {GRACE_S}s grace)")
    return out


def _secret_places(night: Night, secret: str) -> list[str]:
    needle = secret.encode()
    places = [name for name, text in (("stderr", night.stderr), ("stdout", night.stdout)) if secret in text]
    for root, label in ((night.run_dir, ""), (night.history_dir, "history/")):
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            if path.suffix == ".gz":
                try:
                    data += gzip.decompress(data)
                except (OSError, EOFError, zlib.error):
                    pass
            if needle in data:
                places.append(label + str(path.relative_to(root)))
    return places


def _formula_cells(path: Path) -> list[str]:
    """Cells a spreadsheet would evaluate: starting with = + - @ tab or CR, and not a number."""
    import csv

    cells = []
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            for row in csv.reader(fh):
                for cell in row:
                    if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
                        try:
                            float(cell)
                        except ValueError:
                            cells.append(cell[:60])
    except OSError:
        pass
    return cells


def _bad_jsonl(run_dir: Path) -> list[str]:
    bad = []
    for path in sorted(run_dir.rglob("*.jsonl*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError, zlib.error):
                pass  # a segment being written when the run ended: its complete members are read
        lines = data.split(b"\n")[:-1]  # the last piece has no newline: torn, not complete
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except (ValueError, RecursionError):
                bad.append(f"{path.relative_to(run_dir)}:{number}")
                break
    return bad


def check(night: Night) -> list[tuple[str, str]]:
    """Every invariant the night broke, as (invariant, what happened)."""
    sc, f = night.scenario, []
    code = night.exit_code
    summary = None
    try:
        summary = json.loads((night.run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        pass
    verdict = summary.get("verdict") if isinstance(summary, dict) else None
    truth = night.truth

    if code not in EXIT_CODES:
        f.append(("exit codes", f"exit {code}, not in CONTRACTS' table"))
    if code == 4:
        f.append(("exit codes", "exit 4: the harness failed on what a server did"))
    if code == 2 and not refusable(sc):
        f.append(("exit codes", "exit 2 on a valid config"))
    if code == 130:
        f.append(("exit codes", "exit 130 without an interrupt"))
    if "Traceback" in night.stderr:
        f.append(("no traceback", "a traceback on stderr: " + night.stderr.strip().splitlines()[-1][:200]))
    lines = [line for line in night.stderr.splitlines() if line.strip()]
    if code in (2, 3, 4) and len(lines) != 1:
        f.append(("one line on stderr", f"exit {code} with {len(lines)} lines on stderr: {lines[:3]}"))

    if code != 2:
        if summary is None:
            f.append(("readers are total", "no readable summary.json"))
        elif (code == 0) != (verdict == "pass"):
            f.append(("verdict", f"exit {code} with verdict {verdict!r}"))
    if verdict == "fail" and not (isinstance(summary, dict) and summary.get("verdict_reasons")):
        f.append(("a fail says why", "verdict 'fail' with no verdict_reasons"))
    if verdict == "pass" or code == 0:
        for why in work_violations(truth, tight=sc["detector"] == "tight"):
            f.append(("a pass is positive evidence", why))
    if forwarder_refused(sc) and code not in (2, 3):
        f.append(("the kill hits the target or nothing", f"exit {code}: the proxy in front, given by URL alone, "
                                                         "was not refused as the kill target"))
    refused = (refusable(sc) and (code == 2 or (code == 3 and sc["target"] == "launched_daemon"))) or \
        (forwarder_refused(sc) and code == 3)
    if well_behaved(sc) and not (code == 0 or refused):
        reasons = summary.get("verdict_reasons") if isinstance(summary, dict) else None
        f.append(("a working server passes", f"exit {code}, verdict {verdict!r}: {reasons or lines[-1:]}"))

    if night.maxrss_mb > RSS_CAP_MB:
        f.append(("bounded", f"harness peak RSS {night.maxrss_mb:.0f} MB > {RSS_CAP_MB} MB"))
    if night.wall_s > night.wall_bound_s:
        f.append(("bounded", f"the run took {night.wall_s:.1f}s > {night.wall_bound_s:.0f}s "
                             "(start-up timeout + duration + drain + margin)"))

    if not night.decoy_alive:
        f.append(("the kill hits the target or nothing", "the decoy process was killed"))
    if night.proxy_alive is False:
        f.append(("the kill hits the target or nothing", "the proxy in front of the server was killed"))
    if night.leftover:
        f.append(("the kill hits the target or nothing", "the launched server outlived the harness"))

    if truth is not None:
        if truth["sink_requests"]:
            f.append(("traffic only to the target", f"the redirect sink received {truth['sink_requests']} "
                                                    f"requests: {truth['sink_log'][:3]}"))
        if truth["followed_redirects"]:
            f.append(("traffic only to the target", f"{truth['followed_redirects']} redirects were followed"))

    places = _secret_places(night, sc["spec"]["secret"])
    if places:
        f.append(("no secret on disk or stderr", "the secret is in " + ", ".join(places[:8])))

    if code == 2:
        pass  # refused before anything ran: no run directory is promised
    elif night.run_dir.is_dir():
        bad = _bad_jsonl(night.run_dir)
        if bad:
            f.append(("readers are total", "invalid complete JSONL lines: " + ", ".join(bad[:5])))
        if night.report_rc != 0 or "Traceback" in night.report_err:
            tail = night.report_err.strip().splitlines()[-1:] if night.report_err.strip() else []
            f.append(("readers are total", f"soak report exit {night.report_rc}: {tail}"))
        if night.history_rc != 0 or "Traceback" in night.history_err:
            tail = night.history_err.strip().splitlines()[-1:] if night.history_err.strip() else []
            f.append(("readers are total", f"soak history exit {night.history_rc}: {tail}"))
        cells = _formula_cells(night.history_dir / "history.csv")
        if cells:
            f.append(("CSV cells are escaped", f"history.csv cells a spreadsheet evaluates: {cells[:3]}"))
    else:
        f.append(("readers are total", "no run directory"))
    return f


def _describe(night: Night) -> str:
    t = night.truth or {}
    return (f"exit {night.exit_code}, wall {night.wall_s:.1f}s, peak RSS {night.maxrss_mb:.0f} MB; truth: "
            f"received {t.get('requests_received')} {t.get('requests_by_kind')}, ok {t.get('completed_ok')}, "
            f"tokens {t.get('tokens_total')}, redirects {t.get('redirects_issued')}, sink {t.get('sink_requests')}; "
            f"stderr: {night.stderr.strip()[-400:]!r}")


def _settings(examples: int):
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if os.environ.get("SOAK_CHAOS_SHRINK") else [])
    # derandomize off: the shard's own @seed (SOAK_CHAOS_SEED) picks the nights, in CI too.
    return settings(max_examples=examples, deadline=None, phases=phases, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck), derandomize=False)


@pytest.mark.slow
@pytest.mark.timeout(max(300, 120 * (EXAMPLES // SHARDS + 1)))
@pytest.mark.parametrize("shard", range(SHARDS), ids=list(TARGETS))
def test_every_chaos_night_keeps_the_invariants(shard: int, tmp_path_factory) -> None:
    """One shard per target kind (xdist runs them side by side); a fixed seed
    per shard, so CI draws the same nights every time."""
    examples = max(1, EXAMPLES // SHARDS + (1 if shard < EXAMPLES % SHARDS else 0))

    @given(scenario=scenarios().map(lambda sc: {**sc, "target": TARGETS[shard]}))
    def night(scenario: dict[str, Any]) -> None:
        tmp = tmp_path_factory.mktemp(f"chaos-{TARGETS[shard]}-")
        result = run_night(tmp, scenario)
        failures = check(result)
        note(_describe(result))
        if COLLECT:
            with open(COLLECT, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"scenario": scenario, "failures": failures, "night": _describe(result),
                                     "exit": result.exit_code, "wall_s": round(result.wall_s, 1),
                                     "rss_mb": round(result.maxrss_mb), "dir": str(tmp)}) + "\n")
            return
        assert not failures, "\n".join(f"[{inv}] {what}" for inv, what in failures)

    seed(SEED * 100 + shard)(_settings(examples)(night))()


# -- the fake itself, in-process: its ground truth is what a strict client sees ----


_FINITE = ("normal", "zero_tokens", "http_error", "no_done", "reset", "redirect", "wrong_types", "deep_nesting",
           "html_200", "huge_line")


def _finite(behaviour: dict[str, Any]) -> bool:
    if behaviour["kind"] == "no_done":
        return behaviour["end"] == "eof"
    if behaviour["kind"] == "huge_line":
        return behaviour["newline"] and behaviour["mb"] <= 2
    return behaviour["kind"] in _FINITE


def _tokens_seen(body: bytes) -> int:
    """Content tokens a strict reader takes from an SSE body: well-formed chunks only."""
    seen = 0
    for event in body.split(b"\n\n"):
        # A line past the reader's bound is not a token, whatever it holds.
        if not event.startswith(b"data: ") or event == b"data: [DONE]" or len(event) >= READER_LINE_BOUND:
            continue
        try:
            obj = json.loads(event[6:])
        except (ValueError, RecursionError):
            continue
        try:
            content = obj["choices"][0]["delta"]["content"]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(content, str) and content:
            seen += 1
    return seen


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(behaviours=st.lists(completion().filter(_finite), min_size=1, max_size=4))
def test_the_fakes_ground_truth_counts_what_a_client_receives(behaviours, tmp_path_factory) -> None:
    import aiohttp

    truth_path = tmp_path_factory.mktemp("truth") / "truth.json"

    async def go() -> tuple[int, int, int, dict]:
        server = ChaosServer(spec(phases=[phase(completions=behaviours)], log={"interval_s": 5}),
                             truth_path=truth_path)
        url = await server.start()
        seen = redirects = 0
        try:
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for _ in behaviours:
                    try:
                        async with session.post(url + "/v1/chat/completions", data=b"{}",
                                                allow_redirects=False) as resp:
                            redirects += 300 <= resp.status < 400
                            seen += _tokens_seen(await resp.read())
                    except aiohttp.ClientPayloadError:
                        pass  # a reset: what arrived before it is lost to this reader
        finally:
            await server.close()
        return seen, redirects, len(behaviours), json.loads(truth_path.read_text())

    seen, redirects, n, truth = asyncio.run(go())
    # A reset loses what arrived before it to this reader; JSON nested 100,000 deep it cannot parse.
    lossy = sum(1 for b in behaviours if b["kind"] == "reset" or b.get("depth") == 100_000)
    assert truth["final"] and truth["requests_received"] == n
    assert truth["redirects_issued"] == redirects and truth["sink_requests"] == 0
    if lossy == 0:
        assert truth["tokens_total"] == seen
    else:
        assert truth["tokens_total"] >= seen
    assert truth["completed_ok"] == sum(1 for b in behaviours if b["kind"] in ("normal", "deep_nesting")
                                        or (b["kind"] == "wrong_types" and (b["where"].startswith(("usage", "prompt"))
                                                                            or b["where"] in WORK_DESPITE))
                                        or (b["kind"] == "huge_line" and b["newline"]
                                            and (b["mb"] << 20) < READER_LINE_BOUND))


def test_a_redirect_sink_records_what_reaches_it(tmp_path) -> None:
    """The check that traffic never leaves the target can fail: a client that
    follows the redirect is seen by the sink and as a followed redirect."""
    import aiohttp

    async def go() -> dict:
        server = ChaosServer(spec(phases=[phase(completions=[{"kind": "redirect", "status": 307, "to": "sink"},
                                                             {"kind": "redirect", "status": 302, "to": "self"},
                                                             {"kind": "normal", "tokens": 2}])]),
                             truth_path=tmp_path / "truth.json")
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(2):
                    async with session.post(url + "/v1/chat/completions", data=b"{}") as resp:
                        await resp.read()
        finally:
            await server.close()
        return json.loads((tmp_path / "truth.json").read_text())

    truth = asyncio.run(go())
    assert truth["sink_requests"] == 1 and truth["sink_log"][0]["method"] == "POST"
    assert truth["followed_redirects"] >= 1 and truth["redirects_issued"] >= 2


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_the_metrics_bomb_inflates_to_what_the_spec_says(encoding) -> None:
    from chaos.server import _bomb

    body = _bomb(encoding, 8)
    assert len(body) < 64 * 1024
    plain = zlib.decompress(body, 31 if encoding == "gzip" else 15)
    assert plain == b"#" * (8 << 20)


def test_the_work_judge_refuses_a_pass_without_work() -> None:
    """The test's own judge can fail: no request, no finished request, a stall,
    a slow start, a window below its floor, frozen tokens under tight thresholds."""
    t0 = 1_000_000.0

    def truth(ends: list[float], tokens: int = 2, token_s: list[float] | None = None) -> dict[str, Any]:
        token_s = ends if token_s is None else token_s
        return {"first_request_wall": t0, "requests_received": len(ends) + 1, "requests_by_kind": {"normal": 5},
                "completed_ok_walls": [t0 + x for x in ends], "completed_ok_tokens": [tokens] * len(ends),
                "tokens_total": tokens * len(ends), "tokens_by_ds": {str(int((t0 + x) * 10)): 1 for x in token_s}}

    steady = [x / 10 for x in range(2, 75, 3)]  # a request every 0.3 s through the drain
    assert work_violations(truth(steady), tight=True) == []
    assert work_violations(truth(steady), tight=False) == []
    assert work_violations(None, tight=False)
    assert "no request finished" in work_violations(truth([]), tight=False)[0]
    assert "for 3.1s" in work_violations(truth([x for x in steady if x < 3]), tight=False)[0]
    assert "first request" in work_violations(truth([x for x in steady if x > 3]), tight=False)[0]
    assert "window 0" in work_violations(truth([0.2, 1.5, 2.6, 3.8, 5.0, 6.0], tokens=1), tight=False)[0]
    frozen = truth(steady, token_s=[x for x in steady if x < 3])
    assert work_violations(frozen, tight=False) == []
    assert "no token generated" in work_violations(frozen, tight=True)[0]


# -- the cheap property: recorded behaviour through the real client into the pure judge --


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(behaviours=st.lists(completion(), min_size=1, max_size=4))
@example(behaviours=[{"kind": "zero_tokens", "finish": "stop"}])  # the 1,600 ok, 0 tokens
@example(behaviours=[{"kind": "keepalive", "interval_s": 0.2}])  # the SSE comments for 7 minutes
@example(behaviours=[{"kind": "normal", "tokens": 4, "token_delay_s": 0.0}, {"kind": "hang"}])  # work, then silence
@example(behaviours=[{"kind": "wrong_types", "where": "finish_int", "tokens": 2}])  # odd metadata, real work
@example(behaviours=[{"kind": "huge_line", "mb": 2, "newline": True}])  # one 2 MB token, under the line bound
def test_the_request_judge_never_passes_records_without_work(behaviours, tmp_path_factory) -> None:
    """The same drawn behaviours, without a harness process: each request goes
    through the real streaming client (seconds-long timeouts), the records through
    the pure judge with the nights' criteria (``work_evidence`` holds the
    no-evidence rule) over the load's span. A judged pass must be backed by the
    fake's truth as a night's is (``work_violations``), and by the records."""
    from soak.criteria.config import CriteriaConfig
    from soak.criteria import CriterionState, RequestTally, judge
    from soak.load.client import StreamingClient
    from soak.load.config import TimeoutsConfig
    from soak.load.progress import ProgressTracker
    from soak.workload.types import CHAT_PATH, TurnRequest

    truth_path = tmp_path_factory.mktemp("judge") / "truth.json"
    body = json.dumps({"model": "chaos-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "stream_options": {"include_usage": True}, "max_tokens": 16}).encode()
    turn = TurnRequest(session_id="s", turn=0, path=CHAT_PATH, body=body, planned_prompt_tokens=5, max_tokens=16,
                       think_time_s=0.0)

    async def go() -> tuple[list, dict, float, float]:
        server = ChaosServer(spec(phases=[phase(completions=behaviours)], log={"interval_s": 5}), truth_path=truth_path)
        url = await server.start()
        client = StreamingClient(base_url=url, timeouts=TimeoutsConfig(connect=1, first_token=1, stall=1, total=2),
                                 tracker=ProgressTracker(), max_connections=8, sweep_interval_s=0.1)
        await client.start()
        try:
            started = time.time()  # the records' ends are read on the wall clock here (no monotonic origin)
            records = await asyncio.gather(*(client.send(turn, request_id=f"r{i}") for i in range(len(behaviours))))
            stopped = time.time()
        finally:
            await client.aclose()
            await server.close()
        return list(records), json.loads(truth_path.read_text()), started, stopped

    records, truth, started, stopped = asyncio.run(go())
    config = CriteriaConfig.model_validate(CRITERIA)
    tally = RequestTally.for_config(config)
    tally.open_load(started)
    for record in sorted(records, key=lambda r: r.ended_at):  # as the run loop folds them live
        tally.add(record)
    tally.close_load(stopped)
    decision = judge(config, tally, final=True)
    work = next(r for r in decision.results if r.name == "work_evidence")
    note(f"records: {[(r.outcome, r.output_tokens) for r in records]}; truth ok {truth['completed_ok']}; "
         f"work_evidence {work.state.value}: {work.reasons[0]}")
    assert work.state in (CriterionState.PASS, CriterionState.FAIL), "the no-evidence rule did not judge the load"
    if decision.passed:
        assert any(r.outcome == "ok" and r.output_tokens > 0 for r in records), "passed with no request that did work"
        load_s = stopped - (truth["first_request_wall"] or started)
        assert work_violations(truth, tight=False, load_s=load_s, drain_s=0.0) == []


def test_the_csv_check_finds_formulas_and_spares_numbers(tmp_path) -> None:
    path = tmp_path / "h.csv"
    path.write_text('a,b,c\n-2.5,"=HYPERLINK(""http://x"",""c"")",@SUM(1)\n+1,"\'=1+1",-cmd\n', encoding="utf-8")
    assert _formula_cells(path) == ['=HYPERLINK("http://x","c")', "@SUM(1)", "-cmd"]
