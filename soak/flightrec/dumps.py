"""Read PyTorch NCCL flight-recorder dumps into the per-rank table.

A dump is one file per rank (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``, default
``/tmp/nccl_trace_rank_<rank>``), a pickle of a dict written by c10d's
FlightRecorder (torch/csrc/distributed/c10d/FlightRecorder.hpp)::

    version    "2.4" ... "2.9" (minor bumps add fields, major bumps change them)
    pg_config  {group_name: {"name", "desc", "ranks": "[0, 1]"}}       (>= 2.0)
    pg_status  {str(pg_id): {"last_enqueued_collective",
                             "last_started_collective",
                             "last_completed_collective"}}             (>= 2.3)
    entries    [{record_id, pg_id, process_group: (name, desc),
                 collective_seq_id, p2p_seq_id, op_id, profiling_name,
                 input_sizes, state: scheduled|started|completed,
                 timeout_ms, time_created_ns, ...}]

Older dumps lack ``pg_status`` (the table is then rebuilt from the entries) and
call the sequence number ``seq_id``; the JSON form of the dump holds the same
keys with numbers as strings. ``last_started_collective`` is -1 unless
TORCH_NCCL_ENABLE_TIMING is on. PyTorch's TorchScript pickler may wrap values in
``torch.jit._pickle`` helpers (``restore_type_tag``, ``build_intlist``, ...);
those are mapped to plain Python here, so torch is not needed, and any other
global in the stream is refused (a pickle is code; a dump is only data).

``summarize_dumps(dir)`` is what the responder writes to
``flight_recorder_summary.json`` and what the report renders: for every process
group, each rank's last enqueued / started / completed sequence number, the
ranks that are behind, and the first collective not every rank enqueued (what
``torchfrtrace`` calls "missing ranks").
"""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from soak.bounds import LIMITS, Bound, BoundExceeded, InputRejected, loads_json, read_file, value_depth

_RANK_SUFFIX = re.compile(r"(\d+)$")
_NOT_DUMPS = (".pipe", ".json", ".txt", ".log", ".py")
MAX_DUMP_BYTES = 512 * 1024 * 1024


class FlightRecorderError(ValueError):
    """A file is not a readable flight-recorder dump (named in the message)."""


def _identity(value: Any, *_: Any) -> Any:
    return value


def _as_list(value: Any) -> list:
    return list(value)


# torch/jit/_pickle.py: restore_type_tag(value, type_str), build_intlist(data), ...
_TORCH_PICKLE_HELPERS = {
    "restore_type_tag": _identity,
    "build_intlist": _as_list,
    "build_doublelist": _as_list,
    "build_boollist": _as_list,
    "build_genericlist": _as_list,
    "build_tensorlist": _as_list,
}
_SAFE_BUILTINS = {("builtins", n) for n in ("set", "frozenset", "tuple", "list", "dict", "complex")}


class _DumpUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.jit._pickle" and name in _TORCH_PICKLE_HELPERS:
            return _TORCH_PICKLE_HELPERS[name]
        if (module, name) in _SAFE_BUILTINS:
            import builtins

            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"refusing global {module}.{name} in a flight-recorder dump")


def load_dump_bytes(data: bytes, *, name: str = "<dump>") -> dict[str, Any]:
    """The raw dict of one dump (pickle, or the JSON form)."""
    stripped = data.lstrip()
    if stripped[:1] == b"{":
        try:
            obj = loads_json(stripped, max_depth=LIMITS.depth)
        except BoundExceeded as exc:
            raise FlightRecorderError(f"{name}: not a flight-recorder dump ({exc.message})") from exc
        except InputRejected as exc:
            raise FlightRecorderError(f"{name}: not a flight-recorder dump (bad JSON: {exc.message})") from exc
    else:
        try:
            obj = _DumpUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # pickle raises many types on junk input (RecursionError too)
            raise FlightRecorderError(f"{name}: not a flight-recorder dump ({type(exc).__name__}: {exc})"[:300]) from exc
        # The unpickler builds without recursion; what walks the result does not.
        # Nor does it copy: the memo lets a few hundred bytes share one list
        # into 1e10 values, so the walk counts what it meets (value_nodes).
        try:
            too_deep = value_depth(obj, stop=LIMITS.depth, max_nodes=LIMITS.value_nodes) > LIMITS.depth
        except BoundExceeded as exc:
            raise FlightRecorderError(f"{name}: not a flight-recorder dump ({exc.message})") from exc
        if too_deep:
            raise FlightRecorderError(f"{name}: not a flight-recorder dump "
                                      f"({BoundExceeded(Bound.NESTING, LIMITS.depth).message})")
    if not isinstance(obj, Mapping) or "entries" not in obj and "pg_status" not in obj:
        raise FlightRecorderError(f"{name}: not a flight-recorder dump (no entries or pg_status)")
    return dict(obj)


