"""pp_deadlock's wall_mtbf: a simulated build's hang rate, in the seconds the
harness measures time at risk in (wall, from the start of load), whatever the
simulator's time_scale; seeded, so a build is replayable and segments differ
only by seed."""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from soak.sim.config import SimConfig
from soak.sim.faults import parse_fault
from soak.sim.server import SimServer

MODEL = "deepseek-v4-flash"


def _due(seed: int, wall_mtbf: str = "20m") -> float:
    return SimServer(SimConfig(seed=seed, faults=[{"kind": "pp_deadlock", "wall_mtbf": wall_mtbf}])).faults.armed[0].wall_due


def test_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="wall_mtbf.*positive"):
        parse_fault({"kind": "pp_deadlock", "wall_mtbf": 0})
    with pytest.raises(ValidationError, match="not both"):
        SimConfig(faults=[{"kind": "pp_deadlock", "wall_mtbf": "20m", "mtbf": "20m"}])
    with pytest.raises(ValidationError, match="wall_mtbf"):
        SimConfig(faults=[{"kind": "crash", "wall_mtbf": "20m"}])  # a build's hang rate: pp_deadlock only
    assert parse_fault({"kind": "pp_deadlock", "wall_mtbf": "20m"}).wall_mtbf == 1200.0


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=2**31))
def test_the_draw_is_the_seeds(seed: int) -> None:
    assert _due(seed) == _due(seed) > 0
    # a wall_mtbf fault never fires at start-up or on a simulated schedule: only from the first request
    armed = SimServer(SimConfig(seed=seed, faults=[{"kind": "pp_deadlock", "wall_mtbf": "1m"}])).faults.armed[0]
    assert armed.due_at is None


def test_onsets_are_exponential_with_the_stated_mean() -> None:
    draws = [_due(seed, "600s") for seed in range(2000)]
    # exponential: mean 600 (standard error 600/sqrt(2000) = 13.4), median 600 ln 2 = 416
    assert abs(statistics.fmean(draws) - 600) < 50
    assert abs(statistics.median(draws) - 600 * 0.6931) < 40
    assert len(set(draws)) == len(draws)


@pytest.mark.parametrize("time_scale", [1.0, 200.0])
async def test_fires_after_the_draw_in_wall_seconds_from_the_first_request(sim_app, time_scale: float) -> None:
    seed = next(s for s in range(1000) if 0.3 < _due(s, "0.5s") < 0.8)  # a draw long enough to time
    due = _due(seed, "0.5s")
    sim = await sim_app(time_scale=time_scale, seed=seed, faults=[{"kind": "pp_deadlock", "wall_mtbf": "0.5s"}])
    async with aiohttp.ClientSession() as s:
        await asyncio.sleep(due + 0.2)  # no load yet: no time at risk, no hang
        async with s.get(sim.base_url + "/sim/state") as r:
            assert not (await r.json())["fault"]["fired"]
        started = time.time()
        # A long stream: the engine steps through the draw (a deadlock due while it idles waits for a step).
        body = {"model": MODEL, "prompt": "x\n", "max_tokens": 100_000, "ignore_eos": True, "stream": True}
        busy = await s.post(sim.base_url + "/v1/completions", json=body)
        assert busy.status == 200
        while True:
            async with s.get(sim.base_url + "/sim/state") as r:
                fault = (await r.json())["fault"]
            if fault["fired"] or time.time() - started > due + 10:
                break
            await asyncio.sleep(0.02)
        busy.close()
    assert fault["fired"] and fault["kind"] == "pp_deadlock"
    # the same wall delay at time_scale 1 and 200: time_scale compresses the server's work only
    # the upper bound leaves a loaded 2-core CI its timer lag; a scaled or server-start clock misses the lower
    assert due - 0.05 <= fault["onset_at"] - started <= due + 2.0


def test_each_launch_of_a_config_draws_a_fresh_onset(tmp_path) -> None:
    # a run that restarts its server after a hang: every launch its own draw (a Poisson
    # process of hangs), launch 0 the seed's own; counted beside the config file
    import argparse

    import yaml

    from soak.sim.cli import build_config

    path = tmp_path / "sim_config.yaml"
    # launch: 0 as the harness writes it (the whole SimConfig) before every start
    path.write_text(yaml.safe_dump({"seed": 4, "launch": 0, "faults": [{"kind": "pp_deadlock", "wall_mtbf": "20m"}]}))
    args = argparse.Namespace(config=path, fault=[])
    launches = [build_config(args) for _ in range(3)]
    assert [c.launch for c in launches] == [0, 1, 2]
    draws = [SimServer(c).faults.armed[0].wall_due for c in launches]
    assert draws[0] == _due(4) and len(set(draws)) == 3
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"seed": 4, "faults": [{"kind": "crash", "mtbf": "20m"}]}))
    assert build_config(argparse.Namespace(config=plain, fault=[])).launch == 0
    assert not (tmp_path / "plain.yaml.launches").exists()  # no wall_mtbf, no counter file
