"""The correctness oracle meets vLLM's own code (CPU build, PP 2, the tiny random Llama).

Two halves:
- recorded answers (tests/fixtures/real_vllm/oracle_*.json, bench/oracle_real_vllm.py
  --record): no server, every run (CI included). ``answer_from_body`` reads vLLM's
  real logprob shapes, and the judge calls the healthy pairs (one server life, and
  two lives apart) MATCH and the answer after ``extra_send`` CORRUPT; properties over
  the real logprobs hold the near-tie rule on this model, whose every top-5
  alternative lies within the default 0.2 nats (docs/real-vllm.md, "The oracle on
  the CPU build");
- the tier (marked real_vllm): one ``soak run`` of the launched server with
  ``SOAK_VLLM_FAULT=extra_send:rank=0:step=N:fit=1`` ends exit 1 with a ``corruption``
  incident whose onset interval holds the injector's stamp.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.oracle.answer import Answer, TokenChoice, answer_from_body
from soak.oracle.compare import judge_answer
from soak.samples import CanaryVerdict

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "real_vllm"
MARGIN = 0.2  # the oracle's default tie margin (soak.oracle.config)


def _answer(name: str) -> Answer:
    return answer_from_body(json.loads((FIXTURES / name).read_bytes()))


HEALTHY = "oracle_chat_healthy.json"  # a greedy canary, one server life
AGAIN = "oracle_chat_healthy_again.json"  # the same request later, under load from 6 other clients
OTHER_LIFE = "oracle_chat_extra_send_healthy.json"  # the same request, another launch, before the fault fired
CORRUPT = "oracle_chat_extra_send_corrupt.json"  # the same request on that launch after extra_send fired
COMPLETION = "oracle_completion_logprobs5.json"  # /v1/completions with logprobs: 5


@pytest.mark.parametrize("name, positions", [(HEALTHY, 32), (AGAIN, 32), (OTHER_LIFE, 32), (CORRUPT, 32),
                                             (COMPLETION, 12)])
def test_the_oracle_reads_every_position_of_vllms_real_logprob_answers(name, positions):
    answer = _answer(name)
    assert answer.malformed is None and answer.model == "tiny-llama"
    assert len(answer.tokens) == positions and answer.finish_reason == "length"  # ignore_eos: all max_tokens
    for t in answer.tokens:
        assert t.logprob is not None and t.logprob < 0
        assert len(t.top) == 5  # top_logprobs 5 / logprobs 5
        lps = [lp for _, lp in t.top]
        assert lps == sorted(lps, reverse=True)
        # greedy: the chosen token is the top alternative (or tied with it, exactly)
        assert t.logprob == lps[0]
        assert t.token == t.top[0][0] or dict(t.top).get(t.token) == lps[0] or t.logprob == t.top[1][1]


def test_healthy_greedy_answers_match_within_a_server_life_and_across_launches():
    reference = _answer(HEALTHY)
    for name in (AGAIN, OTHER_LIFE):
        judged = judge_answer(reference, _answer(name), tie_margin=MARGIN)
        assert judged.verdict is CanaryVerdict.MATCH, (name, judged.reason)


def test_the_answer_after_extra_send_is_a_corruption_at_its_first_token():
    reference, corrupt = _answer(OTHER_LIFE), _answer(CORRUPT)
    judged = judge_answer(reference, corrupt, tie_margin=MARGIN)
    assert judged.verdict is CanaryVerdict.CORRUPT, judged.reason
    assert judged.position == 0 and judged.reference_token == reference.tokens[0].token
    assert judged.answer_token == corrupt.tokens[0].token
    # neither side lists the other's token: no logprob could explain it, at any margin
    assert judged.gap is None
    assert judge_answer(reference, corrupt, tie_margin=5.0).verdict is CanaryVerdict.CORRUPT
    # a healthy answer of another launch is no cross-talk source for it
    assert judge_answer(reference, corrupt, tie_margin=MARGIN, others={"b": _answer(HEALTHY)}).verdict \
        is CanaryVerdict.CORRUPT


def _flip(reference: Answer, i: int, j: int, tail: Answer) -> tuple[Answer, float]:
    """The reference up to ``i``, then its ``j``-th alternative at ``i`` (with the reference's
    logprobs there), then ``tail``'s tokens: a flip at a real position, and the gap it makes."""
    at = reference.tokens[i]
    token, lp = at.top[j]
    flipped = TokenChoice(token, lp, at.top)
    tokens = reference.tokens[:i] + (flipped,) + tail.tokens[i + 1:]
    return Answer(tokens, "".join(t.token for t in tokens), "length", "tiny-llama"), abs(at.logprob - lp)


@settings(max_examples=150, deadline=None)
@given(i=st.integers(0, 31), j=st.integers(1, 4), margin=st.sampled_from([0.0, 0.01, 0.05, MARGIN, 1.0]))
def test_a_flip_to_a_listed_alternative_is_explained_exactly_when_the_real_gap_is_within_the_margin(i, j, margin):
    reference = _answer(HEALTHY)
    if reference.tokens[i].top[j][0] == reference.tokens[i].token:
        return  # an exact tie listed the chosen token second: no flip there
    answer, gap = _flip(reference, i, j, _answer(CORRUPT))
    judged = judge_answer(reference, answer, tie_margin=margin)
    assert judged.position == i
    expected = CanaryVerdict.EXPLAINED if gap <= margin + 1e-9 else CanaryVerdict.CORRUPT
    assert judged.verdict is expected, (i, j, gap, judged.reason)


