#!/bin/bash
# Issue 37 on the device: 5 injected deadlocks (seeds 0-4) read through NVML per process,
# detected minus the true onset (the nvml side recorder's fault stamp) and whether the
# true onset lies in the incident's onset interval.
set -u
cd "$(dirname "$0")/.."  # the repo root (carried as out/int with .whl beside it on the device)
[ -d .whl ] || ln -sfn ../../.whl .whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=tests/gpu/device
for S in ${SEEDS:-0 1 2 3 4}; do
  W=/tmp/w$S; rm -rf $W; mkdir -p $W
  sed "s/^seed: .*/seed: $S/" $D/gpu-deadlock.yaml > $W/cfg.yaml
  python3 $D/nvml_side.py $W/side.jsonl $W/run 110 & SIDE=$!
  timeout 110 python3 -m soak run $W/cfg.yaml --out $W/run > $W/soak_run.log 2>&1; rc=$?
  kill $SIDE 2>/dev/null; wait $SIDE 2>/dev/null
  python3 $D/summarize_run.py $W/run $W/side.jsonl $W/figures.json >/dev/null 2>&1
  python3 - $S $rc $W/figures.json <<'PY'
import json, sys
s, rc, path = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.load(open(path))
except Exception as exc:
    print(f"seed {s} rc {rc}: no figures ({exc})"); sys.exit()
i = d.get("incident") or {}
t = d.get("true_onset_at")
e, l = i.get("onset_earliest_at"), i.get("onset_latest_at")
inside = None if None in (e, l, t) else e <= t <= l
print(f"seed {s} rc {rc} rule {i.get('rule')} detected-true {d.get('detected_minus_true_onset_s')} "
      f"estimated-onset-true {None if t is None or i.get('onset_at') is None else round(i['onset_at'] - t, 2)} "
      f"interval [{None if e is None or t is None else round(e - t, 2)}, {None if l is None or t is None else round(l - t, 2)}] inside {inside}")
PY
  cp $W/figures.json $OUT/figures-$S.json 2>/dev/null
  # each run's samples as soon as it ends: a call cut short by its limit still returns them
  (cd /tmp && tar czf $OUT/samples-w$S.tgz w$S/run/samples.jsonl w$S/side.jsonl 2>/dev/null)
done
(cd /tmp && tar czf $OUT/samples.tgz $(for S in ${SEEDS:-0 1 2 3 4}; do echo w$S/run/samples.jsonl w$S/side.jsonl; done) 2>/dev/null)
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
