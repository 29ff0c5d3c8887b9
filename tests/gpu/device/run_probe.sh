#!/bin/bash
# Device call 1: NVML per-process probe and real flight-recorder dumps.
# Usage (device tool): bash tests/gpu/device/run_probe.sh   (writes under $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
W=/tmp/work; mkdir -p $W
{
python3 -c 'import torch, pynvml; print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
echo "== probe_nvml"; timeout 120 python3 tests/gpu/device/probe_nvml.py $OUT/probe.json; echo rc=$?
for mode in pipe direct timeout; do
  echo "== fr_dump $mode"
  timeout 90 python3 -m soak.rigs.fr_dump --out $W/fr_$mode --mode $mode --backend nccl > $W/fr_$mode.log 2>&1; echo rc=$?
  tail -c 3000 $W/fr_$mode.log
  ls -la $W/fr_$mode
done
} 2>&1 | tee $OUT/log.txt
cp $W/fr_pipe/nccl_trace_rank_0 $OUT/fr_pipe_rank_0 2>/dev/null
cp $W/fr_direct/direct_rank_0 $OUT/fr_direct_rank_0 2>/dev/null
cp $W/fr_timeout/nccl_trace_rank_0 $OUT/fr_timeout_rank_0 2>/dev/null
cp $W/fr_timeout.log $OUT/fr_timeout.log 2>/dev/null
tar czf $OUT/all.tgz -C $W . 2>/dev/null
