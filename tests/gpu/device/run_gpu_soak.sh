#!/bin/bash
# Device call 2 (issue 8 and 9 on one GPU). Run from the repo root with .whl carried:
#   bash tests/gpu/device/run_gpu_soak.sh      (writes under $OUT)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/tmp/work; mkdir -p $W; D=tests/gpu/device
{
echo "== soak run (cuda workers, NVML per process)"; date -u
python3 $D/nvml_side.py $W/side.jsonl $W/run 230 & SIDE=$!
timeout 230 python3 -m soak run $D/gpu-deadlock.yaml --out $W/run > $W/soak_run.log 2>&1; echo "soak run rc=$?"
tail -5 $W/soak_run.log
kill $SIDE 2>/dev/null; wait $SIDE 2>/dev/null
python3 $D/summarize_run.py $W/run $W/side.jsonl $OUT/figures.json
[ -n "${SKIP_PP1:-}" ] || { echo "== pp_nccl on one GPU"; timeout 120 python3 $D/pp_one_gpu.py $W/pp1 $OUT/pp_one_gpu.json; echo rc=$?; }
echo "== pytest tests/gpu"
timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider -rs 2>&1 | tail -25
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} 2>&1 | tee $OUT/log.txt
tar czf $OUT/all.tgz -C $W . 2>/dev/null
ls -la $OUT
