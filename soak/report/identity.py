"""What a recorded run ran, read back for ``soak compare``: the target, the
workload, the served model, the layout and the build.

Two runs that differ in target, workload, model or layout are two experiments:
a "worse" between them measures that difference, not the candidate's change, so
compare names the differences and gives no verdict (``soak.report.compare``). A
build that differs is what an A/B is for: it is named, never held against the pair.

Each fact is read from the run directory's own records, what the run saw before
what it was asked: events.jsonl's ``run_started``, ``target_ready`` and ``build``
events, config.yaml (the resolved config), plan.json, and summary.json where the
events lack one. A fact no file records is ``None`` ("not recorded"), never a
difference. A field of the wrong type is one ``ConfigError`` naming the file and
the field (exit 2): read as absent, it would make two different runs look alike.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import numpy as np

from soak.errors import ConfigError
from soak.events import EventType
from soak.records import TargetKind
from soak.report.rundir import RunData
from soak.samples import GpuSource
from soak.store.rundir import RunDir
from soak.store.store import CONFIG, EVENTS, PLAN, SUMMARY


class Aspect(str, Enum):
    TARGET = "target"
    WORKLOAD = "workload"
    MODEL = "model"
    LAYOUT = "layout"
    BUILD = "build"


# The aspects that make two runs different experiments. The build is left out on
# purpose: two builds on one setup are what an A/B compares.
INCOMPARABLE: tuple[Aspect, ...] = (Aspect.TARGET, Aspect.WORKLOAD, Aspect.MODEL, Aspect.LAYOUT)

# The load's settings that shape the traffic (a run's length, drain and timeouts do not:
# rates compare across lengths).
LOAD_SHAPE = ("mode", "concurrency", "rate", "burstiness")

# More workload fields than this that differ are counted, not listed: a second
# workload file would otherwise fill the screen.
MAX_WORKLOAD_LINES = 5
# config.yaml is bounded when read; these bound what one run adds to compare's output.
MAX_WORKLOAD_LEAVES = 2000
MAX_VALUE_CHARS = 120  # a value in a line; compare matches and the JSON keeps the whole


@dataclass(frozen=True)
class RunIdentity:
    """One run's facts, by aspect: field -> value as text, ``None`` where no file
    records it. A field that does not apply to the run's kind of target is absent
    (a simulator has no address of its own: the harness picks a port each run)."""

    target: Mapping[str, str | None]
    workload: Mapping[str, str]  # config.yaml's workload (and load.*) leaves, by dotted path
    workload_digest: str | None
    model: str | None
    layout: Mapping[str, str | None]
    build: Mapping[str, str | None]

    def facts(self, aspect: Aspect) -> Mapping[str, str | None]:
        if aspect is Aspect.MODEL:
            return {"": self.model}
        return {Aspect.TARGET: self.target, Aspect.WORKLOAD: self.workload, Aspect.LAYOUT: self.layout,
                Aspect.BUILD: self.build}[aspect]

    def to_json(self) -> dict[str, Any]:
        # The workload's leaves are many: the digest stands for them (a difference lists the leaves).
        return {"target": dict(self.target), "workload": {"digest": self.workload_digest}, "model": self.model,
                "layout": dict(self.layout), "build": dict(self.build)}


@dataclass(frozen=True)
class Mismatch:
    """One fact the two runs record differently (A's value, then B's); ``None``
    on one side where only the other run records it."""

    aspect: Aspect
    field: str  # "" for the model, which is one fact
    a: str | None
    b: str | None

    @property
    def known(self) -> bool:
        """Both runs record the fact, and they differ (a one-sided fact is unknown, not different)."""
        return self.a is not None and self.b is not None

    def line(self) -> str:
        what = f"{self.aspect.value} {self.field}" if self.field else self.aspect.value
        a, b = (_cut(v) if v is not None else "not recorded" for v in (self.a, self.b))
        return f"{'differs' if self.known else 'unknown'}: {what} {a} vs {b}"

    def to_json(self) -> dict[str, Any]:
        return {"aspect": self.aspect.value, "field": self.field, "a": self.a, "b": self.b, "known": self.known,
                "line": self.line()}


# -- the differences -------------------------------------------------------------------


def differences(a: RunIdentity, b: RunIdentity) -> tuple[Mismatch, ...]:
    """What the two runs record differently, aspect by aspect (target, workload,
    model, layout, build), each aspect's fields in their order."""
    out: list[Mismatch] = []
    for aspect in Aspect:
        found = list(_mismatches(aspect, a.facts(aspect), b.facts(aspect)))
        if aspect is Aspect.WORKLOAD:
            found = _capped(found, a.workload_digest, b.workload_digest)
        out.extend(found)
    return tuple(out)


