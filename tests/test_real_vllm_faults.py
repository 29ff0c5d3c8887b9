"""The real-vLLM tier's fault injector (scripts/real_vllm_faults.py), without vLLM:
its spec and plan, which launch gets which entry, what each form does to the
pipeline group's send and receive, and the post-import hook that applies it in a
real interpreter (through a .pth line, as the venv loads it). The tier itself
(tests/real_vllm) runs it inside vLLM's workers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "real_vllm_faults.py"
ENVS = ("SOAK_VLLM_FAULT", "SOAK_VLLM_FAULTS", "SOAK_VLLM_FAULT_STATE")


def _load() -> Any:
    saved = {k: os.environ.pop(k) for k in ENVS if k in os.environ}
    try:
        spec = importlib.util.spec_from_file_location("soak_vllm_faults_under_test", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        os.environ.update(saved)


faults = _load()

@pytest.mark.parametrize("spec, expected", [
    ("skip_send:rank=0:step=40", ("skip_send", 40, 0)),
    ("lag_send:rank=0:step=40", ("lag_send", 40, 0)),
    ("extra_send:rank=1:step=7", ("extra_send", 7, 1)),
    ("spin_last:step=20", ("spin_last", 20, None)),
    ("sigstop:step=5", ("sigstop", 5, None)),
    ("spin_last", ("spin_last", 1, None)),
])
def test_a_spec_names_the_form_the_step_and_the_rank(spec, expected) -> None:
    fault = faults.parse(spec)
    assert (fault.kind, fault.step, fault.rank) == expected


@pytest.mark.parametrize("spec, says", [
    ("skip_sends:rank=0", "unknown kind 'skip_sends', known: skip_send, lag_send, extra_send, spin_last, sigstop"),
    ("skip_send:step=4", "skip_send needs rank=N"),
    ("lag_send:step=4", "lag_send needs rank=N"),
    ("sigstop:rank=1:step=4", "sigstop acts on the last stage; it takes no rank="),
    ("spin_last:step=0", "step counts from 1"),
    ("spin_last:step=x", "'step=x' is not rank=N or step=N"),
    ("spin_last:when=3", "'when=3' is not rank=N or step=N"),
    ("spin_last:step=3:step=4", "step given twice"),
])
def test_a_bad_spec_is_one_line_naming_the_part(spec, says) -> None:
    with pytest.raises(faults.FaultSpecError, match=says.replace("(", r"\(").replace(")", r"\)")) as caught:
        faults.parse(spec)
    assert "\n" not in str(caught.value)


faults_st = st.one_of(
    st.builds(lambda kind, rank, step: faults.Fault(kind=kind, step=step, rank=rank),
              st.sampled_from(faults.SEND_KINDS), st.integers(0, 7), st.integers(1, 10_000)),
    st.builds(lambda kind, step: faults.Fault(kind=kind, step=step, rank=None),
              st.sampled_from(faults.LAST_KINDS), st.integers(1, 10_000)),
)
plans_st = st.lists(st.one_of(st.none(), faults_st), min_size=1, max_size=8)


def _plan_text(plan: list) -> str:
    return ",".join("none" if f is None else f.spec() for f in plan)


@settings(max_examples=100, deadline=None)
@given(plan=plans_st)
def test_a_plan_reads_back_entry_for_entry(plan) -> None:
    assert faults.parse_plan(_plan_text(plan)) == tuple(plan)
    assert faults.parse_plan(" , ".join("none" if f is None else f.spec() for f in plan)) == tuple(plan)


@settings(max_examples=100, deadline=None)
@given(plan=plans_st, bad=st.sampled_from(["bogus:step=3", "skip_send:step=3", "", "spin_last:step=0"]),
       where=st.integers(0, 8))
def test_a_bad_entry_anywhere_refuses_the_whole_plan_naming_the_entry(plan, bad, where) -> None:
    where = min(where, len(plan))
    entries = ["none" if f is None else f.spec() for f in plan]
    entries.insert(where, bad)
    with pytest.raises(faults.FaultSpecError) as caught:
        faults.parse_plan(",".join(entries))
    said = str(caught.value)
    assert said.startswith("SOAK_VLLM_FAULTS: ") and f"entry {where}" in said and "\n" not in said


@pytest.mark.parametrize("environ, says", [
    ({"SOAK_VLLM_FAULTS": "none"}, "SOAK_VLLM_FAULTS needs SOAK_VLLM_FAULT_STATE=DIR"),
    ({"SOAK_VLLM_FAULTS": "none", "SOAK_VLLM_FAULT": "sigstop", "SOAK_VLLM_FAULT_STATE": "/tmp/x"},
     "both set"),
])
def test_the_environment_must_ask_for_one_thing(environ, says) -> None:
    with pytest.raises(faults.FaultSpecError, match=says):
        faults.read_settings(environ)
    assert faults.read_settings({}) is None


@settings(max_examples=100, deadline=None)
@given(plan=plans_st, arrivals=st.lists(st.integers(0, 12), max_size=40))
def test_the_nth_launch_gets_the_nth_entry_whichever_worker_asks_first(plan, arrivals) -> None:
    # Workers of one engine arrive in any order and any number of times; the launch
    # index is the order in which engines were first seen, and past the plan is healthy.
    registry: tuple[str, ...] = ()
    first_seen: list[int] = []
    for engine in arrivals:
        index, registry = faults.launch_index(registry, f"e{engine}")
        if engine not in first_seen:
            first_seen.append(engine)
        assert index == first_seen.index(engine)
        assert faults.entry_for(plan, index) == (plan[index] if index < len(plan) else None)
    assert registry == tuple(f"e{e}" for e in first_seen)


def test_launches_registered_from_processes_keep_their_order_and_repeat_their_index(tmp_path) -> None:
    program = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("f", {str(SCRIPT)!r})
        f = importlib.util.module_from_spec(spec); sys.modules["f"] = f; spec.loader.exec_module(f)
        print(f.register(sys.argv[1], sys.argv[2]))
    """)
    state = tmp_path / "state"

    def reg(key: str) -> int:
        done = subprocess.run([sys.executable, "-c", program, str(state), key], capture_output=True, text=True,
                              timeout=60, env={k: v for k, v in os.environ.items() if k not in ENVS}, check=False)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert [reg(k) for k in ["a", "a", "b", "a", "c", "b"]] == [0, 0, 1, 0, 2, 1]
    # many at once: every key gets one index, all distinct
    procs = [subprocess.Popen([sys.executable, "-c", program, str(state), f"k{i}"], stdout=subprocess.PIPE,
                              text=True, env={k: v for k, v in os.environ.items() if k not in ENVS})
             for i in range(6)]
    got = sorted(int(p.communicate(timeout=60)[0]) for p in procs)
    assert got == [3, 4, 5, 6, 7, 8]


