"""Everything from outside is bounded, in a real `soak run`: a server whose
/metrics is a gzip bomb, and a Pushgateway that answers a byte at a time. The
harness's peak RSS stays bounded and the bound hit is recorded (a failed
sample naming it; a push_failed event naming the total time), and the run ends
on time instead of waiting on a trickle."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from peak_rss import soak_peak_rss
from soakrun_helpers import attached_config, read_lines, small_config, write_config

# The harness idles near 120 MiB; unbounded, the 512 MiB bomb took it to 470 MiB.
RSS_BOUND_KIB = 300 * 1024


def run_measured(config: Path, run_dir: Path) -> tuple[int, int, str, float]:
    started = time.monotonic()
    code, rss, stderr = soak_peak_rss("run", str(config), "--out", str(run_dir), "--no-html", cwd=run_dir.parent,
                                      timeout_s=300)
    return code, rss, stderr, time.monotonic() - started


def test_a_gzip_bomb_at_metrics_is_a_recorded_bound_not_memory(tmp_path, fake_vllm) -> None:
    config = attached_config(fake_vllm("metrics_bomb").url, duration="4s", probes={"metrics_interval": "0.5s"})
    run_dir = tmp_path / "run"
    code, rss, stderr, _ = run_measured(write_config(tmp_path / "bomb.yaml", config), run_dir)
    assert "Traceback" not in stderr and code != 4, stderr
    assert rss < RSS_BOUND_KIB, f"the harness peaked at {rss} KiB"
    server = [s for s in read_lines(run_dir / "samples.jsonl") if s.get("kind") == "server"]
    assert server and all(not s["ok"] for s in server)
    assert all("body_bytes" in s["error"] for s in server), [s["error"] for s in server[:3]]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["requests"]["ok"] > 0  # the load went on: the loop was not stalled by the scrapes


class TricklingGateway:
    """Accepts a push and answers it one byte every ``every_s`` seconds."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.pushes = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        self.pushes += 1
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Padding: " + b"." * 40 + b"\r\n\r\n"
        with conn:
            try:
                conn.recv(65536)
                for byte in answer:
                    if self._stop.wait(self.every_s):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def test_a_trickling_pushgateway_holds_the_run_no_longer_than_its_total_timeout(tmp_path) -> None:
    gateway = TricklingGateway(every_s=1.0)  # 80 bytes a second apart: 80 s without a total bound
    try:
        config = small_config(duration="3s", pushgateway={"url": f"http://127.0.0.1:{gateway.port}", "timeout": "2s"})
        run_dir = tmp_path / "run"
        code, _, stderr, wall = run_measured(write_config(tmp_path / "push.yaml", config), run_dir)
    finally:
        gateway.close()
    assert gateway.pushes == 1
    assert code == 0 and "Traceback" not in stderr, stderr
    events = read_lines(run_dir / "events.jsonl")
    failed = [e for e in events if e["type"] == "push_failed"]
    assert len(failed) == 1 and "total_time" in failed[0]["error"], failed
    before = max(e["ts"] for e in events if e is not failed[0] and e["ts"] <= failed[0]["ts"])
    assert failed[0]["ts"] - before < 2.0 + 3.0
    assert wall < 80  # the whole run, start-up included, well short of the trickle's 80 s