def _mismatches(aspect: Aspect, a: Mapping[str, str | None], b: Mapping[str, str | None]) -> Iterator[Mismatch]:
    # Only the fields both runs have: one an older soak did not write is not a difference.
    for field in [f for f in a if f in b]:
        if a[field] != b[field]:
            yield Mismatch(aspect, field, a[field], b[field])


def _capped(found: list[Mismatch], digest_a: str | None, digest_b: str | None) -> list[Mismatch]:
    if len(found) <= MAX_WORKLOAD_LINES:
        return found
    shown = found[:MAX_WORKLOAD_LINES - 1]
    more = len(found) - len(shown)
    return [*shown, Mismatch(Aspect.WORKLOAD, f"and {more} more fields, digest", digest_a or "?", digest_b or "?")]


def incomparable(found: Sequence[Mismatch]) -> tuple[Aspect, ...]:
    """The aspects, of INCOMPARABLE, in which the runs are known to differ."""
    differing = {m.aspect for m in found if m.known}
    return tuple(a for a in INCOMPARABLE if a in differing)


# -- reading one run -------------------------------------------------------------------


def identify(run: RunData) -> RunIdentity:
    """The run's facts from its directory (see the module's docstring); a field
    of the wrong type is a ``ConfigError`` naming the file and the field."""
    files = _Files(run)
    config = files.config()
    target = files.target_section(config)
    leaves, digest = _workload(config, run.plan, files)
    return RunIdentity(target=_target(target, files), workload=leaves, workload_digest=digest,
                       model=_model(target, files), layout=_layout(target, run, files), build=_build(config, files))