def test_on_this_random_model_every_listed_alternative_is_a_near_tie_at_the_default_margin():
    # the fact the tie margin meets on the CPU tier: near-uniform logits (about -8.1 nats a
    # token of 8,000), a healthy answer's top 1 to top 5 at most 0.19 nats apart; a real
    # model's are far wider (the corrupted answer's spread wider too: up to 0.27)
    for name in (HEALTHY, OTHER_LIFE, COMPLETION):
        for t in _answer(name).tokens:
            assert t.top[0][1] - t.top[-1][1] <= MARGIN
            assert -9.0 < t.logprob < -7.0


@settings(max_examples=100, deadline=None)
@given(i=st.integers(0, 31))
def test_the_corrupt_answer_spliced_in_at_any_position_is_caught_there_unless_a_listed_alternative_explains_it(i):
    reference, corrupt = _answer(OTHER_LIFE), _answer(CORRUPT)
    tokens = reference.tokens[:i] + corrupt.tokens[i:]
    answer = Answer(tokens, "", "length", "tiny-llama")
    judged = judge_answer(reference, answer, tie_margin=MARGIN)
    first = next((k for k in range(i, 32) if tokens[k].token != reference.tokens[k].token), None)
    if first is None:
        assert judged.verdict is CanaryVerdict.MATCH
        return
    assert judged.position == first
    ref_at, got_at = reference.tokens[first], tokens[first]
    # the gaps either side's own logprobs give between the two tokens, where it lists both
    gaps = [abs(own.logprob - dict(own.top)[other.token]) for own, other in ((ref_at, got_at), (got_at, ref_at))
            if other.token in dict(own.top)]
    explained = bool(gaps) and min(gaps) <= MARGIN + 1e-9
    assert judged.verdict is (CanaryVerdict.EXPLAINED if explained else CanaryVerdict.CORRUPT), judged.reason


def test_speculative_decodings_real_counters_read_as_the_acceptance_rules_expect():
    # vLLM 0.32 CPU, PP 1, --speculative-config ngram (3 tokens, lookup 2-4): it serves,
    # and /metrics carries the spec_decode counters (PP 2 does not start: docs/real-vllm.md)
    from soak.probes.metrics import parse_metrics

    values = parse_metrics((FIXTURES / "metrics_spec_decode_ngram_pp1.txt").read_text()).values
    assert values["spec_decode_num_drafts"] == 65
    assert values["spec_decode_num_draft_tokens"] == 171 and values["spec_decode_num_accepted_tokens"] == 148
    # acceptance on this repetitive output: 148 of 171 draft tokens
    assert 0.8 < values["spec_decode_num_accepted_tokens"] / values["spec_decode_num_draft_tokens"] < 0.9


# ---------------------------------------------------------------- the tier: a soak run with extra_send

FAULT_STEP = int(os.environ.get("SOAK_REAL_VLLM_ORACLE_STEP") or 2000)


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("oracle_real_vllm", REPO / "bench" / "oracle_real_vllm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.real_vllm
@pytest.mark.timeout(900)
def test_extra_send_inside_vllm_is_a_corruption_incident_with_its_onset_after_the_fault(tmp_path):
    from ports import free_port

    from .conftest import HOME

    bench = _bench()
    port = int(os.environ.get("SOAK_REAL_VLLM_PORT") or free_port())
    # Budget (the tier's whole is tight): a canary every 3 s, up to 20 % of the server's
    # time, two short prompts and one long (the workload's own 8K prefix), concurrency 2.
    config = bench.detect_config(tmp_path / "run.yaml", port=port, step=FAULT_STEP, duration="5m",
                                 oracle={"interval": "3s", "max_share": 0.2, "short": 2, "long": 1},
                                 concurrency=2, home=str(HOME))
    out = tmp_path / "run"
    log = open(tmp_path / "run.out", "wb")
    soak = subprocess.Popen([sys.executable, "-m", "soak", "run", str(config), "--out", str(out)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        code = soak.wait(timeout=780)
    finally:
        if soak.poll() is None:
            soak.send_signal(signal.SIGTERM)
            soak.wait(timeout=120)
    ran = (tmp_path / "run.out").read_text(errors="replace")[-3000:]
    row = bench.detection(out)
    print(json.dumps(row, indent=1, default=str))
    assert row["stamp"] is not None, f"the fault never fired (step {FAULT_STEP}): {ran}"
    assert code == 1, ran
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    kinds = [i["kind"] for i in summary["incidents"]]
    assert kinds[0] == "corruption", kinds  # the server still answered: no hang, no crash first
    incident = row["incident"]
    stamp = row["stamp"]["ts"]
    # The onset interval runs from the last good canary to the bad answer's end. A fault whose wrong
    # tokens come a few steps after its stamp can let one more canary finish right after it, so the
    # interval's earliest edge may lie past the stamp; what must hold: the bad answer ended after the
    # fault fired, the decision came after it, and no answer from before the fault was called wrong.
    assert incident["onset_earliest_at"] is not None and incident["onset_latest_at"] is not None
    assert incident["onset_earliest_at"] <= incident["onset_latest_at"], incident
    assert incident["onset_latest_at"] >= stamp and incident["detected_at"] >= stamp, (incident, stamp)
    bad = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()
           if '"canary"' in line and ('"corrupt"' in line or '"crosstalk"' in line)]
    assert bad and all(c["ts"] >= stamp for c in bad), [(c["ts"], c["verdict"]) for c in bad]
    assert row["canaries_before_onset"] >= 1 and row["canaries_after_onset"] >= 1
    evidence = out / incident["evidence"]
    assert evidence.is_dir()
