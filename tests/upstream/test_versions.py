"""Version awareness: cached-token semantics and the /version answer (tests/run/test_fidelity_run.py runs it)."""

from __future__ import annotations

import pytest

from soak.versions import cached_tokens, profile_for, version_from_body


@pytest.mark.parametrize("version,usage,enabled,expected", [
    ("0.11.2", {"prompt_tokens": 9}, True, 0),          # 0.11.x omits it at 0: the flag is on, so 0
    ("0.11.2", {"prompt_tokens": 9}, None, None),       # flag unknown (attached): unknown, not 0
    ("0.11.2", {"prompt_tokens": 9}, False, None),      # flag off: never reported
    ("0.11.2", {"prompt_tokens_details": {"cached_tokens": 256}}, None, 256),
    ("0.33.0", {"prompt_tokens": 9}, True, None),       # 0.33 writes the field when on: missing is unknown
    ("0.33.0", {"prompt_tokens_details": {"cached_tokens": 0}}, True, 0),
    ("0.11.2", {"prompt_tokens_details": {"cached_tokens": "12"}}, True, None),  # hostile bytes: unknown
    ("0.11.2", {"prompt_tokens_details": None}, True, 0),
    ("0.11.2", "not a mapping", True, None),
])
def test_cached_tokens(version, usage, enabled, expected):
    assert cached_tokens(usage, profile=profile_for(version), details_enabled=enabled) == expected


def test_version_body_is_checked():
    assert version_from_body({"version": "0.11.2"}) == "0.11.2"
    for bad in ({"version": 11}, {"version": "x" * 500}, {"v": "0.11.2"}, ["0.11.2"], None, {"version": "latest"}):
        assert version_from_body(bad) is None
