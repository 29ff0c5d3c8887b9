"""Hypothesis strategies over the chaos server's grammar (tests/chaos/server.py).

``scenarios()`` draws a whole night: the server's spec (phases of completion
behaviours, /metrics, /health; /version, /v1/models, the log) plus how the
harness meets it (``target``: attached by URL, attached with its PID,
launched by command, launched by a command that daemonizes (``setsid -f``),
or attached through a TCP proxy), where secrets are
planted in the harness's own config, and which detector thresholds the run
uses ("tight": a bound of seconds the short run can exercise; "default": the
shipped thresholds, whose start-up grace must never hide a server that did
nothing). ``well_behaved(scenario)`` says which scenarios must pass.

The first alternative of every ``one_of`` is the benign one, so hypothesis's
simplest example is a working server and shrinking heads towards one.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from chaos.server import FORMULAS, SECRET_SHAPES, WRONG_TYPES, phase, spec

TARGETS = ("attached", "attached_pid", "launched", "proxy", "launched_daemon")
# Where the harness's own config carries the secret (launch_* only for launched targets).
CONFIG_SECRETS = ("api_key_env", "base_url_userinfo", "launch_flag_api_key", "launch_flag_db_url",
                  "launch_env_db_url", "launch_env_hf_token")

_secret = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=12, max_size=12).map(
    lambda s: "chaosS3CRET" + s)


def _kind(name: str, **fields: st.SearchStrategy) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"kind": st.just(name), **fields})


def completion() -> st.SearchStrategy[dict[str, Any]]:
    """One completion request's behaviour."""
    options = st.one_of(
        _kind("normal", tokens=st.integers(1, 16), token_delay_s=st.sampled_from([0.0, 0.005, 0.02])),
        _kind("hang"),
        _kind("headers_then_hang"),
        _kind("trickle", interval_s=st.sampled_from([0.5, 1.0, 3.0]), tokens=st.integers(1, 8)),
        _kind("slow", token_interval_s=st.sampled_from([1.0, 2.5, 4.0]), tokens=st.integers(20, 60)),
        _kind("zero_tokens", finish=st.sampled_from(["stop", "length"])),
        _kind("keepalive", interval_s=st.sampled_from([0.2, 1.0])),
        _kind("http_error", status=st.sampled_from([400, 404, 429, 500, 502, 503]),
              body=st.sampled_from(["empty", "html", "error_object", "json_garbage"])),
        _kind("no_done", tokens=st.integers(1, 8), end=st.sampled_from(["eof", "hold"])),
        _kind("reset", after_tokens=st.integers(0, 4)),
        _kind("redirect", status=st.sampled_from([301, 302, 303, 307, 308]), to=st.sampled_from(["sink", "self"])),
        _kind("wrong_types", where=st.sampled_from(WRONG_TYPES), tokens=st.integers(2, 8)),
        _kind("deep_nesting", depth=st.sampled_from([1_000, 100_000]), where=st.sampled_from(["chunk", "usage"]),
              tokens=st.integers(2, 6)),
        _kind("huge_line", mb=st.sampled_from([2, 32]), newline=st.booleans()),
        _kind("html_200"),
    )
    return options


def metrics() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        _kind("normal"), _kind("no_kv"),
        _kind("reset"), _kind("backwards"), _kind("lying", per_scrape=st.sampled_from([50, 5000])),
        _kind("gzip_bomb", inflated_mb=st.sampled_from([256, 768])),
        _kind("deflate_bomb", inflated_mb=st.sampled_from([256, 768])),
        _kind("huge_line", mb=st.sampled_from([8, 64])),
        _kind("garbage"), _kind("hang"), _kind("trickle", interval_s=st.sampled_from([0.5, 2.0])),
        _kind("http_error", status=st.sampled_from([500, 404])), _kind("empty"),
        _kind("redirect", status=st.sampled_from([302, 307])),
    )


def health() -> st.SearchStrategy[dict[str, Any]]:
    # "ok" is also the lie: 200 whatever the completions do.
    # fail, hang, flap and redirect begin with the load; never_ready is a server never ready (exit 3).
    return st.one_of(_kind("ok"), _kind("fail", status=st.sampled_from([500, 503])), _kind("hang"), _kind("flap"),
                     _kind("redirect"), _kind("never_ready", status=st.sampled_from([500, 503])))


