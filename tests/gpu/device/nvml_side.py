"""Device-level NVML and the simulator's fault state, every 0.25 s, as JSON lines.

python3 nvml_side.py OUT.jsonl RUN_DIR SECONDS: an independent view beside
`soak run` (device utilization, memory, compute PIDs; /sim/state's fault onset).
"""
import json
import sys
import time
import urllib.request
from pathlib import Path

import pynvml

out, run_dir, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
end = time.time() + seconds
port = None
with open(out, "w") as f:
    while time.time() < end:
        row = {"ts": time.time(), "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
               "mem_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
               "pids": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]}
        if port is None and (run_dir / "sim.port").exists():
            text = (run_dir / "sim.port").read_text().strip()
            port = int(text) if text else None
        if port:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/state", timeout=0.5) as r:
                    row["fault"] = json.load(r).get("fault")
            except Exception as exc:
                row["fault_error"] = type(exc).__name__
        f.write(json.dumps(row) + "\n")
        f.flush()
        time.sleep(0.25)