class Box:
    """A tensor's stand-in: a buffer the next step overwrites in place."""

    def __init__(self, v: int) -> None:
        self.v = v

    def clone(self) -> Box:
        return Box(self.v)


def _fake_parallel_state(world: int = 2) -> tuple[Any, list[tuple[int, str, int]]]:
    """A parallel_state with a pipeline group of ``world`` ranks and a TP group; the
    calls that reach the real send/receive are logged as (rank, op, n)."""
    log: list[tuple[int, str, int]] = []

    class GroupCoordinator:
        def __init__(self, rank: int, size: int) -> None:
            self.rank_in_group, self.world_size = rank, size
            self.is_last_rank = rank == size - 1

        def isend_tensor_dict(self, tensor_dict: dict, **kwargs: Any) -> list[str]:
            n = tensor_dict["n"]
            log.append((self.rank_in_group, "send", n.v if isinstance(n, Box) else n))
            return ["meta", "data"]

        def irecv_tensor_dict(self, **kwargs: Any) -> tuple[dict, list, list]:
            log.append((self.rank_in_group, "recv", 0))
            return {}, [], []

    module = SimpleNamespace(GroupCoordinator=GroupCoordinator)
    module.pp = GroupCoordinator(0, world)
    module.get_pp_group = lambda: module.pp
    return module, log


@settings(max_examples=60, deadline=None)
@given(step=st.integers(1, 30), steps=st.integers(1, 40), kind=st.sampled_from(["skip_send", "extra_send"]),
       rank=st.integers(0, 1), mine=st.integers(0, 1))
def test_a_send_fault_changes_the_sends_of_one_rank_on_the_pipeline_from_its_step(step, steps, kind, rank, mine) -> None:
    module, log = _fake_parallel_state()
    faults.patch(module, faults.Fault(kind=kind, step=step, rank=rank))
    module.pp.rank_in_group = mine
    tp = module.GroupCoordinator(mine, 2)  # another group: never touched
    returned = []
    for n in range(1, steps + 1):
        returned.append(module.pp.isend_tensor_dict({"n": n}))
        tp.isend_tensor_dict({"n": -n})
    sent = [n for r, op, n in log if op == "send" and n > 0]
    assert [n for r, op, n in log if op == "send" and n < 0] == [-n for n in range(1, steps + 1)]
    hit = mine == rank and step <= steps
    if not hit:
        assert sent == list(range(1, steps + 1))
    elif kind == "skip_send":
        # nothing from the skipped step on: no later payload can stand in for the missing one
        assert sent == list(range(1, step)) and returned[step - 1:] == [[]] * (steps - step + 1)
    else:
        assert sent == sorted([*range(1, steps + 1), step])


