"""The seed's story as a run directory, built by hand from the recorded ``fail`` run:
greedy canaries all night, a corruption at +1:20 (incident 1: canary c2, long, diverged
at position 7, where nothing explains it), then the deadlock at +2:00 (incident 2, the
recorded hang). Written in the formats the oracle's writers use (soak.samples.CanarySample
lines, incidents/N/incident.json, incidents/N/corruption.json), so the report, the end
block, junit.xml and history read it as they read a real night."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from report_paths import RUNS

START = 1764690000.0
CORRUPT_AT = START + 80.0  # the bad canary's answer
LAST_GOOD_AT = START + 70.0
HANG_ONSET = START + 120.0


def _tok(token: str, logprob: float, top: list[tuple[str, float]] | None = None) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "top": [list(t) for t in (top or [(token, logprob)])]}


REFERENCE_TOKENS = ["The", " capital", " of", " France", " is", " Paris", ".", " It", " lies", " on", " the",
                    " Seine", "."]
ANSWER_TOKENS = [*REFERENCE_TOKENS[:7], " Banana", " banana", " banana", "\n", "\ufffd", "!"]


def corruption_json(**override: Any) -> dict[str, Any]:
    reference = {"tokens": [_tok(t, -0.01) for t in REFERENCE_TOKENS], "text": "".join(REFERENCE_TOKENS),
                 "finish_reason": "length", "model": "DeepSeek-V4-Flash-0731", "malformed": None}
    answer_tokens = [_tok(t, -0.02) for t in ANSWER_TOKENS]
    answer_tokens[7] = _tok(" Banana", -0.05, [(" Banana", -0.05), (" Bonn", -3.4), (" The", -4.1)])
    answer = {"tokens": answer_tokens, "text": "".join(ANSWER_TOKENS), "finish_reason": "length",
              "model": "DeepSeek-V4-Flash-0731", "malformed": None}
    obj = {
        "canary_id": "c2", "long": True, "reference_source": "run", "reference": reference, "answer": answer,
        "judgement": {"verdict": "corrupt", "position": 7, "reference_token": " It", "answer_token": " Banana",
                      "gap": None, "alternatives": [[" Banana", -0.05], [" Bonn", -3.4], [" The", -4.1]],
                      "crosstalk_with": None,
                      "reason": "the reference token ' It' is not among the 3 alternatives listed at position 7"},
        "server": {"running": 12, "waiting": 3, "kv_cache_usage": 0.91, "in_flight": 13,
                   "contexts": [214000, 198000, 230000, 190500, 64, 120]},
        "onset": {"earliest": LAST_GOOD_AT, "latest": CORRUPT_AT},
    }
    obj.update(override)
    return obj


def canary_lines() -> list[dict[str, Any]]:
    out = []
    for i, offset in enumerate(range(5, 215, 5)):
        ts = START + offset
        canary = f"c{i % 4}"
        verdict = "reference" if i < 4 else "match"
        if offset == 40:
            verdict = "explained"
        if offset >= 80:
            verdict = "corrupt" if offset < 100 else "unjudged" if offset >= 120 else "match"
        if offset == 105:
            verdict = "crosstalk"
        if offset == 80:
            canary = "c2"
        out.append({"kind": "canary", "ts": ts, "canary_id": canary, "verdict": verdict, "started_at": ts - 1.2,
                    "e2e_s": 1.2, "long": canary == "c2", "prompt_tokens": 214000 if canary == "c2" else 812,
                    "output_tokens": 13, "position": 7 if verdict in ("corrupt", "explained") else None,
                    "reference_source": "run", "crosstalk_with": "c3" if verdict == "crosstalk" else None,
                    "share": round(0.004 + 0.0001 * i, 5), "error": None, "evidence": {}})
    return out


def seed_story(dest: Path, *, corruption: Any = None, write_corruption: bool = True) -> Path:
    """A copy of the ``fail`` run with the corruption first (incident 1) and the hang second (incident 2).
    ``corruption``: corruption.json's content (any JSON: a hostile or damaged one)."""
    shutil.copytree(RUNS / "fail", dest)
    for produced in ("report.html", "junit.xml", "summary.json"):
        (dest / produced).unlink(missing_ok=True)
    incidents = dest / "incidents"
    hang = json.loads((incidents / "1" / "incident.json").read_text())
    shutil.move(incidents / "1", incidents / "2")
    hang.update(number=2, evidence="incidents/2")
    (incidents / "2" / "incident.json").write_text(json.dumps(hang, indent=2))
    record = {"number": 1, "kind": "corruption", "rule": "corruption", "onset_at": CORRUPT_AT,
              "onset_earliest_at": LAST_GOOD_AT, "onset_latest_at": CORRUPT_AT, "detected_at": CORRUPT_AT + 0.5,
              "killed_pids": [], "gpus_released": True, "evidence": "incidents/1",
              "summary": "canary c2 (long) diverged from its reference at position 7",
              "reasons": ["canary c2: ' Banana' where the reference has ' It'; not a near tie"]}
    (incidents / "1").mkdir()
    (incidents / "1" / "incident.json").write_text(json.dumps(record, indent=2))
    if write_corruption:
        (incidents / "1" / "corruption.json").write_text(json.dumps(corruption_json() if corruption is None
                                                                    else corruption))
    events = [json.loads(line) for line in (dest / "events.jsonl").read_text().splitlines() if line.strip()]
    for e in events:
        if e.get("type") == "incident":
            e.update(number=2, evidence="incidents/2")
    events.append({"ts": CORRUPT_AT + 1.0, "type": "incident", **{k: v for k, v in record.items() if k != "reasons"}})
    events.sort(key=lambda e: e["ts"])
    (dest / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with (dest / "samples.jsonl").open("a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in canary_lines())
    with (dest / "config.yaml").open("a") as fh:
        fh.write("oracle:\n  tie_margin: 0.2\n  max_share: 0.02\n")
    return dest
