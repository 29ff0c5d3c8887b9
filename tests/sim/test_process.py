"""Real processes: the tree, its titles, healthy SIGTERM, and the pp_deadlock kill path."""

import json
import os
import signal
import time
import urllib.request

import psutil
from prometheus_client.parser import text_string_to_metric_families

from soak import metric_names

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
    assert _title(sim.pid) == metric_names.api_server_title()
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