class _Files:
    """The run's records as identify reads them: each event it needs once, and
    the one rule for a value of the wrong type (a ConfigError naming file and field)."""

    def __init__(self, run: RunData) -> None:
        self.path = run.path
        self.events: dict[str, Mapping[str, Any]] = {}
        for event in run.events:
            kind = event.get("type")
            if kind in (EventType.RUN_STARTED, EventType.TARGET_READY, EventType.RUN_CREATED):
                self.events.setdefault(str(kind), event)  # the first: a restart's are the same server's
            elif kind == EventType.BUILD:
                self.events[str(kind)] = event  # the last: the one the summary keeps
        self._summary: Any = None
        self._summary_read = False

    def event(self, kind: EventType, field: str) -> Any:
        return (self.events.get(kind.value) or {}).get(field)

    def config(self) -> Mapping[str, Any] | None:
        """config.yaml as recorded; None where the run has none. One that is there
        but unreadable is an error: without it the pair cannot be told apart."""
        run_dir = RunDir(self.path)
        if run_dir.config_unreadable:
            raise ConfigError("cannot be read (not UTF-8, not a YAML mapping, or past a bound): compare cannot "
                              "tell what the run's target, workload and layout were", path=self.path / CONFIG)
        return run_dir.config if run_dir.config_bytes is not None else None

    def summary(self, field: str) -> Any:
        """summary.json's ``field`` as the run's end wrote it (for a run whose events lack it)."""
        if not self._summary_read:
            self._summary_read = True
            raw = RunDir(self.path).summary_json()
            self._summary = raw if isinstance(raw, Mapping) else None
        return self._summary.get(field) if self._summary is not None else None

    def target_section(self, config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        if config is None:
            return None
        target = config.get("target")
        if target is None:
            return {"kind": TargetKind.SIMULATOR.value}  # no target section: the simulator, as the run read it
        return self.mapping(target, CONFIG, "target")

    def mapping(self, value: Any, file: str, field: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.wrong(file, field, f"must be a mapping, got {_type(value)}")
        return value

    def text(self, value: Any, file: str, field: str) -> str | None:
        """A recorded value as one line of text: None stays None; a list or mapping is wrong."""
        if value is None:
            return None
        if isinstance(value, (Mapping, list, tuple)):
            raise self.wrong(file, field, f"must be a single value, got {_type(value)}")
        return _render(value)

    def count(self, value: Any, file: str, field: str) -> int | None:
        if value is None:
            return None
        if type(value) is int and value >= 1:
            return value
        if isinstance(value, str) and value.isdigit() and int(value) >= 1:
            return int(value)  # a launch flag's value
        raise self.wrong(file, field, f"must be a whole number of at least 1, got {_shown(value)}")

    def wrong(self, file: str, field: str, message: str) -> ConfigError:
        return ConfigError(message, path=self.path / file, field=field)


def _target(target: Mapping[str, Any] | None, files: _Files) -> dict[str, str | None]:
    kind = (files.text(target.get("kind", TargetKind.SIMULATOR.value), CONFIG, "target.kind")
            if target is not None else None)
    kind = kind or files.event(EventType.RUN_STARTED, "target") or files.event(EventType.RUN_CREATED, "target")
    out: dict[str, str | None] = {"kind": kind}
    if kind == TargetKind.SIMULATOR:
        return out  # its address is a port the harness picks each run: no fact about the target
    url = files.text(target.get("base_url"), CONFIG, "target.base_url") if target is not None else None
    if url is None:
        url = files.text(files.event(EventType.RUN_STARTED, "base_url"), EVENTS, "run_started.base_url")
    if url is None:
        url = files.text(files.event(EventType.TARGET_READY, "base_url"), EVENTS, "target_ready.base_url")
    out["base_url"] = _address(url) if url is not None else None
    if kind == TargetKind.LAUNCHED:
        command = _command(target, files)
        out["command"] = launch_program(command) if command is not None else None
    return out


def _command(target: Mapping[str, Any] | None, files: _Files) -> list[str] | None:
    value = target.get("command") if target else None
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:  # an unclosed quote
            raise files.wrong(CONFIG, "target.command", f"cannot be split into arguments: {exc}") from exc
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return value
    raise files.wrong(CONFIG, "target.command", f"must be a list of strings, got {_type(value)}")


_PYTHON = re.compile(r"python[0-9.]*")


def launch_program(command: Sequence[str]) -> str:
    """The server program a launch command runs: its words before the first
    flag, the executable without its folder and the model left out. The folder
    (which venv's vllm), the model and the flags are the build's, the model's and
    the layout's facts: the same program from two installs is one target."""
    words: list[str] = []
    skip_next = False
    for arg in command:
        if skip_next:
            skip_next = False
            if not arg.startswith("-"):
                continue
        if arg.startswith("-"):
            if words and words[-1] == "python":  # the interpreter's own switches (-u, -X dev ...), and -m MODULE
                if arg == "-m":
                    words.append(arg)
                skip_next = arg in ("-X", "-W")  # a switch's value is no word of the program
                continue
            break
        if "=" in arg and (not words or words == ["env"]):
            continue  # `env NAME=VALUE ...`'s assignments
        word = Path(arg).name if not words or words == ["env"] else arg
        words.append("python" if _PYTHON.fullmatch(word) else word)
        if word == "serve":
            skip_next = True  # `vllm serve MODEL`: the model is its own fact
    return " ".join(words) or "?"


def _address(url: str) -> str:
    """scheme://host:port/path: no userinfo, query or fragment (never a secret in compare's output)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port that is no number: the text as recorded, less what could be a secret
        return url.split("@")[-1].split("?")[0]
    if not parts.scheme or not host:
        return url.split("@")[-1].split("?")[0]
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


def _model(target: Mapping[str, Any] | None, files: _Files) -> str | None:
    """The model the run's requests named (run_started: the config's, else the
    first the server listed), else what the build event, summary.json or the
    config say."""
    candidates = (
        (files.event(EventType.RUN_STARTED, "model"), EVENTS, "run_started.model"),
        (files.event(EventType.BUILD, "served_model"), EVENTS, "build.served_model"),
        (files.event(EventType.BUILD, "model"), EVENTS, "build.model"),
        (files.summary("model"), SUMMARY, "model"),
        (target.get("model") if target else None, CONFIG, "target.model"),
    )
    for value, file, field in candidates:
        text = files.text(value, file, field)
        if text is not None:
            return text
    if target and target.get("kind", TargetKind.SIMULATOR.value) == TargetKind.SIMULATOR:
        sim = target.get("sim")
        if isinstance(sim, Mapping):
            return files.text(sim.get("model"), CONFIG, "target.sim.model")
    served = files.event(EventType.TARGET_READY, "models")
    if isinstance(served, list) and served:
        return files.text(served[0], EVENTS, "target_ready.models")
    return None


def _layout(target: Mapping[str, Any] | None, run: RunData, files: _Files) -> dict[str, str | None]:
    pp, tp = _parallel(target, files) if target is not None else (None, None)
    return {"pipeline parallel": None if pp is None else str(pp),
            "tensor parallel": None if tp is None else str(tp),
            "GPUs": None if (n := gpus_read(run)) is None else str(n)}


def _parallel(target: Mapping[str, Any], files: _Files) -> tuple[int | None, int | None]:
    """pp and tp as the run took them (soak.target.config.target_layout, its
    defaults included); for a config this soak's schema no longer reads, what it
    says in so many words."""
    from pydantic import TypeAdapter

    from soak.target.config import TargetConfig, command_flag, target_layout

    try:
        layout = target_layout(TypeAdapter(TargetConfig).validate_python(dict(target)))
        return layout.pp_size, layout.tp_size
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        pass
    pp = files.count(target.get("pp_size"), CONFIG, "target.pp_size")
    tp = files.count(target.get("tp_size"), CONFIG, "target.tp_size")
    sim = target.get("sim")
    if pp is None and isinstance(sim, Mapping):
        pp = files.count(sim.get("pp_size"), CONFIG, "target.sim.pp_size")
    command = _command(target, files)
    if command is not None:
        if pp is None:
            pp = files.count(command_flag(command, ("--pipeline-parallel-size", "-pp")), CONFIG, "target.command")
        if tp is None:
            tp = files.count(command_flag(command, ("--tensor-parallel-size", "-tp")), CONFIG, "target.command")
    return pp, tp


def gpus_read(run: RunData) -> int | None:
    """How many GPUs the run's probes read at least once; None where none were
    read, or the readings were stages' CPU (no GPUs at all)."""
    util = run.gpu_util
    if run.gpu_source is GpuSource.STAGE_CPU or util.ndim != 2 or util.size == 0:
        return None
    seen = int(np.isfinite(util).any(axis=0).sum())
    return seen or None


def _build(config: Mapping[str, Any] | None, files: _Files) -> dict[str, str | None]:
    """The build event's label and identity (soak.history.build), else
    summary.json's ``build``, else the config's label alone. A label left out
    where the run records its build is "none", a fact (a vLLM version left out
    is one /version did not give: not recorded)."""
    event = files.events.get(EventType.BUILD.value)
    if event is not None:
        source, file, prefix = event, EVENTS, "build."
    elif isinstance(files.summary("build"), Mapping):
        source, file, prefix = files.summary("build"), SUMMARY, "build."
    else:
        if config is None:
            return {"label": None}
        return {"label": files.text(config.get("build"), CONFIG, "build") or "none"}
    out = {name: files.text(source.get(name), file, prefix + name) for name in ("label", "vllm_version",
                                                                                "launch_digest")}
    return {**out, "label": out["label"] or "none"}


def _workload(config: Mapping[str, Any] | None, plan: Mapping[str, Any] | None,
              files: _Files) -> tuple[dict[str, str], str | None]:
    """config.yaml's workload section and the load's shape as dotted leaves
    (``output_tokens.median``, ``load.concurrency``) with a digest of them; for a
    run without config.yaml (or without those sections), plan.json's workload
    name and concurrency."""
    workload = config.get("workload") if config is not None else None
    load = config.get("load") if config is not None else None
    leaves: dict[str, str] = {}
    if isinstance(workload, str):
        leaves["source"] = _render(workload)
    elif workload is not None:
        _flatten(files.mapping(workload, CONFIG, "workload"), "", leaves)
    if load is not None:
        shape = files.mapping(load, CONFIG, "load")
        for name in LOAD_SHAPE:
            if name in shape:
                leaves[f"load.{name}"] = files.text(shape[name], CONFIG, f"load.{name}") or "null"
    if plan is not None:
        if "kind" not in leaves and plan.get("workload") is not None:
            leaves["kind"] = files.text(plan.get("workload"), PLAN, "workload") or "null"
        if "load.concurrency" not in leaves and plan.get("concurrency") is not None:
            leaves["load.concurrency"] = files.text(plan.get("concurrency"), PLAN, "concurrency") or "null"
    if not leaves:
        return {}, None
    digest = hashlib.sha256(json.dumps(leaves, sort_keys=True).encode("utf-8")).hexdigest()[:12]
    return leaves, digest


def _flatten(value: Mapping[str, Any], prefix: str, out: dict[str, str], depth: int = 0) -> None:
    for key, item in value.items():
        if len(out) >= MAX_WORKLOAD_LEAVES:
            return
        path = f"{prefix}{key}"
        if isinstance(item, Mapping) and item and depth < 16:
            _flatten(item, path + ".", out, depth + 1)
        else:
            out[path] = _render(item)


def _render(value: Any) -> str:
    """A recorded value as compare shows and matches it: 190000.0 and 190000 are one number."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    try:  # a list (or a mapping deeper than _flatten goes): one value, in canonical JSON
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _cut(text: str) -> str:
    """One value as a line shows it (the JSON keeps it whole)."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def _type(value: Any) -> str:
    return {dict: "a mapping", list: "a list", tuple: "a list"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    return repr(value)[:40]


__all__ = ["INCOMPARABLE", "Aspect", "Mismatch", "RunIdentity", "differences", "gpus_read", "identify",
           "incomparable", "launch_program"]
