"""Figures of a device run: python3 summarize_run.py RUN_DIR SIDE.jsonl OUT.json"""
import json
import statistics
import sys
from pathlib import Path

run, side_path, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
summary = json.loads((run / "summary.json").read_text())
side = [json.loads(l) for l in open(side_path) if l.strip()]
onsets = [r["fault"]["onset_at"] for r in side if r.get("fault") and r["fault"].get("onset_at")]
true_onset = onsets[0] if onsets else None
gpu = []
for line in open(run / "samples.jsonl"):
    s = json.loads(line)
    if s.get("kind") == "gpu" and not s.get("error") and s.get("gpus"):
        gpu.append(s)
inc = summary["incidents"][0] if summary.get("incidents") else None
fig = {"verdict": summary.get("verdict"), "incident": inc, "true_onset_at": true_onset,
       "requests": summary.get("requests"), "tokens": summary.get("tokens")}


def window(lo, hi):
    rows = [s for s in gpu if lo <= s["ts"] <= hi]
    stages = {}
    for s in rows:
        for g in s["gpus"]:
            stages.setdefault(g["index"], []).append(g["util_pct"])
    dev = [r["util"] for r in side if lo <= r["ts"] <= hi]
    return {"readings": len(rows),
            "per_stage": {k: {"mean": round(statistics.mean(v), 1), "min": min(v), "max": max(v)} for k, v in sorted(stages.items())},
            "device_util": {"mean": round(statistics.mean(dev), 1), "min": min(dev), "max": max(dev)} if dev else None}


if true_onset and inc:
    fig["healthy"] = window(true_onset - 40, true_onset - 1)
    fig["deadlocked"] = window(true_onset + 1, inc["detected_at"])
    fig["detected_minus_true_onset_s"] = round(inc["detected_at"] - true_onset, 2)
    fig["detected_minus_estimated_onset_s"] = round(inc["detected_at"] - inc["onset_at"], 2)
    baseline = min(r["mem_mib"] for r in side if not r["pids"]) if any(not r["pids"] for r in side) else None
    after = [r for r in side if r["ts"] >= inc["detected_at"]]
    free = next((r for r in after if not r["pids"] and baseline is not None and r["mem_mib"] <= baseline + 512), None)
    fig["side_nvml"] = {"baseline_mem_mib": baseline,
                        "free_after_detection_s": round(free["ts"] - inc["detected_at"], 2) if free else None,
                        "pids_during_deadlock": sorted({p for r in side if true_onset < r["ts"] < inc["detected_at"] for p in r["pids"]})}
    fig["series_around_onset"] = [
        {"t": round(s["ts"] - true_onset, 2), "stages": [g["util_pct"] for g in s["gpus"]]}
        for s in gpu if true_onset - 6 <= s["ts"] <= inc["detected_at"] + 1
    ]
events = [json.loads(l) for l in open(run / "events.jsonl")]
fig["decisions"] = [e for e in events if e["type"] in ("decision", "incident")]
fig["detector_states"] = [{"ts": e["ts"], "state": e["state"], "rules": [r["rule"] + ":" + r["state"] for r in e.get("rules", [])]}
                          for e in events if e["type"] == "detector_state"]
inc_dir = run / "incidents" / "1"
fig["evidence_files"] = sorted(str(p.relative_to(inc_dir)) for p in inc_dir.rglob("*")) if inc_dir.exists() else []
Path(out).write_text(json.dumps(fig, indent=1, default=str))
print(json.dumps({k: fig.get(k) for k in ("verdict", "detected_minus_true_onset_s", "detected_minus_estimated_onset_s", "healthy", "deadlocked", "side_nvml")}, indent=1, default=str))
print("incident", json.dumps(inc, default=str)[:1500])
