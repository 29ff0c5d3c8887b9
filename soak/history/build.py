"""Which server build a run exercised: what ran, not only what it was called.

Two nights with the same flags and ``/version`` but another server script, NCCL
(``LD_LIBRARY_PATH``) or venv (``PYTHONPATH``) are two builds: swapping NCCL or a
venv is exactly how a fix is tried, and pooling them would credit one with the
other's nights. The ``build`` event (and summary.json's ``build``) records:

- the config's ``build:`` label (the user's name, kept as given), the vLLM version
  from ``/version``, the model and the served model (``/v1/models``);
- ``settings_digest``: what the config changes of the server and nothing that
  changes per night: a launched target's model and flags (in a canonical order,
  with the address flags ``--host``/``--port`` and secrets left out) and its
  ``VLLM_*``, ``TORCH_*``, ``NCCL_*``, ``CUDA_*`` environment (never recorded
  but as this digest); a simulated target's ``sim:`` section (its faults are its
  "bugs"); an attached target's model name; ``flags``: a launch's flags, readable;
- ``launch``: what a server the harness started ran (``soak.target.launch``: its
  executable and script with their sha256, the packages of its own interpreter,
  the NCCL libraries it can load, ``LD_LIBRARY_PATH`` and ``PYTHONPATH``, the
  model's revision); an attached server's says the rest is unknown;
- ``launch_digest``: ``identity_of`` all the above, the build's identity.

History groups nights by ``identity_of`` the recorded build, recomputed (never
the recorded digest trusted), so two runs that differ in any recorded fact are
two builds; a label that holds several is split (``group_keys``) and what differs
said (``label_splits``); a night from before soak read the launch joins its label's
one recorded build of its /version, else is its own (``pooled_identities``). Pure: the run reads ``/version`` once
(``soak.run.target_facts``) and the launch once (off the event loop), and records
the ``build`` event.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from soak.records import TargetKind

# Flags whose values differ per run or are secret: not part of the build.
_NOT_BUILD_FLAGS = frozenset({"--host", "--port", "--api-key", "--hf-token", "--token", "--uvicorn-log-level",
                              "--disable-log-requests", "--disable-log-stats"})
_BUILD_ENV_PREFIXES = ("VLLM_", "TORCH_", "NCCL_", "CUDA_")
_NOT_BUILD_ENV = ("TORCH_NCCL_DEBUG_INFO", "TORCH_FR_", "TORCH_NCCL_TRACE", "TORCH_NCCL_DUMP")
_NOT_BUILD_SIM = frozenset({"seed"})


def launch_signature(command: list[str]) -> dict[str, Any]:
    """Model and flags of a launch command, canonically ordered."""
    model = None
    flags: list[tuple[str, str | None]] = []
    args = list(command)
    # `vllm serve MODEL ...` / `python -m vllm.entrypoints.openai.api_server --model MODEL`
    if "serve" in args:
        i = args.index("serve")
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            model = args[i + 1]
        args = args[i + 2 if model else i + 1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq:
                value = None
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    value = args[i + 1]
                    i += 1
            if name == "--model" and model is None:
                model = value
            elif name not in _NOT_BUILD_FLAGS:
                flags.append((name, value))
        i += 1
    return {"model": model, "flags": sorted(flags, key=lambda f: (f[0], f[1] or ""))}


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def launch_flags(command: list[str]) -> list[str]:
    """The launch signature's flags as the build event records them: ``--name value``."""
    return [name if value is None else f"{name} {value}" for name, value in launch_signature(command)["flags"]]


