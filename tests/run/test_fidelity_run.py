"""A soak run adapts to the server's vLLM version and says when its GPU source is
stale (a dcgm-exporter left at its default 30 s collect interval)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from soakrun_helpers import events, read_lines, small_config, write_config


def test_a_run_reads_the_servers_version_and_adapts(tmp_path, harness):
    config = small_config(target={"kind": "simulator", "sim": {"time_scale": 20, "vllm_version": "0.33.0"}})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "v033.yaml", config), run_dir)
    assert h.wait(240) == 0, h.stderr
    (event,) = [e for e in events(run_dir) if e["type"] == "server_version"]
    assert event["server_version"] == "0.33.0" and event["basis"] == "0.33.0" and event["covered"]
    assert event["include_usage_default"] is False
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["server_version"]["basis"] == "0.33.0" and summary["warnings"] == []
    # 0.33 has no time_per_output_token_seconds: nobody warns it is missing
    assert "time_per_output_token_seconds" not in h.stdout_path.read_text() + h.stderr
    records = read_lines(run_dir / "requests.jsonl")
    assert records and all(r["cached_tokens"] is not None for r in records if r["outcome"] == "ok")


def _exporter_every(interval_s: float):
    """A dcgm-exporter stand-in: collects every ``interval_s`` and serves the last collection."""
    state = {"at": None, "text": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            now = time.time()
            if state["at"] is None or now - state["at"] >= interval_s:
                state["at"] = now
                lines = []
                for i in range(8):
                    labels = f'gpu="{i}",UUID="GPU-{i}",device="nvidia{i}",modelName="RTX 3090",Hostname="box"'
                    lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {0 if i == 7 else 100}")
                    lines.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {int(now * 1000)}")
                state["text"] = "\n".join(lines) + "\n"
            body = state["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_gpu_source_refreshing_every_30s_is_reported_stale(tmp_path, harness):
    exporter = _exporter_every(30.0)
    try:
        url = f"http://127.0.0.1:{exporter.server_address[1]}/metrics"
        config = small_config(duration="8s", probes={"gpu": {"kind": "dcgm", "url": url}})
        run_dir = tmp_path / "run"
        h = harness(write_config(tmp_path / "stale.yaml", config), run_dir, html=True)
        code = h.wait(240)
    finally:
        exporter.shutdown()
    # the frozen 100%/0% picture is stale, hence missing: no tail-stall incident from it
    assert code == 0, h.stderr
    stale = [e for e in events(run_dir) if e["type"] == "gpu_source_stale"]
    assert len(stale) == 1 and stale[0]["age_s"] > 3.0 and stale[0]["source"] == "dcgm"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["gpu_source"]["stale"] is True and summary["gpu_source"]["max_age_s"] > 3.0
    assert summary["incidents"] == []
    assert "warning: GPU source dcgm is stale" in h.stdout_path.read_text()  # the live view (plain)
    assert "GPU source dcgm is stale" in (run_dir / "report.html").read_text()
