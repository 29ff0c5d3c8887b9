"""Detection latency as the interval the onset allows (issue 37): the derived figure
(soak.records.detection_latency) and its words (soak.onset), on any input an old,
hand-edited or damaged summary.json can hold."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.onset import latencies_words, latency_sentence, latency_words, restated, shown_range
from soak.records import DetectionLatency, IncidentKind, IncidentRecord, detection_latency
from soak.summary_file import IncidentEntry

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
times = st.floats(min_value=T0 - 600, max_value=T0 + 600)
junk = st.one_of(st.none(), st.booleans(), st.text(max_size=5), st.integers(), st.floats(),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
anything = st.one_of(times, junk)
# what no date can be made of (0 is 1970: a date, however unlikely an onset)
not_a_date = junk.filter(lambda v: isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e11)


def cases(detected, onset, earliest, latest):
    """((detected, onset, earliest, latest), the latency derived from them)."""
    return st.tuples(detected, onset, earliest, latest).map(lambda t: (t, detection_latency(
        detected_at=t[0], onset_at=t[1], onset_earliest_at=t[2], onset_latest_at=t[3])))


@settings(max_examples=100, deadline=None)
@given(cases(anything, anything, anything, anything))
def test_any_four_values_give_an_ordered_non_negative_latency_or_none_and_words(case) -> None:
    _, latency = case
    if latency is not None:
        assert 0.0 <= latency.min_s <= latency.max_s and math.isfinite(latency.max_s)
        if latency.point:
            assert latency.min_s == latency.max_s
    said = restated("hang (pp_tail_stall): detected 2.3s after onset; SIGKILL to 3 processes", latency,
                    sentence=True)
    assert ("point estimate" in said) == (latency is not None and latency.point)
    assert "2.3s" not in said or latency is None


@settings(max_examples=100, deadline=None)
@given(cases(times, times, times, times))
def test_with_both_ends_the_latency_runs_from_the_latest_to_the_earliest_onset(case) -> None:
    (detected, _, earliest, latest), latency = case
    assert latency is not None and not latency.point
    first, last = sorted((earliest, latest))
    assert latency.min_s == max(0.0, detected - last) and latency.max_s == max(0.0, detected - first)
    low, high = shown_range(latency)  # rounded outwards: the words hold the figure computed
    assert low <= latency.min_s + 1e-4 and latency.max_s - 1e-4 <= high


@settings(max_examples=100, deadline=None)
@given(cases(times, times, st.one_of(st.none(), times), not_a_date))
def test_without_an_interval_it_is_the_one_onset_estimate_said_as_a_point(case) -> None:
    (detected, onset, _, _), latency = case
    assert latency is not None and latency.point
    assert latency.min_s == latency.max_s == max(0.0, detected - onset)
    assert latency_words(latency).endswith("after the onset (point estimate)")


def test_the_words_a_person_reads() -> None:
    latency = detection_latency(detected_at=T0 + 1.6, onset_at=T0 + 0.7, onset_earliest_at=T0,
                                onset_latest_at=T0 + 0.7)
    assert latency_sentence(latency) == \
        "detected 0.9-1.6 s after the onset (onset between 08:00:00.0 and 08:00:00.7 UTC)"
    point = detection_latency(detected_at=T0 + 1.6, onset_at=T0 + 0.4)
    assert latency_sentence(point) == "detected 1.2 s after the onset (point estimate; onset at 08:00:00.4 UTC)"
    assert latencies_words([latency, latency]) == "each detected 0.9-1.6 s after its onset"
    assert latency_words(None) == "detection latency unknown"
    # a detection stamped before its onset (a clock step, a hand edit) is no negative latency
    assert latency_words(detection_latency(detected_at=T0, onset_at=T0 + 5)) == \
        "detected 0.0 s after the onset (point estimate)"


def test_an_incident_record_and_an_old_summary_entry_say_the_same() -> None:
    record = IncidentRecord(number=1, kind=IncidentKind.HANG, rule="pp_tail_stall", onset_at=T0 + 0.7,
                            detected_at=T0 + 1.6, killed_pids=(), gpus_released=True, gpu_free_s=None,
                            evidence="incidents/1", summary="", onset_earliest_at=T0, onset_latest_at=T0 + 0.7)
    old = {k: v for k, v in record.to_json().items() if k != "detection_latency_s"}
    assert IncidentEntry.from_json(old).detection_latency == record.detection_latency
    # only the stored figure (the onset keys lost): read back, with no onset times to say
    kept = IncidentEntry.from_json({"detection_latency_s": {"min": 0.9, "max": 1.6, "point": False}})
    assert kept.detection_latency == DetectionLatency(0.9, 1.6, point=False)
    assert IncidentEntry.from_json({"detection_latency_s": {"min": "x", "max": float("nan")}}).detection_latency \
        is None


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["detected_at", "onset_at", "onset_earliest_at", "onset_latest_at",
                                        "detection_latency_s"]),
                       st.one_of(anything, st.fixed_dictionaries({"min": anything, "max": anything}))))
def test_a_hand_edited_summary_entry_reads_and_says_its_latency_without_raising(entry) -> None:
    latency = IncidentEntry.from_json(entry).detection_latency
    assert latency is None or 0.0 <= latency.min_s <= latency.max_s
    assert latency_sentence(latency).startswith(("detected ", "detection latency unknown"))


def test_the_responder_says_the_interval_and_readers_do_not_say_it_twice():
    """incident.json's summary carries the interval itself; a reader's restatement replaces
    it (now with the onset times), never appends a second latency."""
    from soak.onset import latency_words, restated
    from soak.records import detection_latency

    latency = detection_latency(detected_at=1001.7, onset_at=1000.25, onset_earliest_at=999.0,
                                onset_latest_at=1000.25)
    said = f"hang (pp_tail_stall): {latency_words(latency)}; SIGKILL to 3 processes"
    assert "detected 1.4-2.7 s after the onset" in said
    again = restated(said, latency, sentence=True)
    assert again.count("after the onset") == 1 and "onset between" in again
    point = detection_latency(detected_at=10.0, onset_at=9.3)
    said = f"hang (log_signature): {latency_words(point)}; SIGKILL to 3 processes"
    assert restated(said, point).count("after the onset") == 1
