"""The real-vLLM tier's fault injector (scripts/real_vllm_faults.py), without vLLM:
its spec, what each form does to the pipeline group's send and receive, and the
post-import hook that applies it in a real interpreter. The tier itself
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


def _load() -> Any:
    saved = os.environ.pop("SOAK_VLLM_FAULT", None)
    try:
        spec = importlib.util.spec_from_file_location("soak_vllm_faults_under_test", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        if saved is not None:
            os.environ["SOAK_VLLM_FAULT"] = saved


faults = _load()


@pytest.mark.parametrize("spec, expected", [
    ("skip_send:rank=0:step=40", ("skip_send", 40, 0)),
    ("extra_send:rank=1:step=7", ("extra_send", 7, 1)),
    ("spin_last:step=20", ("spin_last", 20, None)),
    ("spin_last", ("spin_last", 1, None)),
])
def test_a_spec_names_the_form_the_step_and_the_rank(spec, expected) -> None:
    fault = faults.parse(spec)
    assert (fault.kind, fault.step, fault.rank) == expected


@pytest.mark.parametrize("spec, says", [
    ("skip_sends:rank=0", "unknown kind 'skip_sends', known: skip_send, extra_send, spin_last"),
    ("skip_send:step=4", "skip_send needs rank=N"),
    ("spin_last:step=0", "step counts from 1"),
    ("spin_last:step=x", "'step=x' is not rank=N or step=N"),
    ("spin_last:when=3", "'when=3' is not rank=N or step=N"),
])
def test_a_bad_spec_is_one_line_naming_the_part(spec, says) -> None:
    with pytest.raises(faults.FaultSpecError, match=says.replace("(", r"\(").replace(")", r"\)")):
        faults.parse(spec)


def _fake_parallel_state(world: int = 2) -> tuple[Any, list[tuple[int, str, int]]]:
    """A parallel_state with a pipeline group of ``world`` ranks and a TP group; the
    calls that reach the real send/receive are logged as (rank, op, n)."""
    log: list[tuple[int, str, int]] = []

    class GroupCoordinator:
        def __init__(self, rank: int, size: int) -> None:
            self.rank_in_group, self.world_size = rank, size
            self.is_last_rank = rank == size - 1

        def isend_tensor_dict(self, tensor_dict: dict, **kwargs: Any) -> list[str]:
            log.append((self.rank_in_group, "send", tensor_dict["n"]))
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
def test_a_send_fault_changes_exactly_one_send_of_one_rank_on_the_pipeline(step, steps, kind, rank, mine) -> None:
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
        assert sent == [n for n in range(1, steps + 1) if n != step] and returned[step - 1] == []
    else:
        assert sent == sorted([*range(1, steps + 1), step])


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
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 0, 2]"  # the second send skipped, the others whole
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("SOAK_FAULT_INJECTED ")]
    said = json.loads(line.split(" ", 1)[1])
    assert (said["kind"], said["rank"], said["step"], said["pid"]) == ("skip_send", 0, 2, said["pid"]) \
        and said["ts"] > 1.7e9
    unset = subprocess.run([sys.executable, "-c", program], env={**env, "SOAK_VLLM_FAULT": ""},
                           capture_output=True, text=True, timeout=60)
    assert unset.stdout.strip() == "[2, 2, 2]" and "SOAK_FAULT_INJECTED" not in unset.stderr
