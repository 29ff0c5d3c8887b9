#!/bin/bash
# Device call: the flight-recorder pipe path against real PyTorch NCCL.
# Usage (device tool, carry .devwheels): bash tests/respond/device/run_fr.sh
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .devwheels --target /tmp/site pydantic setproctitle py-spy 2>&1 | tail -2
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  timeout 200 python3 tests/respond/device/fr_pipe.py --out "$OUT/fr_pipe.json"; echo "rc=$?"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} 2>&1 | tee "$OUT/log_fr.txt"
