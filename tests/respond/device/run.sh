#!/bin/bash
# Device call: the responder against real CUDA workers and real NVML.
# Usage (device tool, carry .devwheels): bash tests/respond/device/run.sh [TRIALS]
# .devwheels holds cp312 wheels of what the device image lacks (pydantic,
# setproctitle, py-spy): pip download --only-binary=:all: --python-version 3.12 ...
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .devwheels --target /tmp/site pydantic setproctitle py-spy 2>&1 | tail -2
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  timeout 500 python3 tests/respond/device/gpu_kill.py --trials "${1:-5}" --out "$OUT/gpu_kill.json"; echo "rc=$?"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} 2>&1 | tee "$OUT/log.txt"
