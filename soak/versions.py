"""What soak knows of each vLLM version, from the checked-in upstream facts.

``soak/upstream/vllm-<V>.json`` are extracted from the released wheels by
``scripts/upstream-facts`` (run by hand). The harness reads the server's
``GET /version`` and takes the facts of the covered version that applies
(``profile_for``): which metric families exist, the finish reasons, whether
``stream_options.include_usage`` defaults on, whether the cached-token count is
left out when nothing was cached, which RPC timeouts are logged, whether log
prefixes are coloured. A version not covered gets a warning naming the ones
that are; the nearest covered version below it (same minor first) stands in.

Pure: no I/O beyond reading the package's own JSON files once.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

DEFAULT_BASIS = "0.11.2"  # the version the nightly box runs; used when /version says nothing


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``0.11.2.dev278+gccfeb3a8`` -> (0, 11, 2); None for anything without a leading x.y."""
    if not isinstance(text, str):
        return None
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(g) for g in match.groups(default="0"))


@functools.lru_cache(maxsize=None)
def upstream_facts() -> Mapping[str, Mapping[str, Any]]:
    """Every checked-in vLLM fixture, by version string."""
    out: dict[str, Mapping[str, Any]] = {}
    for entry in resources.files("soak.upstream").iterdir():
        name = entry.name
        if name.startswith("vllm-") and name.endswith(".json"):
            out[name[len("vllm-"):-len(".json")]] = json.loads(entry.read_text(encoding="utf-8"))
    return dict(sorted(out.items(), key=lambda kv: parse_version(kv[0]) or ()))


def covered_versions() -> tuple[str, ...]:
    return tuple(upstream_facts())


@dataclass(frozen=True)
class VllmProfile:
    """How a vLLM version behaves where versions differ."""

    server_version: str | None  # what GET /version said (None: no answer)
    basis: str  # the covered version whose facts apply
    covered: bool  # server_version's x.y.z is one soak has facts for
    metric_families: frozenset[str]
    finish_reasons: tuple[str, ...]
    include_usage_default: bool
    cached_tokens_omitted_when_zero: bool
    rpc_timeout_methods: tuple[str, ...]
    ansi_log_prefix: bool
    worker_groups: tuple[str, ...]

    def exposes(self, family: str) -> bool:
        return family in self.metric_families

    @property
    def warning(self) -> str | None:
        covered = ", ".join(covered_versions())
        if self.server_version is None:
            return f"the server did not say its vLLM version (GET /version); assuming {self.basis} (covered: {covered})"
        if not self.covered:
            return (f"vLLM {self.server_version} is not covered by soak's upstream facts (covered: {covered}); "
                    f"reading it as {self.basis}")
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "server_version": self.server_version,
            "basis": self.basis,
            "covered": self.covered,
            "covered_versions": list(covered_versions()),
            "warning": self.warning,
            "include_usage_default": self.include_usage_default,
            "cached_tokens_omitted_when_zero": self.cached_tokens_omitted_when_zero,
            "finish_reasons": list(self.finish_reasons),
            "rpc_timeout_methods": list(self.rpc_timeout_methods),
        }


def _basis_for(version: tuple[int, ...] | None) -> str:
    facts = upstream_facts()
    keyed = [(parse_version(v) or (), v) for v in facts]
    if version is None:
        return DEFAULT_BASIS if DEFAULT_BASIS in facts else keyed[-1][1]
    same_minor = [(k, v) for k, v in keyed if k[:2] == version[:2] and k <= version]
    if same_minor:
        return max(same_minor)[1]
    same_minor = [(k, v) for k, v in keyed if k[:2] == version[:2]]
    if same_minor:
        return min(same_minor)[1]
    below = [(k, v) for k, v in keyed if k <= version]
    return max(below)[1] if below else keyed[0][1]


@functools.lru_cache(maxsize=64)
def profile_for(server_version: str | None) -> VllmProfile:
    parsed = parse_version(server_version)
    basis = _basis_for(parsed)
    facts = upstream_facts()[basis]
    covered = parsed is not None and any(parse_version(v) == parsed for v in covered_versions())
    usage = facts.get("usage", {})
    logs = facts.get("logs", {})
    return VllmProfile(
        server_version=server_version.strip() if isinstance(server_version, str) else None,
        basis=basis,
        covered=covered,
        metric_families=frozenset(facts.get("metrics", {})),
        finish_reasons=tuple(facts.get("finish_reasons") or ()),
        include_usage_default=bool(usage.get("include_usage_default")),
        cached_tokens_omitted_when_zero=bool(usage.get("cached_tokens_omitted_when_zero")),
        rpc_timeout_methods=tuple(logs.get("rpc_timeout", {}).get("methods") or ()),
        ansi_log_prefix=bool(logs.get("process_prefix", {}).get("cyan")),
        worker_groups=tuple(facts.get("titles", {}).get("worker_parts") or ()),
    )


def version_from_body(body: Any) -> str | None:
    """The version in a ``GET /version`` answer (``{"version": "0.11.2"}``), or None."""
    if isinstance(body, Mapping):
        value = body.get("version")
        if isinstance(value, str) and parse_version(value) is not None and len(value) <= 100:
            return value
    return None


def cached_tokens(usage: Any, *, profile: VllmProfile | None, details_enabled: bool | None) -> int | None:
    """The cached prompt tokens a usage object reports, or None when unknown.

    vLLM 0.11.x leaves ``prompt_tokens_details`` out when no token was cached:
    a missing field is 0 when ``--enable-prompt-tokens-details`` is known to be
    on, and unknown otherwise (also unknown when the flag is known off, and on
    versions that always write the field when it is on).
    """
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        value = details.get("cached_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if value is not None:
            return None
    if details_enabled and (profile is None or profile.cached_tokens_omitted_when_zero):
        return 0
    return None


class CachedTokensReader:
    """``cached_tokens`` for one server life, learning its details flag.

    Invariant: a vLLM server that has sent ``prompt_tokens_details`` on any
    response since it (re)started has ``--enable-prompt-tokens-details`` on, so
    on a version that leaves the field out when nothing was cached (0.11.x) a
    later response without it means 0 cached, not unknown. ``restarted()``
    forgets what was learned (a new server life may run with other flags); the
    configured knowledge (``details_enabled``) stays."""

    def __init__(self, *, profile: VllmProfile | None, details_enabled: bool | None) -> None:
        self.profile = profile
        self.configured = details_enabled
        self.seen_details = False

    @property
    def details_enabled(self) -> bool | None:
        return True if self.seen_details else self.configured

    def __call__(self, usage: Any) -> int | None:
        if isinstance(usage, Mapping) and isinstance(usage.get("prompt_tokens_details"), Mapping):
            value = cached_tokens(usage, profile=self.profile, details_enabled=self.details_enabled)
            if value is not None:
                self.seen_details = True
            return value
        return cached_tokens(usage, profile=self.profile, details_enabled=self.details_enabled)

    def restarted(self) -> None:
        self.seen_details = False
