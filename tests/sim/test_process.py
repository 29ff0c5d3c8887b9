"""Real processes: the tree, its titles, healthy SIGTERM, and the pp_deadlock kill path."""

import json
import os
import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from soak import metric_names
from soak.probes.logwatch import strip_ansi

MODEL = "deepseek-v4-flash"


def _get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def _post(url, body, timeout=30.0):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _title(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0].decode()


def _counter(base, name):
    _, text = _get(base + "/metrics")
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_tree_titles_and_clean_sigterm(sim_process):
    sim = sim_process()
    state = sim.state()
    procs = state["processes"]
    assert procs["api_server"] == sim.pid
    assert len(procs["workers"]) == 8
    # one API server: untitled, as vLLM leaves it (VLLM::APIServer_<i> only with several)
    assert metric_names.parse_process_title(_title(sim.pid)) is None
    assert _title(procs["engine_core"]) == metric_names.engine_core_title()
    assert [_title(p) for p in procs["workers"]] == [metric_names.worker_title(r) for r in range(8)]
    assert psutil.Process(procs["engine_core"]).ppid() == sim.pid
    assert all(psutil.Process(p).ppid() == procs["engine_core"] for p in procs["workers"])
    assert [g["pids"] for g in state["gpus"]] == [[p] for p in procs["workers"]]
    out = _post(sim.base_url + "/v1/completions", {"model": MODEL, "prompt": "hello\n", "max_tokens": 8})
    assert out["usage"]["completion_tokens"] == 8
    everyone = [sim.pid, procs["engine_core"], *procs["workers"]]
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.popen.wait(timeout=20) == 0
    _wait(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in everyone),
          what="the tree to exit")
    assert "(Worker_PP3 pid=" in sim.log_text()


def test_pp_deadlock_kill_path(sim_process):
    sim = sim_process(time_scale=50)
    base = sim.base_url
    procs = sim.state()["processes"]
    everyone = [sim.pid, procs["engine_core"], *procs["workers"]]
    _post(base + "/v1/completions", {"model": MODEL, "prompt": "warm up\n", "max_tokens": 20})
    fault = _post(base + "/sim/fault", {"kind": "pp_deadlock", "ringbuffer_warning_interval": 20,
                                        "watchdog_timeout": 30, "execute_timeout": 100})
    assert fault["onset_at"] is not None
    frozen = _counter(base, "vllm:generation_tokens_total")
    # the tree reports that every worker and the engine core now ignore SIGTERM
    _wait(lambda: (lambda t: t["engine_ignores_sigterm"] and t["worker_states"] == ["spin"] * 7 + ["hold"])(sim.state()["tree"]),
          what="hung worker states")
    state = sim.state()
    assert [g["util_pct"] for g in state["gpus"]] == [100.0] * 7 + [0.0]
    assert state["fault"]["kind"] == "pp_deadlock" and state["fault"]["active"]
    status, _ = _get(base + "/health")
    assert status == 200  # hung is not dead
    for pid in everyone:
        os.kill(pid, signal.SIGTERM)
    assert _counter(base, "vllm:generation_tokens_total") == frozen
    _wait(lambda: "RPC call to execute_model timed out" in sim.log_text() and "EngineDeadError" in sim.log_text(),
          what="the execute timeout's lines")
    # ~5 s after EngineDeadError the API server shuts itself down; the hung workers stay, orphaned
    assert sim.popen.wait(timeout=20) == 0
    with pytest.raises(urllib.error.URLError):
        _get(base + "/health")
    time.sleep(0.3)
    assert all(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in procs["workers"]), \
        "hung workers linger after the API server left"
    log = strip_ansi(sim.log_text())
    order = [log.index(s) for s in (
        "No available shared memory broadcast block found in 20 seconds",
        "[PG ID 8 PG GUID 85(pp_broadcast) Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=40427, OpType=BROADCAST",
        "[PG ID 8 PG GUID 85(pp_broadcast) Rank 0] failure detected by watchdog at work sequence id: 40427",
        "TimeoutError: RPC call to execute_model timed out.",
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    )]
    assert order == sorted(order)
    assert f"(Worker_PP6 pid={procs['workers'][6]}) [rank6]:[E" in log
    assert "Rank 7] Watchdog" not in log  # the last stage never joined the broadcast
    assert "\x1b[1;36m(Worker_PP6 pid=" in sim.log_text()  # vLLM 0.11.2 colours the prefix
    for pid in everyone:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait(lambda: not sim.alive_pids(), what="SIGKILL to end the tree")


def test_own_session_worker_and_orphans_survive_their_parent(sim_process):
    """vllm#55510: kill -9 of the API server alone leaves the hung engine core and workers alive."""
    sim = sim_process("--pipeline-parallel-size", "3", "--worker-own-session", "1", time_scale=50)
    procs = sim.state()["processes"]
    workers = procs["workers"]
    assert os.getpgid(workers[1]) == workers[1] != os.getpgid(sim.pid)
    assert os.getpgid(workers[0]) == os.getpgid(sim.pid)
    _post(sim.base_url + "/sim/fault", {"kind": "pp_deadlock"})
    _wait(lambda: sim.state()["tree"]["worker_states"] == ["spin", "spin", "hold"], what="hung workers")
    _wait(lambda: sim.state()["tree"]["engine_ignores_sigterm"], what="hung engine core")
    os.kill(sim.pid, signal.SIGKILL)
    sim.popen.wait(timeout=10)
    time.sleep(0.3)
    survivors = [p for p in [procs["engine_core"], *workers] if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert survivors == [procs["engine_core"], *workers]
    sim.close()  # the fixture's close kills them from the PIDs it recorded
    _wait(lambda: not sim.alive_pids(), what="orphans to be killed")


def test_dcgm_text_parses_with_dcgm_labels(sim_process):
    sim = sim_process("--pipeline-parallel-size", "2", "--hostname", "box7", processes=False)
    status, text = _get(sim.base_url + "/sim/dcgm")
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    util = fams[metric_names.DCGM_FIELDS["util"].exposed]
    assert [s.labels["gpu"] for s in util.samples] == ["0", "1"]
    for s in util.samples:
        assert s.labels["Hostname"] == "box7" and s.labels["UUID"].startswith("GPU-") and s.value == 0
    assert {metric_names.DCGM_FIELDS[k].exposed for k in ("mem_used_mib", "power_w", "sm_clock_mhz")} <= set(fams)
