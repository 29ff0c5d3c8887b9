#!/bin/bash
# Issue 37 on the device: healthy load for the ARL0 estimate. The deadlock runs' own config
# (tests/gpu/device/gpu-deadlock.yaml) without its fault, read through NVML per process,
# for SECONDS_WALL wall seconds (default 540); samples.jsonl (with token_silence_s) comes back
# under $OUT named as bench/detection.py's device source reads it (bench/results/, DEVICE_GLOB).
set -u
cd "$(dirname "$0")/.."  # the repo root (carried as out/int with .whl beside it on the device)
[ -d .whl ] || ln -sfn ../../.whl .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SECONDS_WALL=${SECONDS_WALL:-540}; NAME=${NAME:-h0}; SEED=${SEED:-100}
W=/tmp/$NAME; rm -rf $W; mkdir -p $W
# The deadlock runs' config without its faults, run for the wall time asked.
python3 - tests/gpu/device/gpu-deadlock.yaml $W/cfg.yaml $SECONDS_WALL $SEED <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
cfg["target"]["sim"].pop("faults", None)
cfg["name"], cfg["duration"], cfg["seed"] = "gpu-healthy", f"{int(sys.argv[3]) - 20}s", int(sys.argv[4])
yaml.safe_dump(cfg, open(sys.argv[2], "w"), sort_keys=False)
PY
date -u
timeout $SECONDS_WALL python3 -m soak run $W/cfg.yaml --out $W/run > $W/soak_run.log 2>&1; echo "soak run rc=$?"
tail -4 $W/soak_run.log
python3 - $W/run <<'PY'
import json, sys, pathlib
run = pathlib.Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
print("verdict", s.get("verdict"), "incidents", len(s.get("incidents") or []))
n = sum(1 for _ in open(run / "samples.jsonl"))
print("samples", n)
PY
(cd /tmp && tar czf $OUT/${PREFIX:-detection-i37d}-device-healthy-$NAME-$(date -u +%F).tgz $NAME/run/samples.jsonl $NAME/run/summary.json $NAME/cfg.yaml $NAME/soak_run.log 2>/dev/null)
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