@dataclass(frozen=True)
class GroupStatus:
    """One process group as one rank saw it."""

    pg_id: str
    name: str  # the group's name (GUID), the same on every rank
    desc: str  # "default_pg", "pp_broadcast", ... or "undefined"
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    ranks: tuple[int, ...] | None  # global ranks of the group, from pg_config
    pending: tuple[str, ...] = ()  # "40427 nccl:broadcast (started)" for entries not completed
    from_entries: bool = False  # rebuilt from entries: the dump had no pg_status

    @property
    def label(self) -> str:
        return f"{self.name}:{self.desc}" if self.desc and self.desc != "undefined" else self.name


@dataclass(frozen=True)
class RankDump:
    rank: int
    path: str
    version: str
    groups: tuple[GroupStatus, ...]
    entry_count: int


def _int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a pickled float inf
        return None


def _ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str):
        try:
            value = loads_json(value, max_depth=LIMITS.depth)
        except InputRejected:
            return None
    if isinstance(value, (list, tuple)):
        out = [_int(v) for v in value]
        return tuple(v for v in out if v is not None)
    return None


def _entry_seq(entry: Mapping[str, Any]) -> int | None:
    seq = entry.get("collective_seq_id", entry.get("seq_id"))
    return _int(seq)


def _is_p2p(entry: Mapping[str, Any]) -> bool:
    if "is_p2p" in entry:
        return bool(entry["is_p2p"])
    name = str(entry.get("profiling_name", ""))
    return " " in name and ("send" in name or "recv" in name)


def parse_dump(obj: Mapping[str, Any], *, rank: int, path: str = "<dump>") -> RankDump:
    """Interpret one rank's dump dict (any supported version)."""
    version = str(obj.get("version", "unknown"))
    entries = [e for e in (obj.get("entries") or []) if isinstance(e, Mapping)]
    pg_config: Mapping[str, Any] = obj.get("pg_config") or {}
    pg_status: Mapping[str, Any] = obj.get("pg_status") or {}

    # pg_status is keyed by pg_id, pg_config by group name; entries tie the two.
    names: dict[str, tuple[str, str]] = {}
    by_pg: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        pg_id = str(entry.get("pg_id", "0"))
        group = entry.get("process_group")
        if isinstance(group, (list, tuple)) and len(group) >= 2:
            names.setdefault(pg_id, (str(group[0]), str(group[1])))
        by_pg.setdefault(pg_id, []).append(entry)

    def describe(pg_id: str) -> tuple[str, str, tuple[int, ...] | None]:
        name, desc = names.get(pg_id, (None, None))  # type: ignore[assignment]
        if name is None and pg_id in pg_config:  # the default group: name "0" and pg_id 0
            name = pg_id
        if name is None:
            return f"pg_id {pg_id}", "undefined", None
        config = pg_config.get(name) or {}
        desc = desc or str(config.get("desc", "undefined"))
        return name, desc, _ranks(config.get("ranks"))

    def pending(pg_id: str) -> tuple[str, ...]:
        out = []
        for entry in by_pg.get(pg_id, []):
            state = str(entry.get("state", ""))
            if state != "completed" and not _is_p2p(entry):
                out.append(f"{_entry_seq(entry)} {entry.get('profiling_name', '?')} ({state or 'unknown'})")
        return tuple(out[-8:])

    groups: list[GroupStatus] = []
    if pg_status:
        for pg_id, status in pg_status.items():
            status = status if isinstance(status, Mapping) else {}
            name, desc, ranks = describe(str(pg_id))
            groups.append(GroupStatus(
                pg_id=str(pg_id), name=name, desc=desc,
                last_enqueued=_int(status.get("last_enqueued_collective")),
                last_started=_int(status.get("last_started_collective")),
                last_completed=_int(status.get("last_completed_collective")),
                ranks=ranks, pending=pending(str(pg_id)),
            ))
    else:
        for pg_id, group_entries in by_pg.items():
            seqs = [(s, str(e.get("state", ""))) for e in group_entries if not _is_p2p(e)
                    for s in [_entry_seq(e)] if s is not None]
            if not seqs:
                continue
            name, desc, ranks = describe(pg_id)
            started = [s for s, st in seqs if st in ("started", "completed")]
            completed = [s for s, st in seqs if st == "completed"]
            groups.append(GroupStatus(
                pg_id=pg_id, name=name, desc=desc,
                last_enqueued=max(s for s, _ in seqs),
                last_started=max(started) if started else -1,
                last_completed=max(completed) if completed else -1,
                ranks=ranks, pending=pending(pg_id), from_entries=True,
            ))
    groups.sort(key=lambda g: (_int(g.pg_id) if _int(g.pg_id) is not None else 1 << 30, g.pg_id))
    return RankDump(rank=rank, path=path, version=version, groups=tuple(groups), entry_count=len(entries))


