"""``soak diagnose PATH``: the first divergence of the flight-recorder dumps.

PATH is a run directory (its latest incident with dumps, else ``nccl/``), an
incident directory (``flight_recorder/``) or a folder of per-rank dumps.
Prints one diagnosis line, then the table (``--json``: the same data). Exit 0
with "no divergence", 1 when the ranks diverged, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from soak.errors import UsageError

_STAGE = re.compile(r"_PP(\d+)")
_RANK_ARG = re.compile(r"--rank\s+(\d+)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="run directory, incident directory or a folder of per-rank dumps")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def find_dump_dir(path: Path) -> tuple[Path, Path | None]:
    """The folder holding the dumps, and the incident folder when there is one."""
    from soak.flightrec.dumps import dump_files
    from soak.store.rundir import RunDir

    if (path / "flight_recorder").is_dir():
        return path / "flight_recorder", path
    for inc in reversed(RunDir(path).incident_dirs()):  # the latest incident first
        if dump_files(inc / "flight_recorder"):
            return inc / "flight_recorder", inc
    if dump_files(path / "nccl"):
        return path / "nccl", None
    return path, None


def places_from_incident(incident: Path | None) -> dict[int, Any]:
    """Rank -> stage, GPU, PID from the recorded tree (titles ``VLLM::Worker_PP<r>`` or ``--rank R``).

    With TP 1 (the pipelines soak drives) a rank is its stage and stage s runs
    on GPU s (Topology.pipeline); PIDs come from the tree the responder recorded.
    """
    from soak.flightrec.diagnose import RankPlace

    if incident is None:
        return {}
    from soak.jsonl import read_json

    obj = read_json(incident / "processes.json")
    places: dict[int, RankPlace] = {}
    for proc in obj.get("processes") or [] if isinstance(obj, dict) else []:
        if not isinstance(proc, dict):
            continue
        text = " ".join([str(proc.get("name") or ""), " ".join(map(str, proc.get("cmdline") or []))])
        m = _STAGE.search(text) or _RANK_ARG.search(text)
        if m and "--worker" in text or m and "Worker" in text:
            stage = int(m.group(1))
            places[stage] = RankPlace(rank=stage, stage=stage, gpu=stage, pid=proc.get("pid"))
    return places


def load(path: Path) -> tuple[dict[int, dict], Path | None]:
    from soak.flightrec.dumps import FlightRecorderError, dump_files, load_dump_bytes, rank_from_name, read_dump_bytes

    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    folder, incident = find_dump_dir(path)
    files = dump_files(folder)
    if not files:
        raise UsageError(f"{path}: no flight-recorder dumps (files named ..._<rank>)")
    dumps: dict[int, dict] = {}
    for f in files:
        rank = rank_from_name(f)
        try:
            dumps[rank] = load_dump_bytes(read_dump_bytes(f), name=str(f))  # type: ignore[index]
        except FlightRecorderError as exc:
            raise UsageError(str(exc)) from exc
    return dumps, incident


def main(args: argparse.Namespace) -> int:
    return run(path=args.path, as_json=args.json)


def latest_incident(path: Path) -> Path | None:
    """``path`` itself when it is an incident bundle, else a run's latest incident."""
    from soak.store.rundir import RunDir

    if (path / "processes.json").is_file():
        return path
    found = RunDir(path).incident_dirs() if path.is_dir() else []
    return found[-1] if found else None


def run(*, path: Path, as_json: bool) -> int:
    from soak.flightrec.diagnose import diagnose, format_table
    from soak.flightrec.dumps import dump_files
    from soak.flightrec.stackfiles import diagnosis_record, read_diagnosis, stack_diagnosis
    from soak.flightrec.stacks import format_places

    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    folder, incident = find_dump_dir(path)
    incident = incident or latest_incident(path)
    stacks = stack_diagnosis(incident) if incident is not None else None
    if not dump_files(folder):
        if stacks is None:
            raise UsageError(f"{path}: no flight-recorder dumps (files named ..._<rank>) and no py-spy stacks "
                             f"of vLLM workers")
        # No dumps: the ranks' groups could not be asked (gloo), or the recorder was off.
        said = (read_diagnosis(incident) or {}).get("flight_recorder") if incident is not None else None
        note = f"flight recorder: {said or 'no dumps in this incident'}"
        if as_json:  # diagnosis.json's schema, and the rank at the top for scripts
            found = diagnosis_record(flight_recorder=said or "no dumps in this incident", fr_line=None,
                                     fr_detail=None, places={}, stacks=stacks)
            found["faulty_rank"] = (found["faulty"] or {}).get("rank")
            print(json.dumps(found, indent=2))
        else:
            print(note)
            print(f"py-spy: {stacks.line}")
            print(format_places(stacks))
        sys.stdout.flush()
        return 1 if stacks.named else 0
    dumps, incident = load(path)
    try:
        result = diagnose(dumps, places=places_from_incident(incident))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        raise UsageError(f"{path}: dumps not understood ({type(exc).__name__}: {exc})"[:300]) from exc
    # Dumps in step (gloo records no send/recv): the stacks may still name the rank.
    fallback = stacks if stacks is not None and stacks.named and not result.diverged else None
    if as_json:
        out = result.to_json()
        if fallback is not None:
            out["stacks"] = fallback.to_json()
            out["faulty_rank"] = fallback.faulty.rank if fallback.faulty is not None else None
        print(json.dumps(out, indent=2))
    else:
        print(result.line)
        print(format_table(result))
        if fallback is not None:
            print(f"py-spy: {fallback.line}")
            print(format_places(fallback))
    sys.stdout.flush()
    return 1 if result.diverged or fallback is not None else 0