def build_identity(config: Mapping[str, Any], *, vllm_version: str | None, served_model: str | None = None,
                   launch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``build`` event's fields from the redacted config, /version, the served
    model and ``launch`` (``soak.target.launch.read_launch``: what a server the
    harness started ran; None where it was not read). ``launch_digest`` is
    ``identity_of`` this very record, so history recomputes it from what was recorded."""
    target = config.get("target") or {}
    kind = target.get("kind", TargetKind.SIMULATOR.value)
    flags: list[str] | None = None
    if kind == TargetKind.LAUNCHED and isinstance(target.get("command"), list):
        basis: dict[str, Any] = launch_signature(target["command"])
        env = target.get("env") or {}
        basis["env"] = {k: v for k, v in sorted(env.items())
                        if k.startswith(_BUILD_ENV_PREFIXES) and not k.startswith(_NOT_BUILD_ENV)}
        model = basis["model"]
        flags = launch_flags(target["command"])
    elif kind == TargetKind.SIMULATOR:
        sim = target.get("sim") if isinstance(target.get("sim"), Mapping) else {}
        # The seed is the night's luck, not the simulated server: nights of one build draw their own.
        basis = {"sim": {k: v for k, v in sim.items() if k not in _NOT_BUILD_SIM}}
        model = target.get("model") or served_model
    else:
        model = target.get("model") or served_model
        basis = {"model": model}
    if launch is None:
        from soak.target.launch import attached_launch

        launch = attached_launch() if kind == TargetKind.ATTACHED else {"unknown": ["the launch was not read"]}
    label = config.get("build")
    record: dict[str, Any] = {
        "label": label,
        "vllm_version": vllm_version,
        "model": model,
        "served_model": served_model,
        # the config's side of the build (flags and VLLM_*/NCCL_* env, the sim: section): env
        # values are never recorded, only this digest of them (from the redacted config)
        "settings_digest": _digest({"kind": kind, **basis}),
        **({"flags": flags} if flags is not None else {}),
        "launch": dict(launch),
    }
    digest = identity_of(record)
    record["launch_digest"] = digest
    # "build", not "key": the redactor reads a value after a word like "key" as a secret
    record["build"] = build_key(label, vllm_version, digest)
    return record


# What of a recorded ``launch`` is the build: all but the notes of why a part is unknown
# (two nights that could not read the packages, for whatever reason, are alike in that).
_NOT_IDENTITY = frozenset({"unknown"})


def identity_of(build: Mapping[str, Any] | None) -> str:
    """The digest history groups nights by, recomputed from the recorded ``build``
    (never trusted from its ``launch_digest``): the settings digest, /version, the
    model and served model, and every recorded fact of the launch. A run recorded
    before soak read the launch (no ``launch``): its version and launch digest, as
    they were. Total: any JSON value gives a digest."""
    b = build if isinstance(build, Mapping) else {}
    launch = b.get("launch")
    try:
        if not isinstance(launch, Mapping):
            return _digest({"recorded_before_launch": True, "vllm_version": b.get("vllm_version"),
                            "launch_digest": b.get("launch_digest")})
        return _digest({"settings": b.get("settings_digest"), "vllm_version": b.get("vllm_version"),
                        "model": b.get("model"), "served_model": b.get("served_model"),
                        "launch": {k: v for k, v in launch.items() if k not in _NOT_IDENTITY}})
    except (TypeError, ValueError, RecursionError):  # a record no JSON reader gives: still one digest
        return hashlib.sha256(repr(b)[:100_000].encode("utf-8", "replace")).hexdigest()[:12]


def build_key(label: str | None, vllm_version: str | None, digest: str | None) -> str:
    """How nights are grouped: the label when given, else version and digest."""
    if label:
        return str(label)
    return f"vllm {vllm_version or '?'} · {digest or 'unknown'}"


def reported_version(body: Any) -> str | None:
    """``GET /version``'s ``version`` as the build records it (vLLM's own
    endpoint, read once by ``soak.run.target_facts``); None when the answer has none."""
    version = body.get("version") if isinstance(body, dict) else None
    return str(version)[:100] if isinstance(version, (str, int, float)) else None


# -- what differs between builds: a recorded build's facts, as history shows them ------------

_SHOWN_LIMIT = 160


def _shown(value: Any, *, none: str = "unknown") -> str:
    """A recorded value as one short line (a hostile record: anything but text is said as such)."""
    if value is None:
        return none
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return "unreadable"
    text = str(value)
    return text if len(text) <= _SHOWN_LIMIT else text[:_SHOWN_LIMIT] + "…"


def _file_shown(entry: Any) -> str:
    """``/venv/bin/python → /usr/bin/python3.11 (sha256 1a2b3c4d5e6f)``."""
    if entry is None:
        return "unknown"
    if not isinstance(entry, Mapping):
        return "unreadable"
    where = _shown(entry.get("path"))
    if isinstance(entry.get("resolved"), str) and entry.get("resolved") != entry.get("path"):
        where += f" → {_shown(entry['resolved'])}"
    sha = entry.get("sha256")
    return f"{where} (sha256 {sha[:12]})" if isinstance(sha, str) and sha else f"{where} (not digested)"


def identity_fields(build: Mapping[str, Any] | None) -> dict[str, str]:
    """The recorded build's facts by name, each one short line, in the order history
    lists them: what ``identity_of`` digests, readable, so that two builds under one
    label can be told apart by what differs (``label_splits``). Total."""
    b = build if isinstance(build, Mapping) else {}
    out = {"vLLM /version": _shown(b.get("vllm_version")), "model": _shown(b.get("model")),
           "served model": _shown(b.get("served_model"))}
    launch = b.get("launch")
    if not isinstance(launch, Mapping):
        out["launch"] = "not recorded (a run from before soak read what it launched)"
        out["launch digest"] = _shown(b.get("launch_digest"))
        return out
    model = launch.get("model") if isinstance(launch.get("model"), Mapping) else {}
    out["revision"] = _shown(model.get("revision"))
    sha = model.get("config_sha256")
    out["model config.json"] = f"sha256 {sha[:12]}" if isinstance(sha, str) and sha else "unknown"
    out["executable"] = _file_shown(launch.get("executable"))
    script = launch.get("script")
    if isinstance(script, Mapping) and script.get("module") is not None:
        out["script"] = f"-m {_shown(script.get('module'))}: {_file_shown(script)}"
    else:
        out["script"] = "none" if script is None and launch.get("executable") is not None else _file_shown(script)
    out["interpreter"] = _shown(launch.get("interpreter"), none="none")
    out["Python"] = _shown(launch.get("python"))
    packages = launch.get("packages")
    if isinstance(packages, Mapping):
        for name, version in packages.items():
            out[f"package {_shown(name)}"] = _shown(version, none="not installed")
    else:
        out["packages"] = "unknown"
    imported = launch.get("imported_from")
    if isinstance(imported, Mapping):
        for name, folder in imported.items():
            out[f"{_shown(name)} imported from"] = _shown(folder, none="not found")
    nccl = launch.get("nccl")
    for entry in nccl if isinstance(nccl, list) else []:
        if isinstance(entry, Mapping):
            out[f"NCCL via {_shown(entry.get('via'))}"] = _file_shown(entry)
    env = launch.get("env") if isinstance(launch.get("env"), Mapping) else {}
    for name in ("LD_LIBRARY_PATH", "PYTHONPATH"):
        out[name] = _shown(env.get(name), none="unset")
    flags = b.get("flags")
    if isinstance(flags, list):
        out["flags"] = _shown(" ".join(_shown(f) for f in flags)) if flags else "none"
    out["settings"] = "digest " + _shown(b.get("settings_digest"))
    return out


def _unrecorded(facts: Mapping[str, str]) -> bool:
    return facts.get("launch", "").startswith("not recorded")


@dataclass(frozen=True)
class Difference:
    """One fact that differs between the builds of a label, its value per build (in their order)."""

    field: str
    values: tuple[str, ...]

    @property
    def text(self) -> str:
        """"LD_LIBRARY_PATH /opt/nccl-2.19/lib vs /opt/nccl-2.21/lib": each value once, in the builds' order
        (``values`` keeps one per build, for the page's table)."""
        return f"{self.field} {' vs '.join(dict.fromkeys(self.values))}"


@dataclass(frozen=True)
class LabelSplit:
    """A ``build:`` label that named more than one build: what ran differed."""

    label: str
    builds: tuple[str, ...]  # their history keys, oldest first
    differences: tuple[Difference, ...]

    def sentence(self, *, most: int = 4) -> str:
        """"candidate-7: 2 builds: LD_LIBRARY_PATH /opt/nccl-2.19/lib vs /opt/nccl-2.21/lib"."""
        shown = [d.text for d in self.differences[:most]]
        if len(self.differences) > most:
            shown.append(f"and {len(self.differences) - most} more (history.json)")
        return f"{self.label}: {len(self.builds)} builds: " + ("; ".join(shown) or "what they ran differs")

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "builds": list(self.builds), "sentence": self.sentence(),
                "differences": [{"field": d.field, "values": list(d.values)} for d in self.differences]}


