"""Match collectives across ranks and name the first divergence (pure core).

``diagnose(dumps, topology=None) -> Diagnosis``: raw per-rank dump dicts in
(``soak.flightrec.dumps.load_dump_bytes``), a typed diagnosis out. No
I/O here; ``soak.report.diagnose_cli`` reads the files and prints.

Per process group, entries are matched by ``collective_seq_id`` (as PyTorch's
``fr_trace`` does) over the window every rank still holds (each rank's ring
buffer starts at a different sequence number). At each sequence number, in
order, the first of these is the group's divergence:

- ``missing``: some member ranks never posted the collective (the others wait
  in it);
- ``op``, ``size``, ``dtype``: ranks posted different collectives under the
  same sequence number. For those, the odd ranks' later entries are aligned
  against the reference ranks' to find the offset: "rank 7 is 1 collective
  behind ranks 0-6" means rank 7's entries from this seq on line up with the
  others' one later (it never posted the collective at this seq).

A group with none of these says "no divergence"; a collective every rank
posted and none completed is noted (``stuck_seq``), not counted as divergence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from soak.plain import plain
from soak.printable import printable

MAX_SHIFT = 16


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs: its pipeline stage, GPU and PID (from the run), when known."""

    rank: int
    stage: int | None = None
    gpu: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class RankView:
    rank: int
    first_seq: int | None
    last_enqueued: int | None
    last_completed: int | None
    at_divergence: str  # what this rank posted at the divergent seq, or "-" (never posted)
    place: RankPlace


