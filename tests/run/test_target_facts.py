"""The target's facts: /version read once (with the API key) for both the version
profile and the build identity, /v1/models' max_model_len, and whether the
workload's largest request fits, decided on the typed Plan."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from loopback_app import serve_any_path
from soak import net
from soak.errors import WorkloadDoesNotFit
from soak.events import EventType
from soak.records import TargetKind, TargetLayout
from soak.run.target_facts import Fit, check_fit, max_model_len_of, read_target_facts, say_fit
from soak.workload.plan import summarize


def _plan(largest: tuple[int, int], counter: str = "exact (tokenizer)"):
    base = summarize([], workload="w", counter=counter, duration_s=60.0, concurrency=1, block_size=16, sessions=0)
    return dataclasses.replace(base, largest_request=largest)


@pytest.mark.parametrize("largest, limit, counter, fit", [
    ((0, 0), 100, "exact", Fit.NOT_CHECKED),  # nothing planned: nothing to check
    ((0, 50), None, "exact", Fit.NOT_CHECKED),
    ((10, 5), None, "exact", Fit.UNKNOWN),  # /v1/models lists no max_model_len
    ((90, 10), 100, "exact", Fit.FITS),  # exactly at the limit fits
    ((90, 11), 100, "exact", Fit.DOES_NOT_FIT),  # vLLM refuses prompt + max_tokens over the limit
    ((101, 0), 100, "exact (tokenizer)", Fit.DOES_NOT_FIT),
    ((90, 11), 100, "estimate (chars/4)", Fit.MAY_NOT_FIT),  # estimated counts only warn
    ((101, 0), 100, "", Fit.MAY_NOT_FIT),
])
def test_the_fit_ladder(largest, limit, counter, fit):
    assert check_fit(_plan(largest, counter), limit).fit is fit


def test_the_message_names_the_prompt_alone_when_it_is_over_by_itself():
    over = check_fit(_plan((120, 5)), 100)
    assert "largest prompt is 120 tokens, above the target's max_model_len 100" in over.message
    summed = check_fit(_plan((90, 20)), 100)
    assert "needs 110 tokens (90 prompt + 20 max_tokens)" in summed.message


@settings(max_examples=100, deadline=None)
@given(prompt=st.integers(1, 10**6), max_tokens=st.integers(0, 10**5), limit=st.integers(1, 10**6),
       exact=st.booleans())
def test_a_request_fits_exactly_when_prompt_and_max_tokens_are_within_the_limit(prompt, max_tokens, limit, exact):
    check = check_fit(_plan((prompt, max_tokens), "exact" if exact else "estimate"), limit)
    if prompt + max_tokens <= limit:
        assert check.fit is Fit.FITS and check.message == ""
    else:
        assert check.fit is (Fit.DOES_NOT_FIT if exact else Fit.MAY_NOT_FIT)
        assert f"{limit:,}" in check.message


def test_saying_the_fit_raises_only_for_a_workload_that_cannot_fit():
    said: list[tuple[EventType, dict]] = []

    def emit(type, **fields):
        said.append((type, fields))

    say_fit(check_fit(_plan((10, 5)), 100), emit)
    say_fit(check_fit(_plan((10, 5)), None), emit)
    say_fit(check_fit(_plan((95, 10), "estimate"), 100), emit)
    assert [t for t, _ in said] == [EventType.WORKLOAD_FITS, EventType.MAX_MODEL_LEN_UNKNOWN,
                                    EventType.WORKLOAD_MAY_NOT_FIT]
    assert said[0][1] == {"max_model_len": 100, "largest_prompt": 10, "max_tokens": 5}
    with pytest.raises(WorkloadDoesNotFit, match="HTTP 400"):
        say_fit(check_fit(_plan((95, 10)), 100), emit)


@pytest.mark.parametrize("body, model, limit", [
    ({"data": [{"id": "a", "max_model_len": 10}, {"id": "b", "max_model_len": 20}]}, "b", 20),
    ({"data": [{"id": "a", "max_model_len": 10}, {"id": "b", "max_model_len": 20}]}, "zzz", 10),  # else the first
    ({"data": [{"id": "a", "max_model_len": 10}]}, None, 10),
    ({"data": [{"id": "a", "max_model_len": True}]}, "a", None),  # not a count
    ({"data": [{"id": "a", "max_model_len": -5}]}, "a", None),
    ({"data": [{"id": "a"}]}, "a", None),
    ({"data": "nope"}, "a", None),
    (["not", "an", "object"], "a", None),
    ({"data": []}, "a", None),
])
def test_max_model_len_is_read_defensively(body, model, limit):
    assert max_model_len_of(body, model) == limit


def _layout(model: str | None = None) -> TargetLayout:
    return TargetLayout(kind=TargetKind.ATTACHED, model=model)


async def _facts_from(version_body, *, api_key="sk-test", status=200):
    hits: list[tuple[str, str | None]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        hits.append((request.path, request.headers.get("Authorization")))
        if request.path == "/version":
            if status != 200:
                return web.Response(status=status, headers={"Location": "http://127.0.0.1:9/elsewhere"})
            return web.json_response(version_body)
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})
        return web.Response(status=404)

    runner, url = await serve_any_path(handler)
    said: list[tuple[EventType, dict]] = []
    try:
        async with net.session() as session:
            facts = await read_target_facts(_layout(), base_url=url, models=("m",), session=session,
                                            api_key=api_key, emit=lambda t, **f: said.append((t, f)))
    finally:
        await runner.cleanup()
    return facts, hits, said


def test_version_is_read_once_with_the_key_and_feeds_the_profile_and_the_build():
    facts, hits, said = asyncio.run(_facts_from({"version": "0.11.2"}))
    assert [p for p, _ in hits].count("/version") == 1
    assert dict(hits)["/version"] == "Bearer sk-test"
    assert facts.version_profile.server_version == "0.11.2" and facts.reported_version == "0.11.2"
    assert facts.max_model_len == 4096 and facts.model == "m"
    assert said[0][0] is EventType.SERVER_VERSION and said[0][1]["server_version"] == "0.11.2"


def test_a_version_the_profile_cannot_parse_still_names_the_build():
    facts, hits, said = asyncio.run(_facts_from({"version": "nightly-abc"}))
    assert [p for p, _ in hits].count("/version") == 1
    assert facts.version_profile.server_version is None and facts.reported_version == "nightly-abc"
    assert [t for t, _ in said] == [EventType.SERVER_VERSION, EventType.WARNING]


def test_a_redirected_version_is_not_followed_and_is_said():
    facts, hits, said = asyncio.run(_facts_from(None, status=302))
    assert [p for p, _ in hits] == ["/version", "/v1/models"]
    assert facts.reported_version is None and facts.version_profile.server_version is None
    assert said[0][0] is EventType.WARNING and said[0][1]["message"].startswith("GET /version: ")
    assert said[1][0] is EventType.SERVER_VERSION