class _Grouped(Protocol):
    label: str | None
    identity: str
    vllm_version: str | None
    launch_digest: str | None
    launch_recorded: bool


def pooled_identities(runs: Sequence[_Grouped]) -> list[str]:
    """The identity each run is pooled by: its own, except for a night recorded before
    soak read the launch (``launch_recorded`` false). Such a night is taken to be its
    label's build where the label's recorded nights are one build of its /version (what
    the label meant then, as history pooled it); where they are several, or of another
    version, it is a build of its own: which of them it ran is not known."""
    recorded: dict[str, set[tuple[str, str | None]]] = {}
    for r in runs:
        if r.label and r.launch_recorded:
            recorded.setdefault(r.label, set()).add((r.identity, r.vllm_version))
    out = []
    for r in runs:
        known = recorded.get(r.label or "", set())
        if r.label and not r.launch_recorded and len(known) == 1:
            ((identity, version),) = known
            out.append(identity if version == r.vllm_version else r.identity)
        else:
            out.append(r.identity)
    return out


def group_keys(runs: Sequence[_Grouped]) -> list[str]:
    """Each run's history key, one per build (label and pooled identity), never two
    builds under one key: a label's own name where it holds one identity,
    ``label@identity`` where it holds several; an unlabelled build's ``vllm <version>
    · <digest>``. Where a key would still name two builds (a label spelled like
    another build's key) each gets its identity, then its place in the order."""
    pooled = pooled_identities(runs)
    groups: dict[tuple[str | None, str], str] = {}
    identities: dict[str, set[str]] = {}
    for r, identity in zip(runs, pooled):
        if r.label:
            identities.setdefault(r.label, set()).add(identity)
    for r, identity in zip(runs, pooled):
        group = (r.label or None, identity)
        if group in groups:
            continue
        if r.label:
            groups[group] = r.label if len(identities[r.label]) == 1 else f"{r.label}@{identity}"
        else:
            groups[group] = build_key(None, r.vllm_version, r.launch_digest)
    for attempt in range(2):
        held: dict[str, list[tuple[str | None, str]]] = {}
        for group, key in groups.items():
            held.setdefault(key, []).append(group)
        clashes = {key: members for key, members in held.items() if len(members) > 1}
        if not clashes:
            break
        for key, members in clashes.items():
            for n, group in enumerate(members):
                groups[group] = f"{key}@{group[1]}" if attempt == 0 else f"{key}#{n + 1}"
    return [groups[(r.label or None, identity)] for r, identity in zip(runs, pooled)]


def label_splits(keyed: Sequence[tuple[str | None, str, Mapping[str, str]]]) -> tuple[LabelSplit, ...]:
    """The labels that name several builds, from (label, key, facts) per run in
    order, with the facts (``identity_fields``) that differ between their builds."""
    by_label: dict[str, dict[str, Mapping[str, str]]] = {}
    for label, key, facts in keyed:
        if label:
            builds = by_label.setdefault(label, {})
            # a build's facts are its first night's that recorded its launch
            if key not in builds or (_unrecorded(builds[key]) and not _unrecorded(facts)):
                builds[key] = facts
    out = []
    for label, builds in by_label.items():
        if len(builds) < 2:
            continue
        names: list[str] = []
        for facts in builds.values():
            names += [n for n in facts if n not in names]
        differences = []
        for name in names:
            values = tuple(facts.get(name, "not recorded") for facts in builds.values())
            if len(set(values)) > 1:
                differences.append(Difference(name, values))
        out.append(LabelSplit(label, tuple(builds), tuple(differences)))
    return tuple(out)
