"""JSON from outside has finite numbers only: for any JSON text holding NaN,
Infinity, -Infinity or a number that overflows a float (1e999), ``loads_json``
raises ``InputRejected``, never returns inf/nan for a later ``int()`` to turn
into an OverflowError traceback; finite numbers parse as before. The /tokenize
counter turns such a body into its TransportError."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bounds import Fetched, InputRejected, loads_json
from soak.errors import TransportError
from soak.workload import counters

non_finite = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "1.5E+309", "2e0309",
                              "1" + "0" * 310 + ".5", "-" + "9" * 400 + ".0e1", "1" * 250 + "e60"])
finite = st.floats(allow_nan=False, allow_infinity=False)
values = st.recursive(st.none() | st.booleans() | st.integers() | finite | st.text(max_size=6),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                      max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(value=values, bad=non_finite, where=st.sampled_from(["list", "dict", "top", "deep"]))
def test_any_json_with_a_non_finite_number_is_input_rejected(value, bad, where) -> None:
    body = json.dumps(value)
    text = {"list": f"[{body}, {bad}]", "dict": f'{{"v": {body}, "n": {bad}}}', "top": bad,
            "deep": f'[[[{{"count": {bad}}}]], {body}]'}[where]
    with pytest.raises(InputRejected):
        loads_json(text)
    with pytest.raises(InputRejected):
        loads_json(text.encode())


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_finite_json_parses_as_before(value) -> None:
    text = json.dumps(value)
    assert loads_json(text) == json.loads(text)


def test_the_tokenize_counter_turns_an_infinite_count_into_a_transport_error(monkeypatch) -> None:
    for body in (b'{"count": 1e999}', b'{"count": NaN}', b'{"count": Infinity}'):
        async def fake_fetch(*_a, body=body, **_k):
            return Fetched(200, {}, body)

        monkeypatch.setattr(counters, "fetch", fake_fetch)
        counter = counters.TargetCounter("http://127.0.0.1:9", "m", session=object())
        with pytest.raises(TransportError, match="/tokenize"):
            asyncio.run(counter.count_text("hi"))
