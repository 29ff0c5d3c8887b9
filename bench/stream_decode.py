"""Stream decoding cost, side by side in one run (issue 12 and 16):

1. the SSE decoder on one multi-MB line fed in 1 KiB pieces: the decoder before
   issue 12 (bench/_sse_before.py, a copy of it) against the current one;
2. reading vLLM content chunks: a full json.loads per chunk (interpret) against
   the learned-template path the client takes for plain content chunks.

    python bench/stream_decode.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _sse_before import SSEDecoder as Before  # noqa: E402

from soak.load.chunks import ContentTemplate, interpret  # noqa: E402
from soak.load.sse import SSEDecoder  # noqa: E402


def feed_line(decoder_cls, megabytes: int) -> float:
    raw = b"data: " + b"x" * (megabytes * 1024 * 1024) + b"\n\n"
    decoder = decoder_cls() if decoder_cls is Before else decoder_cls(max_chars=64 * 1024 * 1024)
    t0 = time.perf_counter()
    for i in range(0, len(raw), 1024):
        decoder.feed(raw[i : i + 1024])
    decoder.flush()
    return time.perf_counter() - t0


def chunks(n: int) -> list[str]:
    return [json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 17, "model": "m",
                        "choices": [{"index": 0, "delta": {"content": f"tok{i % 50}"}, "logprobs": None,
                                     "finish_reason": None}]}, separators=(",", ":")) for i in range(n)]


def main() -> None:
    print("SSE decoder, one line fed in 1 KiB pieces (seconds):")
    for mb in (1, 2, 4):
        before, after = feed_line(Before, mb), feed_line(SSEDecoder, mb)
        print(f"  {mb} MB: before {before:.3f}  after {after:.4f}  ratio {before / after:.0f}x")
    data = chunks(200_000)
    t0 = time.perf_counter()
    for d in data:
        interpret(d)
    full = time.perf_counter() - t0
    template = ContentTemplate()
    template.learn(data[0], interpret(data[0]))
    t0 = time.perf_counter()
    for d in data:
        if not template.matches(d):
            interpret(d)
    fast = time.perf_counter() - t0
    n = len(data)
    print(f"content chunks: full parse {full / n * 1e6:.2f} us/chunk, template {fast / n * 1e6:.2f} us/chunk, "
          f"ratio {full / fast:.1f}x")


if __name__ == "__main__":
    main()
