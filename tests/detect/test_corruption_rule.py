"""The detector's ``corruption`` rule: a bad canary (CORRUPT, CROSSTALK) fires at
once with the onset interval (last good canary's start, this one's start); no
other verdict ever fires it; a reset forgets older canaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.detect.config import DetectorConfig
from soak.detect.detector import Detector
from soak.records import IncidentKind, RuleState, Topology
from soak.samples import CanarySample, CanaryVerdict

TOPO = Topology(stages=((0,),))


def canary(verdict, started, *, cid="short-0", evidence=None) -> CanarySample:
    return CanarySample(ts=started + 0.5, canary_id=cid, verdict=verdict, started_at=started, e2e_s=0.5,
                        reference_source="run", position=3 if verdict in ("corrupt", "crosstalk") else None,
                        evidence=evidence or {"judgement": {"reason": f"diverged at token 3 ({verdict})"}})


def detector() -> Detector:
    return Detector(DetectorConfig(), topology=TOPO)


@pytest.mark.parametrize("verdict, fires", [
    (CanaryVerdict.CORRUPT, True), (CanaryVerdict.CROSSTALK, True), ("corrupt", True),
    (CanaryVerdict.UNJUDGED, False), (CanaryVerdict.MATCH, False), (CanaryVerdict.EXPLAINED, False),
    (CanaryVerdict.REFERENCE, False), ("something-else", False),
])
def test_only_a_bad_verdict_fires(verdict, fires):
    d = detector()
    d.observe(canary(CanaryVerdict.REFERENCE, 100.0))
    assert d.observe(canary(verdict, 120.0)) is fires  # judged now, not a detector interval later
    assessment = d.assess(121.0)
    status = assessment.rule("corruption")
    assert (status.state is RuleState.FIRED) is fires
    assert bool(assessment.new_incidents) is fires
    if fires:
        [decision] = assessment.new_incidents
        assert decision.kind is IncidentKind.CORRUPTION and decision.rule == "corruption"
        assert decision.evidence["onset_interval"] == {"earliest": 100.0, "latest": 120.5}  # the bad answer's end
        assert decision.reasons[0] == f"diverged at token 3 ({verdict})"


def test_the_interval_starts_at_the_last_good_canary_not_the_first():
    d = detector()
    for t, v in ((10.0, "reference"), (30.0, "match"), (50.0, "unjudged"), (70.0, "explained"), (90.0, "corrupt"),
                 (110.0, "corrupt")):
        d.observe(canary(v, t))
    [decision] = d.assess(120.0).new_incidents
    assert decision.evidence["onset_interval"] == {"earliest": 70.0, "latest": 90.5}
    assert decision.onset_at == 70.0
    assert decision.evidence["signals"]["bad_canaries"] == 2


def test_before_any_good_canary_the_interval_opens_at_the_reset():
    d = detector()
    d.reset(5.0)
    d.observe(canary("crosstalk", 40.0))
    [decision] = d.assess(41.0).new_incidents
    assert decision.evidence["onset_interval"] == {"earliest": 5.0, "latest": 40.5}


def test_after_a_reset_older_canaries_are_ignored():
    d = detector()
    d.observe(canary("corrupt", 100.0))
    d.reset(200.0)
    assert d.assess(201.0).rule("corruption").state is RuleState.INACTIVE
    assert d.observe(canary("corrupt", 150.0)) is False  # judged before the reset: the old server's
    assert not d.assess(202.0).new_incidents


def test_soaking_through_one_episode_is_one_incident():
    from soak.detect.signals import SignalTracker

    s = SignalTracker(DetectorConfig(), TOPO)
    assert s.observe(canary("corrupt", 10.0))
    s.forget_canaries(20.0)
    assert not s.observe(canary("corrupt", 30.0))  # the same episode: no new incident
    s.observe(canary("match", 40.0))
    assert s.observe(canary("corrupt", 60.0))  # a new one, after a good answer
    assert s.canary_bad_before == 40.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([v.value for v in CanaryVerdict]), max_size=30))
def test_fires_exactly_when_a_bad_canary_was_seen(verdicts):
    d = detector()
    for i, v in enumerate(verdicts):
        d.observe(canary(v, 10.0 * i))
    fired = d.assess(10.0 * len(verdicts) + 1).new_incidents
    bad = [i for i, v in enumerate(verdicts) if v in ("corrupt", "crosstalk")]
    assert bool(fired) == bool(bad)
    if bad:
        first = bad[0]
        goods = [i for i, v in enumerate(verdicts[:first]) if v in ("match", "explained", "reference")]
        interval = fired[0].evidence["onset_interval"]
        assert interval["latest"] == 10.0 * first + 0.5  # judged as the answer ended
        assert interval["earliest"] == (10.0 * goods[-1] if goods else None)
        assert interval["earliest"] is None or interval["earliest"] <= interval["latest"]