def rank_from_name(path: str | Path) -> int | None:
    m = _RANK_SUFFIX.search(Path(path).name)
    return int(m.group(1)) if m else None


def read_dump(path: str | Path, *, rank: int | None = None) -> RankDump:
    path = Path(path)
    if rank is None:
        rank = rank_from_name(path)
        if rank is None:
            raise FlightRecorderError(f"{path}: no rank number at the end of the file name")
    return parse_dump(load_dump_bytes(read_dump_bytes(path), name=str(path)), rank=rank, path=str(path))


def read_dump_bytes(path: str | Path) -> bytes:
    """A dump file's bytes, at most ``MAX_DUMP_BYTES`` (whatever its stat says:
    a device or a file still growing); ``FlightRecorderError`` naming it otherwise."""
    try:
        return read_file(path, limit=MAX_DUMP_BYTES, devices=False)  # a FIFO or device: NotRegularFile, an OSError
    except BoundExceeded as exc:
        raise FlightRecorderError(f"{path}: larger than {MAX_DUMP_BYTES} bytes") from exc
    except OSError as exc:
        raise FlightRecorderError(f"{path}: cannot read ({exc.strerror or exc})") from exc


@dataclass(frozen=True)
class RankRow:
    rank: int
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    behind: bool
    pending: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupSummary:
    name: str
    desc: str
    label: str
    rows: tuple[RankRow, ...]
    max_enqueued: int | None
    max_completed: int | None
    behind_ranks: tuple[int, ...]  # enqueued fewer collectives than the group's leader
    missing_ranks: tuple[int, ...]  # member ranks with no dump at all
    stuck_seq: int | None  # first collective some rank never enqueued, or the oldest not completed
    note: str


@dataclass(frozen=True)
class FlightRecorderSummary:
    ranks: tuple[int, ...]
    versions: tuple[str, ...]
    groups: tuple[GroupSummary, ...]
    errors: tuple[str, ...] = field(default_factory=tuple)
    # soak.flightrec.diagnose: the first divergence, one line, and its data (Diagnosis.to_json()).
    diagnosis: str | None = None
    diagnosis_detail: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "FlightRecorderSummary":
        groups = []
        for g in obj.get("groups", []):
            rows = tuple(RankRow(**{**r, "pending": tuple(r.get("pending", ()))}) for r in g.get("rows", []))
            groups.append(GroupSummary(**{
                **g, "rows": rows, "behind_ranks": tuple(g.get("behind_ranks", ())),
                "missing_ranks": tuple(g.get("missing_ranks", ())),
            }))
        return cls(ranks=tuple(obj.get("ranks", ())), versions=tuple(obj.get("versions", ())),
                   groups=tuple(groups), errors=tuple(obj.get("errors", ())),
                   diagnosis=obj.get("diagnosis"), diagnosis_detail=obj.get("diagnosis_detail"))