@settings(max_examples=100, deadline=None)
@given(step=st.integers(1, 30), steps=st.integers(1, 40), rank=st.integers(0, 1), mine=st.integers(0, 1))
def test_a_lagging_rank_sends_each_payload_one_step_late_from_its_step_on(step, steps, rank, mine) -> None:
    module, log = _fake_parallel_state()
    faults.patch(module, faults.Fault(kind="lag_send", step=step, rank=rank))
    module.pp.rank_in_group = mine
    buffer = Box(0)  # one buffer reused by every forward pass, as vLLM's are
    returned = []
    for n in range(1, steps + 1):
        buffer.v = n
        returned.append(module.pp.isend_tensor_dict({"n": buffer}))
    sent = [n for r, op, n in log if op == "send"]
    if mine != rank or step > steps:
        assert sent == list(range(1, steps + 1))
        return
    # the wire carries every payload in order, each from step N on a step late:
    # the receiver's step k completes only once the sender has run step k+1
    assert sent == list(range(1, steps))
    assert returned[step - 1] == [] and all(r == ["meta", "data"] for i, r in enumerate(returned) if i != step - 1)


def test_the_last_stage_spins_deaf_at_its_step_and_receives_before(monkeypatch) -> None:
    module, log = _fake_parallel_state()
    module.pp = module.GroupCoordinator(1, 2)

    class Spun(Exception):
        pass

    def spin() -> None:
        raise Spun

    monkeypatch.setattr(faults, "_spin_forever", spin)
    faults.patch(module, faults.Fault(kind="spin_last", step=3, rank=None))
    module.pp.irecv_tensor_dict()
    module.pp.irecv_tensor_dict()
    with pytest.raises(Spun):
        module.pp.irecv_tensor_dict()
    assert [op for _, op, _ in log] == ["recv", "recv"]


def test_in_a_real_interpreter_the_hook_patches_vllms_module_on_import_and_the_fault_announces_itself(tmp_path) -> None:
    # A stand-in package named as vLLM's, imported the way vLLM's worker imports it.
    package = tmp_path / "vllm" / "distributed"
    package.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "parallel_state.py").write_text(textwrap.dedent("""
        class GroupCoordinator:
            rank_in_group, is_last_rank = 0, False
            def isend_tensor_dict(self, tensor_dict, **kw):
                return ["meta", "data"]
            def irecv_tensor_dict(self, **kw):
                return {}, [], []
        _PP = GroupCoordinator()
        def get_pp_group():
            return _PP
    """))
    (tmp_path / "soak_vllm_faults.py").write_text(SCRIPT.read_text())
    program = ("import soak_vllm_faults\n"  # what the venv's .pth line does
               "from vllm.distributed import parallel_state as ps\n"
               "print([len(ps.get_pp_group().isend_tensor_dict({})) for _ in range(3)])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SOAK_VLLM_FAULT": "skip_send:rank=0:step=2"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 0, 0]"  # sends skipped from the second on
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("SOAK_FAULT_INJECTED ")]
    said = json.loads(line.split(" ", 1)[1])
    assert (said["kind"], said["rank"], said["step"], said["pid"]) == ("skip_send", 0, 2, said["pid"]) \
        and said["ts"] > 1.7e9
    unset = subprocess.run([sys.executable, "-c", program], env={**env, "SOAK_VLLM_FAULT": ""},
                           capture_output=True, text=True, timeout=60, check=False)
    assert unset.stdout.strip() == "[2, 2, 2]" and "SOAK_FAULT_INJECTED" not in unset.stderr


def _standin_vllm(root: Path) -> None:
    """vLLM's parallel_state as a worker sees it: the rank comes from RANK, the
    real send/receive print what reaches the wire."""
    package = root / "vllm" / "distributed"
    package.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "parallel_state.py").write_text(textwrap.dedent("""
        import os, sys
        class GroupCoordinator:
            rank_in_group = int(os.environ.get("RANK", "0"))
            is_last_rank = rank_in_group == 1
            def isend_tensor_dict(self, tensor_dict, **kw):
                print("wire", tensor_dict["n"], file=sys.stdout, flush=True)
                return ["meta", "data"]
            def irecv_tensor_dict(self, **kw):
                return {}, [], []
        _PP = GroupCoordinator()
        def get_pp_group():
            return _PP
    """))
    site = root / "site"
    site.mkdir()
    (site / "soak_vllm_faults.py").write_text(SCRIPT.read_text())
    (site / "soak_vllm_faults.pth").write_text("import soak_vllm_faults\n")  # as scripts/real-vllm setup writes it


# A worker loads the venv's site dir (the .pth line runs the injector), then sends three payloads.
_WORKER = ("import site, sys; site.addsitedir(sys.argv[1])\n"
           "from vllm.distributed import parallel_state as ps\n"
           "print('returned', [len(ps.get_pp_group().isend_tensor_dict({'n': n})) for n in (1, 2, 3)])\n")
