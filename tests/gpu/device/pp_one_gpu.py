"""Device script: soak.rigs.pp_nccl with one NCCL rank on one GPU, serving, then a pipe-file dump.

python3 pp_one_gpu.py WORK_DIR OUT.json
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from soak.flightrec.dumps import summarize_dumps
from soak.respond.flight import flight_recorder_env, request_dumps

work, out = Path(sys.argv[1]), sys.argv[2]
work.mkdir(parents=True, exist_ok=True)
dumps = work / "fr"
dumps.mkdir(exist_ok=True)
stem = str(dumps / "pipe_rank_")
env = {**os.environ, **flight_recorder_env(dumps, stem)}
port_file = work / "port"
log = open(work / "server.log", "w")
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-m", "soak.rigs.pp_nccl", "--pp-size", "1", "--backend", os.environ.get("PP_BACKEND", "nccl"), "--port", "0",
                         "--port-file", str(port_file)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
result = {}
try:
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() - t0 < 120, "no port"
        time.sleep(0.2)
    base = f"http://127.0.0.1:{int(port_file.read_text())}"
    result["startup_s"] = round(time.monotonic() - t0, 2)
    body = json.dumps({"prompt": "a b c", "max_tokens": 200, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    t1 = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(f"{base}/v1/completions", data=body), timeout=60) as r:
        chunks = [l for l in r.read().decode().splitlines() if l.startswith("data: {")]
    result["stream_chunks"] = len(chunks)
    result["stream_s"] = round(time.monotonic() - t1, 2)
    result["usage"] = json.loads(chunks[-1][6:]).get("usage")
    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    result["generation_tokens_total"] = [l for l in metrics.splitlines() if l.startswith("vllm:generation_tokens_total")]
    written, notes = request_dumps(stem)
    result["pipes_written"], result["pipe_notes"] = written, notes
    for _ in range(100):
        if (dumps / "nccl_trace_rank_0").exists():
            break
        time.sleep(0.1)
    time.sleep(0.5)
    summary = summarize_dumps(dumps)
    result["fr_summary"] = summary.to_json()
finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
Path(out).write_text(json.dumps(result, indent=1))
print(json.dumps(result)[:3000])
