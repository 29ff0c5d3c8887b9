"""The unseen-prefill allowance over the wire (docs/detection.md, generation_frozen).

A real ``soak run`` against the chaos server, tight thresholds (a 1.5-s silence
bound a 6-s night can exercise). When the server's /metrics page has no KV usage
(a proxy's page, an allowlisted scrape) a prefill moves nothing the harness can
read, so a request waiting for its first token is not silence: a working server
whose first tokens come later than the bound passes. The allowance must not hide
a hang: work, then requests that never produce a first token, is still called,
at the allowance instead of the learned bound; with KV usage on the page the same
server is called at the bound, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from chaos.server import phase, spec
from chaos.test_chaos_properties import BOUND_S, DURATION_S, GRACE_S, SLACK_S, TIGHT_DETECTOR, _describe, run_night

# Seconds a prefill may go unseen in these nights: past the 1.5-s bound, short
# enough that a hang after work is still called inside the 6-s night.
ALLOWANCE_S = 3.0
DETECTOR = {**TIGHT_DETECTOR, "generation_frozen": {**TIGHT_DETECTOR["generation_frozen"],
                                                     "unseen_prefill_grace": f"{ALLOWANCE_S}s"}}
# A first token after up to 2.5 s leaves no full 2-s window of the property's
# WORK without a finished request; these nights judge work over the whole night.
CRITERIA = {"no_success": {"window": f"{DURATION_S}s"},
            "work_evidence": {"window": f"{DURATION_S}s", "min_requests": 1, "min_tokens": 1,
                              "startup": f"{DURATION_S - 1}s"}}


def _night(tmp: Path, phases: list[dict[str, Any]]) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    scenario = {"spec": spec(phases=phases), "target": "attached", "config_secrets": [], "detector": "custom",
                "find_root_by_port": True, "config": {"detector": DETECTOR, "criteria": CRITERIA}}
    night = run_night(tmp, scenario)
    summary = json.loads((night.run_dir / "summary.json").read_text())
    incidents = [json.loads((night.run_dir / i["evidence"] / "incident.json").read_text())
                 for i in summary["incidents"]]
    return night, summary, incidents


def _frozen_threshold(incident: dict[str, Any]) -> dict[str, Any]:
    decision = incident["decision"]
    assert decision["rule"] == "generation_frozen", decision
    return decision["evidence"]["thresholds"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), database=None)
# First tokens past the bound by half a second, and half a second short of the allowance.
@given(first_token_s=st.floats(BOUND_S + 0.5, ALLOWANCE_S - 0.5), tokens=st.integers(1, 16))
@example(first_token_s=2.5, tokens=1)
def test_a_working_server_whose_prefill_metrics_cannot_show_passes(first_token_s, tokens, tmp_path_factory):
    night, summary, incidents = _night(tmp_path_factory.mktemp("slowfirst"), [phase(
        completions=[{"kind": "normal", "tokens": tokens, "first_token_delay_s": first_token_s}],
        metrics={"kind": "no_kv"})])
    note(_describe(night))
    assert night.truth and night.truth["completed_ok"] >= 1  # it did work, every token after a long prefill
    assert incidents == [], [i["decision"]["reasons"] for i in incidents]
    assert night.exit_code == 0 and summary["verdict"] == "pass", summary.get("verdict_reasons")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("metrics", ["no_kv", "normal"])
def test_a_hang_before_the_first_token_is_still_called(metrics, tmp_path):
    """Two seconds of work, then every request waits for a first token that never comes."""
    night, summary, incidents = _night(tmp_path, [
        phase(duration_s=2.0, completions=[{"kind": "normal", "tokens": 4}], metrics={"kind": metrics}),
        phase(completions=[{"kind": "headers_then_hang"}], metrics={"kind": metrics})])
    assert summary["verdict"] == "fail" and night.exit_code == 1, (summary.get("verdict_reasons"), _describe(night))
    assert incidents, "the hang was not called"
    thresholds = _frozen_threshold(incidents[0])
    decision = incidents[0]["decision"]
    waited = decision["decided_at"] - decision["evidence"]["since"]
    if metrics == "no_kv":
        # Called at the allowance, no sooner, and the reasons say why it waited.
        assert thresholds["prefill_unseen"] is True and thresholds["threshold_s"] == pytest.approx(ALLOWANCE_S)
        # The newest sample (0.5 s), the next tick (0.5 s), and a loaded box's lag.
        assert ALLOWANCE_S <= waited <= ALLOWANCE_S + 2 * SLACK_S
        assert any("prefill unseen" in r for r in decision["reasons"]), decision["reasons"]
    else:
        # KV usage on the page: a prefill would move it, so the learned bound holds.
        assert thresholds["prefill_unseen"] is False and GRACE_S <= thresholds["threshold_s"] <= BOUND_S
        assert waited <= BOUND_S + 2 * SLACK_S