# An engine: the parent of its workers, as EngineCore is.
_ENGINE = ("import subprocess, sys\n"
           "for rank in ('0', '1'):\n"
           "    subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]], env={**__import__('os').environ, 'RANK': rank},"
           " check=True)\n")


def _stamps(stderr: str, mark: str) -> list[dict]:
    return [json.loads(x.split(" ", 1)[1]) for x in stderr.splitlines() if x.startswith(mark + " ")]


def test_a_plan_gives_each_engine_launch_its_own_entry_and_healthy_past_the_end(tmp_path) -> None:
    _standin_vllm(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k not in ENVS}, "PYTHONPATH": str(tmp_path),
           "SOAK_VLLM_FAULTS": "skip_send:rank=0:step=2,none,lag_send:rank=0:step=2",
           "SOAK_VLLM_FAULT_STATE": str(tmp_path / "state")}
    launches = [subprocess.run([sys.executable, "-c", _ENGINE, _WORKER, str(tmp_path / "site")], env=env,
                               capture_output=True, text=True, timeout=120, check=False) for _ in range(4)]
    for done in launches:
        assert done.returncode == 0, done.stderr
    rank0 = [[line for line in d.stdout.splitlines()][:4] for d in launches]
    assert rank0[0] == ["wire 1", "returned [2, 0, 0]", "wire 1", "wire 2"]       # (a) skipped from the 2nd on
    assert rank0[1] == ["wire 1", "wire 2", "wire 3", "returned [2, 2, 2]"]       # none: healthy
    assert rank0[2] == ["wire 1", "wire 2", "returned [2, 0, 2]", "wire 1"]       # (b) the 2nd held, sent at the 3rd
    assert rank0[3] == ["wire 1", "wire 2", "wire 3", "returned [2, 2, 2]"]       # past the end: healthy
    # each worker says which entry its engine got; both workers of one engine agree
    for index, done in enumerate(launches):
        said = _stamps(done.stderr, "SOAK_FAULT_PLAN")
        assert [s["plan"] for s in said] == [index, index] and len({s["engine_pid"] for s in said}) == 1
    assert [s["fault"] for d in launches for s in _stamps(d.stderr, "SOAK_FAULT_PLAN")][::2] == \
        ["skip_send:rank=0:step=2", "none", "lag_send:rank=0:step=2", "none"]
    fired = [_stamps(d.stderr, "SOAK_FAULT_INJECTED") for d in launches]
    assert [[(s["kind"], s["plan"], s["step"]) for s in f] for f in fired] == \
        [[("skip_send", 0, 2)], [], [("lag_send", 2, 2)], []]


def test_a_last_stage_told_to_stop_stamps_then_stops_itself(tmp_path) -> None:
    import psutil

    _standin_vllm(tmp_path)
    program = ("import site, sys; site.addsitedir(sys.argv[1])\n"
               "from vllm.distributed import parallel_state as ps\n"
               "for _ in range(3):\n"
               "    ps.get_pp_group().irecv_tensor_dict(); print('received', flush=True)\n")
    env = {**{k: v for k, v in os.environ.items() if k not in ENVS}, "PYTHONPATH": str(tmp_path), "RANK": "1",
           "SOAK_VLLM_FAULT": "sigstop:step=2"}
    proc = subprocess.Popen([sys.executable, "-c", program, str(tmp_path / "site")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "received\n"
        stamp = proc.stderr.readline()
        assert stamp.startswith("SOAK_FAULT_INJECTED ") and json.loads(stamp.split(" ", 1)[1])["kind"] == "sigstop"
        deadline = __import__("time").monotonic() + 30
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert __import__("time").monotonic() < deadline, "never stopped"
            __import__("time").sleep(0.05)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert "received" not in out  # the second receive never ran


@pytest.mark.parametrize("environ", [
    {"SOAK_VLLM_FAULTS": "skip_send:rank=0:step=40,lag_sends:rank=0", "SOAK_VLLM_FAULT_STATE": "{state}"},
    {"SOAK_VLLM_FAULTS": "none"},
    {"SOAK_VLLM_FAULT": "spin_last:rank=1"},
])
def test_a_spec_the_injector_cannot_read_stops_the_process_at_start_with_one_line(tmp_path, environ) -> None:
    _standin_vllm(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k not in ENVS},
           **{k: v.format(state=tmp_path / "state") for k, v in environ.items()}}
    done = subprocess.run([sys.executable, "-c", "import site, sys; site.addsitedir(sys.argv[1]); print('started')",
                           str(tmp_path / "site")], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and "started" not in done.stdout
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith("soak fault injector: SOAK_VLLM_FAULT") and line.endswith("refusing to start")
