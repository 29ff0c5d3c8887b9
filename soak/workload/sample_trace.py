"""The project's own small Mooncake-format trace (``workloads/traces/mooncake-sample.jsonl``).

Synthetic conversations shaped like the released trace: a system prompt shared
by every request (hash id 0..1), conversations whose turns extend their previous
prompt, and one-off requests. Regenerate with
``python -m soak.workload.sample_trace > workloads/traces/mooncake-sample.jsonl``.
"""

from __future__ import annotations

import json
import math
import random
import sys
from typing import Iterator

BLOCK = 512
SYSTEM_BLOCKS = 2


def synthesize_rows(*, seed: int = 7, rows: int = 240, duration_ms: int = 120_000) -> Iterator[dict]:
    """Rows in the released trace's semantics: an id names one block's exact
    content, so a row's partial last block has an id of its own, and a
    conversation's next turn carries its previous full blocks only."""
    rng = random.Random(seed)
    next_id = SYSTEM_BLOCKS
    live: list[list[int]] = []  # each conversation's full-block ids so far
    clock_ms = 0.0
    for _ in range(rows):
        clock_ms += rng.expovariate(rows / duration_ms)
        if live and rng.random() < 0.55:
            full = rng.choice(live)
            grown = rng.randint(1, 6)
            full.extend(range(next_id, next_id + grown))
            next_id += grown
            if len(full) > 60:
                live.remove(full)
        else:
            full = list(range(SYSTEM_BLOCKS)) + list(range(next_id, next_id + rng.randint(1, 12)))
            next_id = max(next_id, full[-1] + 1)
            if rng.random() < 0.7:
                live.append(full)
        tail = rng.randint(0, BLOCK - 1)  # tokens in a partial last block (0: none)
        ids = list(full)
        if tail:
            ids.append(next_id)
            next_id += 1
        length = len(full) * BLOCK + tail
        assert math.ceil(length / BLOCK) == len(ids)
        yield {"timestamp": int(clock_ms), "input_length": length,
               "output_length": rng.randint(1, 400), "hash_ids": ids}


def main() -> None:
    for row in synthesize_rows():
        sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
