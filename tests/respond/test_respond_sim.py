"""The responder against the real simulator process tree (``soak sim``), attached:
the server is started outside the responder, which is given its URL and PID.

The simulator's pp_deadlock makes every process ignore SIGTERM; one worker runs
in its own session (``--worker-own-session``); a decoy titled like a worker,
outside the tree, must survive.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

from respond_helpers import Decision, FakeTarget, is_alive, wait_for
import soak.probes.gpu as gpu_probes
from soak.clock import SystemClock
from soak.respond.config import ResponseConfig
from soak.respond.responder import Responder


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read() or b"{}")


async def test_responder_kills_the_simulated_tree_after_pp_deadlock(tmp_path, sim_process, start_decoy):
    import aiohttp

    sim = sim_process("--pipeline-parallel-size", "4", "--worker-own-session", "1", time_scale=20.0)
    decoy = start_decoy("VLLM::Worker_PP1")
    state = sim.state()
    workers = state["processes"]["workers"]
    tree = {sim.pid, state["processes"]["engine_core"], *workers}
    assert os.getsid(workers[1]) != os.getsid(sim.pid)
    post_json(sim.base_url + "/sim/fault", {"kind": "pp_deadlock"})
    wait_for(lambda: sim.state()["fault"]["active"], what="the deadlock")
    onset = sim.state()["fault"]["onset_at"]

    async with aiohttp.ClientSession() as session:
        gpus = gpu_probes.SimGpuSource(sim.base_url, session=session, clock=SystemClock())
        before = await gpus.read()
        assert before.error is None and {p for g in before.gpus for p in g.pids} <= tree
        config = ResponseConfig.model_validate({"gpu_release_timeout": 10.0, "gpu_poll_interval": 0.1,
                                                "evidence": {"py_spy": False, "flight_recorder_wait": 0.5}})
        responder = Responder(
            config, run_dir=tmp_path / "run", clock=SystemClock(), gpu_source=gpus, recent_samples=lambda: [],
            target=FakeTarget(base_url=sim.base_url, root_pid=sim.pid, log_path=sim.log_path),
        )
        await responder.start()
        try:
            now = time.time()
            record = await responder.handle(Decision("pp_tail_stall", "hang", onset, now), 1)
        finally:
            await responder.aclose()

    assert {pid for pid in tree if is_alive(pid)} == set()
    assert tree <= set(record.killed_pids)
    assert is_alive(decoy)
    # The simulated GPUs went with the simulated server: not confirmed, never "free".
    assert record.gpus_released is None and record.gpu_free_s is None
    assert any("not confirmed" in n for n in record.notes), record.notes
    bundle = tmp_path / "run" / "incidents" / "1"
    for name in ("incident.json", "samples.jsonl", "gpus.json", "metrics.txt", "log_tail.txt", "watchdog.json"):
        assert (bundle / name).exists(), name
    assert "vllm:generation_tokens" in (bundle / "metrics.txt").read_text()
    gpus_json = json.loads((bundle / "gpus.json").read_text())
    utils = [g["util_pct"] for g in sorted(gpus_json["gpus"], key=lambda g: g["index"])]
    assert utils[-1] == 0.0 and all(u >= 90.0 for u in utils[:-1])
