"""Records the fixtures under tests/fixtures/real_vllm/ from a live real vLLM
(scripts/real-vllm serve). Run by hand when the vLLM version changes:

    .venv/bin/python tests/real_vllm/record_fixtures.py --base-url http://127.0.0.1:8123 --pid API_SERVER_PID

Writes raw bytes as the server sent them; tests/probes|load/test_real_vllm_fixtures.py
parse them with the harness's own parsers. The log lines are cut from a real
server.log by hand (see README.md beside the fixtures).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

import psutil

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"
SYSTEM = {"role": "system", "content": "You are a coding agent. Read the repository.\n" + "def f(x):\n    return x + 1\n" * 40}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def http(base: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8123")
    parser.add_argument("--pid", type=int, required=True, help="the API server's PID (for the process tree)")
    args = parser.parse_args()
    base = args.base_url.rstrip("/")
    OUT.mkdir(parents=True, exist_ok=True)
    model = json.loads(http(base, "/v1/models")[1])["data"][0]["id"]
    (OUT / "models.json").write_bytes(http(base, "/v1/models")[1])
    (OUT / "version.json").write_bytes(http(base, "/version")[1])
    tokenize = {
        "chat_with_tools": http(base, "/tokenize", {"model": model, "messages": [SYSTEM, {"role": "user", "content": "ping\n"}],
                                                    "tools": TOOLS, "add_generation_prompt": True}),
        "chat_no_tools": http(base, "/tokenize", {"model": model, "messages": [SYSTEM, {"role": "user", "content": "ping\n"}],
                                                  "add_generation_prompt": True}),
        "completion": http(base, "/tokenize", {"model": model, "prompt": "def f(x):\n    return x + 1\n", "add_special_tokens": False}),
        "empty_conversation": http(base, "/tokenize", {"model": model, "messages": [], "tools": TOOLS, "add_generation_prompt": False}),
    }
    (OUT / "tokenize.json").write_text(json.dumps(
        {k: {"status": s, "body": json.loads(b) if b else None} for k, (s, b) in tokenize.items()}, indent=1))
    chat = {"model": model, "messages": [SYSTEM, {"role": "user", "content": "ping\n"}], "tools": TOOLS,
            "tool_choice": "none", "max_tokens": 12, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    (OUT / "sse_chat_cold.txt").write_bytes(http(base, "/v1/chat/completions", chat)[1])
    (OUT / "sse_chat_warm.txt").write_bytes(http(base, "/v1/chat/completions", chat)[1])  # prefix hit: cached_tokens
    status, body = http(base, "/v1/chat/completions", {**chat, "tool_choice": "auto"})
    (OUT / "chat_tool_choice_auto_400.json").write_text(json.dumps({"status": status, "body": json.loads(body)}, indent=1))
    status, body = http(base, "/v1/chat/completions", {k: v for k, v in chat.items() if k != "tool_choice"})
    (OUT / "chat_tools_without_tool_choice_400.json").write_text(json.dumps({"status": status, "body": json.loads(body)}, indent=1))
    completion = {"model": model, "prompt": "def f(x):\n" * 30, "max_tokens": 12, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
    (OUT / "sse_completion.txt").write_bytes(http(base, "/v1/completions", completion)[1])
    (OUT / "metrics.txt").write_bytes(http(base, "/metrics")[1])
    root = psutil.Process(args.pid)
    procs = []
    for proc in [root, *root.children(recursive=True)]:
        cmd = [c for c in proc.cmdline() if c]
        procs.append({"pid": proc.pid, "ppid": proc.ppid(), "name": proc.name(), "cmdline": cmd[:12]})
    (OUT / "process_tree.json").write_text(json.dumps({"root": args.pid, "processes": procs}, indent=1))
    print(f"fixtures written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
