"""No evidence, no pass (issue 32): `soak run` as a real process against real
loopback servers that answer but do no work (tests/run/fake_vllm.py). Each used
to pass with exit 0 and a green JUnit; each is now exit 1, verdict fail, with the
missing work named in summary.json and junit.xml. A server that works still
passes."""

from __future__ import annotations

import pytest

from soakrun_helpers import attached_config, events, write_config
from test_trust_load import junit_cases, summary_of

# The do-nothing servers' rhythm: a byte, a chunk or a keep-alive every PACE s.
PACE = "0.2"


@pytest.fixture
def fake(fake_vllm):
    """``url = fake(mode)``: the do-nothing servers at PACE; their cut streams' noise dropped."""
    return lambda mode: fake_vllm(mode, PACE, quiet=True).url


def attached(url: str, *, window: str | None = "2s", **overrides) -> dict:
    config = attached_config(url, **overrides)
    config["load"] = {**config["load"], "drain": "2s"}
    if window is not None:
        config["criteria"] = {"work_evidence": {"window": window}}
    return config


NO_WORK = "no request finished with generated tokens"


@pytest.mark.parametrize("mode, what", [
    ("never_answer", "cut by the harness still in flight"),
    ("trickle", "cut by the harness still in flight"),
    ("all_slow", "cut by the harness still in flight"),
    ("zero_tokens", "finished ok with no generated tokens"),
    ("keepalive_only", "cut by the harness still in flight"),
])
def test_a_server_that_does_no_work_fails_the_soak(tmp_path, fake, harness, mode, what) -> None:
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / f"{mode}.yaml", attached(fake(mode), duration="3s")), run_dir)
    assert h.wait() == 1, h.stderr
    assert "Traceback" not in h.stderr
    summary = summary_of(run_dir)
    assert summary["verdict"] == "fail" and summary["exit_code"] == 1 and summary["incidents"] == []
    assert "work_evidence" in summary["criteria"]["failed"]
    reason = next(r for r in summary["verdict_reasons"] if r.startswith(NO_WORK))
    assert what in reason
    work = next(r for r in summary["criteria"]["results"] if r["name"] == "work_evidence")
    assert work["evidence"]["requests_with_tokens"] == 0
    failure = junit_cases(run_dir)["criteria.work_evidence"].find("failure")
    assert failure is not None and failure.get("message").startswith(NO_WORK)
    assert f"soak run: fail ({NO_WORK}" in h.stderr or "criterion work_evidence" in h.stderr


@pytest.mark.parametrize("mode", ["never_answer", "zero_tokens"])
def test_the_default_allowance_never_hides_a_load_that_produced_nothing(tmp_path, fake, harness, mode) -> None:
    """Defaults (10-minute window and start-up allowance) on a 3-second run: the
    live allowance has not run out, but the load ended with no work, so it fails."""
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "c.yaml", attached(fake(mode), window=None, duration="3s")), run_dir)
    assert h.wait() == 1, h.stderr
    summary = summary_of(run_dir)
    assert summary["verdict"] == "fail" and summary["criteria"]["failed"][-1] == "work_evidence"
    assert any(r.startswith(NO_WORK) for r in summary["verdict_reasons"])


def test_a_stalled_server_ends_the_soak_early_with_the_reason(tmp_path, fake, harness) -> None:
    """Live: the run loop judges the same criterion on its monotonic clock and stops
    a 10-minute soak once the start-up allowance passes with nothing generated."""
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "c.yaml", attached(fake("keepalive_only"), duration="10m")), run_dir)
    assert h.wait(timeout_s=120) == 1, h.stderr
    summary = summary_of(run_dir)
    assert summary["stop_reason"].startswith(f"criterion work_evidence: {NO_WORK} in the first")
    assert "start-up allowance of 2s" in summary["stop_reason"]
    assert summary["duration_s"] < 60
    assert [e["criterion"] for e in events(run_dir) if e["type"] == "criterion_fail"] == ["work_evidence"]


def test_a_server_that_works_still_passes(tmp_path, fake, harness) -> None:
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "ok.yaml", attached(fake("ok"), duration="4s")), run_dir)
    assert h.wait() == 0, h.stderr
    summary = summary_of(run_dir)
    assert summary["verdict"] == "pass" and summary["criteria"]["failed"] == []
    work = next(r for r in summary["criteria"]["results"] if r["name"] == "work_evidence")
    assert work["state"] == "pass" and work["evidence"]["requests_with_tokens"] > 10
    assert work["evidence"]["windows"]["judged"] >= 1 and work["evidence"]["windows"]["short"] == 0
    assert junit_cases(run_dir)["criteria.work_evidence"].find("failure") is None