@dataclass(frozen=True)
class GroupDiagnosis:
    group: str  # pg name (GUID)
    desc: str  # "pp_broadcast", ...
    ranks: tuple[int, ...]
    kind: str  # "none" | "missing" | "op" | "size" | "dtype"
    seq: int | None  # first divergent collective sequence number
    collective: str | None  # reference collective at seq ("broadcast [[12]] Long")
    odd_ranks: tuple[int, ...]  # ranks that did not post the reference collective at seq
    reference_ranks: tuple[int, ...]
    offsets: Mapping[int, int]  # rank -> collectives behind (+) / ahead (-) of the reference
    stuck_seq: int | None  # oldest collective not completed on some rank
    line: str
    rows: tuple[RankView, ...]

    @property
    def diverged(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class Diagnosis:
    line: str
    diverged: bool
    groups: tuple[GroupDiagnosis, ...]
    ranks: tuple[int, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return plain(self)  # plain JSON types: tuples as lists, keys as strings, so it round-trips


# A collective's or group's name longer than this is cut ("nccl:all_reduce", "pp_broadcast").
NAME_LIMIT = 100


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a float inf (a pickle has them)
        return None


def _is_p2p(e: Mapping[str, Any]) -> bool:
    if "is_p2p" in e:
        return bool(e["is_p2p"]) if not isinstance(e["is_p2p"], str) else e["is_p2p"].lower() == "true"
    name = str(e.get("profiling_name", ""))
    return " " in name and ("send" in name or "recv" in name)


def _op(e: Mapping[str, Any]) -> str:
    name = printable(str(e.get("profiling_name", "?")), limit=NAME_LIMIT)
    return name.split(":", 1)[1] if ":" in name else name


def _signature(e: Mapping[str, Any]) -> tuple:
    # repr: one C call per field; the JSON form gives lists where the pickle gives lists too.
    return (_op(e), repr(e.get("input_sizes")), repr(e.get("output_sizes")),
            repr(e.get("input_dtypes") or []), repr(e.get("output_dtypes") or []))


def _describe(sig: tuple | None) -> str:
    if sig is None:
        return "-"
    op, ins, _outs, dtypes, _ = sig
    dtypes = dtypes.strip("[]()").replace("'", "").replace(" ", "")
    return f"{op} {ins.replace('(', '[').replace(')', ']').replace(',]', ']')} {dtypes}".strip()


def _classify(a: tuple, b: tuple) -> str:
    if a[0] != b[0]:
        return "op"
    if a[1] != b[1] or a[2] != b[2]:
        return "size"
    return "dtype"


def _ranges(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else (f"{ranks[i]}, {ranks[j]}" if j == i + 1 else f"{ranks[i]}-{ranks[j]}"))
        i = j + 1
    return ", ".join(parts)


def _plural(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}"


def _where(ranks: Sequence[int], places: Mapping[int, RankPlace]) -> str:
    bits = []
    for r in ranks:
        p = places.get(r)
        if p is None or (p.stage is None and p.gpu is None and p.pid is None):
            continue
        parts = [f"stage {p.stage}" if p.stage is not None else None,
                 f"GPU {p.gpu}" if p.gpu is not None else None, f"PID {p.pid}" if p.pid is not None else None]
        bits.append(f"rank {r}: " + ", ".join(x for x in parts if x))
    return f" ({'; '.join(bits)})" if bits else ""


def _best_shift(odd: dict[int, tuple], ref: dict[int, tuple], seq: int, prefer: int) -> tuple[int, int] | None:
    """The shift k with odd[seq+i] == ref[seq+k+i] over their whole overlap, and its overlap.

    A step protocol is periodic, so a shift one period further also lines up:
    the sign that the enqueued counts point to (``prefer``: +1 when the odd rank
    enqueued fewer) wins, then the smallest shift.
    """
    odd_len = max(odd) - seq + 1 if odd else 0
    found: list[tuple[int, int]] = []
    for k in range(-MAX_SHIFT, MAX_SHIFT + 1):
        if k == 0:
            continue
        n = 0
        ok = True
        for i in range(max(odd_len, 0)):
            a, b = odd.get(seq + i), ref.get(seq + k + i)
            if a is None or b is None:
                continue
            n += 1
            if a != b:
                ok = False
                break
        if ok and n:
            found.append((k, n))
    if not found:
        return None
    if prefer:
        signed = [f for f in found if f[0] * prefer > 0]
        if signed:
            return min(signed, key=lambda f: abs(f[0]))
    strong = [f for f in found if f[1] >= 2] or found
    return min(strong, key=lambda f: (abs(f[0]), -f[0]))


def diagnose_group(name: str, desc: str, members: tuple[int, ...],
                   per_rank: Mapping[int, Mapping[str, Any]], places: Mapping[int, RankPlace]) -> GroupDiagnosis:
    """``per_rank``: rank -> {"entries": {seq: entry}, "last_enqueued", "last_completed"}."""
    # Group names come from the dumps, which the target's processes wrote.
    name, desc = printable(name, limit=NAME_LIMIT), printable(desc, limit=NAME_LIMIT)
    label = desc if desc and desc != "undefined" else name
    sigs: dict[int, dict[int, tuple]] = {r: {s: _signature(e) for s, e in d["entries"].items()} for r, d in per_rank.items()}
    dumped = tuple(sorted(per_rank))
    firsts = [min(s) for s in sigs.values() if s]
    start = max(firsts) if firsts else None
    last_enq = {r: d.get("last_enqueued") for r, d in per_rank.items()}
    for r in dumped:  # pg_status may be absent: the entries tell
        if last_enq[r] is None and sigs[r]:
            last_enq[r] = max(sigs[r])
    top = max((v for v in last_enq.values() if v is not None), default=None)

    kind, seq, collective, odd, ref, offsets = "none", None, None, (), dumped, {}
    if start is not None and top is not None:
        for s in range(start, top + 1):
            at = {r: sigs[r].get(s) for r in dumped}
            posted = {r: v for r, v in at.items() if v is not None}
            # A rank whose status says it enqueued s while its buffer lacks it (pruned) is not missing.
            absent = [r for r in dumped if at[r] is None and (last_enq[r] is None or last_enq[r] < s)]
            if not posted:
                continue
            counts: dict[tuple, list[int]] = {}
            for r, v in posted.items():
                counts.setdefault(v, []).append(r)
            # The reference: the most ranks; ties go to the ranks further ahead.
            ref_sig, ref_ranks = max(counts.items(), key=lambda kv: (len(kv[1]), max(last_enq[r] or -1 for r in kv[1]), -min(kv[1])))
            others = sorted(r for r in posted if posted[r] != ref_sig)
            if not others and not absent:
                continue
            seq, collective, ref = s, _describe(ref_sig), tuple(sorted(ref_ranks))
            if others:
                kind = _classify(ref_sig, posted[others[0]])
                odd = tuple(others)
                ref_map = sigs[ref[0]]
                for r in others:
                    ref_top, odd_top = last_enq[ref[0]], last_enq[r]
                    prefer = 0 if ref_top is None or odd_top is None or ref_top == odd_top else (1 if odd_top < ref_top else -1)
                    shift = _best_shift({q: v for q, v in sigs[r].items() if q >= s}, ref_map, s, prefer)
                    if shift is not None:
                        offsets[r] = shift[0]
            else:
                kind, odd = "missing", tuple(absent)
            for r in absent:
                if top is not None and last_enq[r] is not None:
                    offsets.setdefault(r, top - last_enq[r] if s > last_enq[r] else s - last_enq[r])
            break

    comp = {r: d.get("last_completed") for r, d in per_rank.items()}
    stuck = None
    known_comp = [c for c in comp.values() if c is not None and c >= 0]
    if known_comp and top is not None and min(known_comp) < top:
        stuck = min(known_comp) + 1

    rows = tuple(RankView(rank=r, first_seq=min(sigs[r]) if sigs[r] else None, last_enqueued=last_enq[r],
                          last_completed=comp[r], at_divergence=_describe(sigs[r].get(seq)) if seq is not None else "-",
                          place=places.get(r, RankPlace(r))) for r in dumped)

    if kind == "none":
        line = f"{label}: no divergence across {_plural(dumped)}"
        if top is not None:
            line += f" (last collective {top})"
        if stuck is not None:
            line += f"; collective {stuck} not completed on every rank"
    elif kind == "missing":
        behind = {offsets.get(r) for r in odd}
        by = next(iter(behind)) if len(behind) == 1 and None not in behind else None
        ahead = [r for r in ref]
        if by:
            line = (f"{label}: {_plural(odd)} {'is' if len(odd) == 1 else 'are'} {by} collective{'s' if by != 1 else ''} "
                    f"behind {_plural(ahead)} at seq {seq}")
        else:
            line = f"{label}: {_plural(odd)} never posted collective {seq}"
        line += f"; {_plural(ahead)} {'waits' if len(ahead) == 1 else 'wait'} in {collective}{_where(odd, places)}"
    else:
        shown = {_describe(sigs[r].get(seq)) for r in odd}
        line = (f"{label}: {kind} mismatch at seq {seq}: {_plural(ref)} posted {collective}, "
                f"{_plural(odd)} posted {' / '.join(sorted(shown))}")
        ks = {offsets.get(r) for r in odd}
        if len(ks) == 1 and None not in ks:
            k = next(iter(ks))
            if k > 0:
                line += (f"; {_plural(odd)} {'is' if len(odd) == 1 else 'are'} {k} collective{'s' if k != 1 else ''} "
                         f"behind {_plural(ref)} (never posted seq {seq}{'' if k == 1 else f'-{seq + k - 1}'}; "
                         f"later collectives pair with the wrong payloads)")
            else:
                line += f"; {_plural(odd)} {'is' if len(odd) == 1 else 'are'} {-k} collective{'s' if k != -1 else ''} ahead of {_plural(ref)}"
        line += _where(odd, places)
    missing_dumps = tuple(sorted(set(members) - set(dumped))) if members else ()
    if missing_dumps:
        line += f"; no dump from {_plural(missing_dumps)}"
    return GroupDiagnosis(group=name, desc=desc, ranks=dumped, kind=kind, seq=seq, collective=collective,
                          odd_ranks=tuple(odd), reference_ranks=tuple(ref) if kind != "none" else (),
                          offsets=dict(offsets), stuck_seq=stuck, line=line, rows=rows)


def _group_key(entry: Mapping[str, Any], pg_id: str) -> tuple[str, str]:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and len(group) >= 2:
        return str(group[0]), str(group[1])
    return f"pg_id {pg_id}", "undefined"


def diagnose(dumps: Mapping[int, Mapping[str, Any]], *, places: Mapping[int, RankPlace] | None = None) -> Diagnosis:
    """``dumps``: rank -> raw dump dict. ``places``: rank -> stage/GPU/PID, when known."""
    from soak.flightrec.dumps import _ranks  # the pg_config "ranks" string parser

    places = dict(places or {})
    groups: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    members: dict[tuple[str, str], tuple[int, ...]] = {}
    notes: list[str] = []
    for rank, dump in sorted(dumps.items()):
        pg_ids: dict[str, tuple[str, str]] = {}
        for e in dump.get("entries") or ():
            if not isinstance(e, dict) or _is_p2p(e):
                continue
            seq = _int(e.get("collective_seq_id", e.get("seq_id")))
            if seq is None:
                continue
            pg_id = str(e.get("pg_id", "0"))
            key = _group_key(e, pg_id)
            pg_ids[pg_id] = key
            slot = groups.setdefault(key, {}).setdefault(rank, {"entries": {}, "last_enqueued": None,
                                                               "last_completed": None})
            slot["entries"][seq] = e
        for pg_id, status in (dump.get("pg_status") or {}).items():
            key = pg_ids.get(str(pg_id))
            if key is None or not isinstance(status, Mapping):
                continue
            slot = groups[key][rank]
            slot["last_enqueued"] = _int(status.get("last_enqueued_collective"))
            c = _int(status.get("last_completed_collective"))
            slot["last_completed"] = c
        for name, cfg in (dump.get("pg_config") or {}).items():
            if isinstance(cfg, Mapping):
                ranks = _ranks(cfg.get("ranks"))
                for key in groups:
                    if key[0] == str(name) and ranks:
                        members[key] = ranks
    out = []
    for key, per_rank in groups.items():
        for slot in per_rank.values():
            if slot["last_completed"] is None:
                done = [s for s, e in slot["entries"].items() if str(e.get("state")) == "completed"]
                slot["last_completed"] = max(done) if done else None
        # A rank of the group that posted nothing in it still counts as having posted nothing.
        for r in members.get(key, ()):
            if r in dumps and r not in per_rank:
                per_rank[r] = {"entries": {}, "last_enqueued": None, "last_completed": None}
        out.append(diagnose_group(key[0], key[1], members.get(key, ()), per_rank, places))
    out.sort(key=lambda g: (not g.diverged, g.seq if g.seq is not None else 0, g.group))
    diverged = [g for g in out if g.diverged]
    if diverged:
        line = diverged[0].line
        if len(diverged) > 1:
            line += f" (+{len(diverged) - 1} more group{'s' if len(diverged) > 2 else ''})"
    elif out:
        line = "no divergence: " + "; ".join(g.line.split(": ", 1)[1] if ": " in g.line else g.line for g in out[:1])
        line = "no divergence" + (f" ({len(dumps)} rank{'s' if len(dumps) != 1 else ''}, {len(out)} group{'s' if len(out) != 1 else ''})")
        stuck = [g for g in out if g.stuck_seq is not None]
        if stuck:
            line += f"; {stuck[0].desc if stuck[0].desc != 'undefined' else stuck[0].group} collective {stuck[0].stuck_seq} not completed"
    else:
        line = "no divergence (no collectives recorded)"
    return Diagnosis(line=line, diverged=bool(diverged), groups=tuple(out), ranks=tuple(sorted(dumps)), notes=tuple(notes))


def format_table(d: Diagnosis) -> str:
    lines = []
    for g in d.groups:
        lines.append(f"{g.desc if g.desc != 'undefined' else g.group} (pg {g.group}): {g.kind}"
                     + (f" at seq {g.seq}" if g.seq is not None else ""))
        lines.append(f"  {'rank':>4} {'stage':>5} {'gpu':>4} {'pid':>8} {'first':>7} {'enqueued':>9} {'completed':>9} {'offset':>6}  at divergence")
        for row in g.rows:
            p = row.place
            off = g.offsets.get(row.rank)
            lines.append(f"  {row.rank:>4} {_s(p.stage):>5} {_s(p.gpu):>4} {_s(p.pid):>8} {_s(row.first_seq):>7} "
                         f"{_s(row.last_enqueued):>9} {_s(row.last_completed):>9} {_s(off):>6}  {row.at_divergence}")
    return "\n".join(lines)


def _s(v: Any) -> str:
    return "-" if v is None else str(v)