def phases() -> st.SearchStrategy[list[dict[str, Any]]]:
    def one(duration: st.SearchStrategy) -> st.SearchStrategy[dict[str, Any]]:
        return st.builds(lambda d, c, m, h: phase(duration_s=d, completions=c, metrics=m, health=h), duration,
                         st.lists(completion(), min_size=1, max_size=3), metrics(), health())

    last = one(st.none())
    # A night that works, then does something else (stall, errors, ...) for the rest.
    return st.one_of(last.map(lambda p: [p]),
                     st.tuples(one(st.sampled_from([1.0, 2.0, 3.0])), last).map(list))


def version() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        _kind("normal"),
        _kind("formula", which=st.integers(0, len(FORMULAS) - 1)),
        _kind("secret", shape=st.sampled_from(SECRET_SHAPES)),
        _kind("huge", chars=st.sampled_from([1 << 16, 1 << 22])),
        _kind("wrong_type", value=st.sampled_from([[0, 11, 0], 11, None, {"v": "0.11"}, True])),
        _kind("deep", depth=st.sampled_from([1_000, 100_000])),
        _kind("missing"), _kind("http_404"), _kind("hang"),
    )


def models() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(_kind("normal"), _kind("max_len_str"), _kind("max_len_negative"),
                     _kind("deep", depth=st.sampled_from([1_000, 100_000])), _kind("extra_junk"))


def log() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "interval_s": st.just(0.5),
        "secret_shapes": st.lists(st.sampled_from(SECRET_SHAPES), unique=True, max_size=3),
        "signature": st.sampled_from([None, None, "engine_dead", "shm"]),
        "signature_after": st.integers(1, 6),
        "huge_line_mb": st.sampled_from([0, 0, 4, 64]),
    })


def specs() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda seed, secret, ph, v, m, lg: spec(seed=seed, secret=secret, phases=ph, version=v,
                                                              models=m, log=lg),
                     st.integers(0, 2**31 - 1), _secret, phases(), version(), models(), log())


def scenarios() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "spec": specs(),
        "target": st.sampled_from(TARGETS),
        "config_secrets": st.lists(st.sampled_from(CONFIG_SECRETS), unique=True, max_size=3),
        "detector": st.sampled_from(["tight", "default"]),
        # proxy only: by URL alone the harness must refuse the forwarder as the kill
        # target (exit 3); with find_root_by_port off it runs with no kill target.
        "find_root_by_port": st.booleans(),
    })


# What must still pass: the server does the work; anything else it does is cosmetic
# (a /version string, secrets in its log, a proxy in front).
_BENIGN_VERSION = ("normal", "formula", "secret", "missing", "http_404", "wrong_type")


def well_behaved(scenario: dict[str, Any]) -> bool:
    s = scenario["spec"]
    for p in s["phases"]:
        if any(c["kind"] != "normal" for c in p["completions"]):
            return False
        # no_kv: a proxy's or an allowlisted page, vLLM's less KV usage; the server still works.
        if p["metrics"]["kind"] not in ("normal", "no_kv") or p["health"]["kind"] != "ok":
            return False
    log_cfg = s.get("log") or {}
    if log_cfg.get("signature") or log_cfg.get("huge_line_mb"):
        return False
    return s["version"]["kind"] in _BENIGN_VERSION and s["models"]["kind"] == "normal"


def refusable(scenario: dict[str, Any]) -> bool:
    """A config the harness may refuse with one line (exit 2) instead of running:
    credentials in the URL (the issue allows moving them to a header or
    refusing), a launch command that daemonizes (followed by its marker, or
    refused; exit 3 is also allowed for it). A forwarder is ``forwarder_refused``."""
    return "base_url_userinfo" in scenario["config_secrets"] or scenario["target"] == "launched_daemon"


def forwarder_refused(scenario: dict[str, Any]) -> bool:
    """A proxy in front, given by URL alone with the listener as the kill target:
    CONTRACTS' "in doubt, refuse with exit 3 rather than guess"."""
    return scenario["target"] == "proxy" and scenario.get("find_root_by_port", True)