def summarize(dumps: Iterable[RankDump], *, errors: Iterable[str] = ()) -> FlightRecorderSummary:
    """Line the ranks up per process group and say which are behind."""
    dumps = sorted(dumps, key=lambda d: d.rank)
    per_group: dict[str, list[tuple[int, GroupStatus]]] = {}
    for dump in dumps:
        for group in dump.groups:
            per_group.setdefault(group.name, []).append((dump.rank, group))
    dumped = {d.rank for d in dumps}
    groups: list[GroupSummary] = []
    for name, members in per_group.items():
        enq = [g.last_enqueued for _, g in members if g.last_enqueued is not None]
        comp = [g.last_completed for _, g in members if g.last_completed is not None]
        max_enq = max(enq) if enq else None
        max_comp = max(comp) if comp else None
        behind = tuple(r for r, g in members
                       if max_enq is not None and g.last_enqueued is not None and g.last_enqueued < max_enq)
        rows = tuple(RankRow(r, g.last_enqueued, g.last_started, g.last_completed, r in behind, g.pending)
                     for r, g in members)
        declared = next((g.ranks for _, g in members if g.ranks), None)
        missing = tuple(sorted(set(declared) - dumped)) if declared else ()
        desc = next((g.desc for _, g in members if g.desc != "undefined"), "undefined")
        label = f"{name}:{desc}" if desc != "undefined" else name
        if behind:
            stuck = min(g.last_enqueued for r, g in members if r in behind) + 1  # type: ignore[operator,type-var]
            note = (f"rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} never enqueued "
                    f"collective {stuck}; the others wait in it")
        elif comp and enq and min(comp) < max_enq:  # type: ignore[operator]
            stuck = min(comp) + 1
            note = f"every rank enqueued {max_enq}; collective {stuck} never completed"
        else:
            stuck = None
            note = "in step"
        if missing:
            note += f"; no dump from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        groups.append(GroupSummary(name=name, desc=desc, label=label, rows=rows, max_enqueued=max_enq,
                                   max_completed=max_comp, behind_ranks=behind, missing_ranks=missing,
                                   stuck_seq=stuck, note=note))
    # The interesting groups first: ones with ranks behind, then ones stuck.
    groups.sort(key=lambda g: (not g.behind_ranks, g.stuck_seq is None, g.name))
    return FlightRecorderSummary(
        ranks=tuple(d.rank for d in dumps),
        versions=tuple(sorted({d.version for d in dumps})),
        groups=tuple(groups),
        errors=tuple(errors),
    )


def dump_files(directory: str | Path) -> list[Path]:
    """Files in ``directory`` that look like per-rank dumps (name ends in the rank)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.iterdir()
        if p.is_file() and not p.name.endswith(_NOT_DUMPS) and rank_from_name(p) is not None
    )


def summarize_dumps(directory: str | Path) -> FlightRecorderSummary:
    """Read every dump in ``directory``; unreadable files become error lines, not exceptions."""
    from soak.flightrec.diagnose import diagnose

    dumps, raw, errors = [], {}, []
    for path in dump_files(directory):
        try:
            dumps.append(read_dump(path))
            raw[dumps[-1].rank] = load_dump_bytes(read_dump_bytes(path), name=str(path))
        except (FlightRecorderError, OSError) as exc:
            errors.append(str(exc))
    summary = summarize(dumps, errors=errors)
    if not raw:
        return summary
    try:
        found = diagnose(raw)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:  # a dump shape the matcher does not know
        return replace(summary, errors=(*summary.errors, f"diagnosis failed: {type(exc).__name__}: {exc}"))
    return replace(summary, diagnosis=found.line, diagnosis_detail=found.to_json())
