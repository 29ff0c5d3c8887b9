"""Analysis time of soak diagnose for 8 ranks x 2,000 entries (budget: under 1 s).

    .venv/bin/python bench/diagnose.py

Builds 8 ranks' dumps from the real 4-rank gloo entry layout (tests/fixtures/
flight_recorder/real/gloo_pp4_gated), 2,000 pp_broadcast entries each, rank 7
one collective behind from seq 1,500 on (the pp_gated_broadcast shape), and
times diagnose() alone and the whole read (pickle bytes -> diagnosis).
"""

import copy
import pickle
import statistics
import time
from pathlib import Path

from soak.flightrec.diagnose import diagnose
from soak.flightrec.dumps import load_dump_bytes

REAL = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "flight_recorder" / "real" / "gloo_pp4_gated"


def build(ranks: int = 8, n: int = 2000) -> dict[int, bytes]:
    template = load_dump_bytes((REAL / "nccl_trace_rank_0").read_bytes())
    e0 = template["entries"][0]
    shapes = [([[12, 5]], ["Long"]), ([[12]], ["Long"]), ([[2, 12]], ["Int"])]
    out = {}
    for r in range(ranks):
        entries, seq = [], 0
        for i in range(n):
            idx = i if (r < ranks - 1 or i < 1500) else i + 1  # the last rank skipped one
            sizes, dtypes = shapes[idx % 3]
            seq += 1
            e = dict(copy.deepcopy(e0), collective_seq_id=seq, record_id=i, input_sizes=sizes, output_sizes=sizes,
                     input_dtypes=dtypes, output_dtypes=dtypes)
            entries.append(e)
        d = dict(template, entries=entries,
                 pg_status={"2": {"last_enqueued_collective": seq, "last_started_collective": -1,
                                  "last_completed_collective": seq - 1}})
        out[r] = pickle.dumps(d)
    return out


def main() -> None:
    raw = build()
    dumps = {r: load_dump_bytes(b) for r, b in raw.items()}
    core, whole = [], []
    for _ in range(5):
        t = time.perf_counter()
        d = diagnose(dumps)
        core.append(time.perf_counter() - t)
        t = time.perf_counter()
        diagnose({r: load_dump_bytes(b) for r, b in raw.items()})
        whole.append(time.perf_counter() - t)
    print(d.line)
    print(f"8 ranks x 2000 entries: diagnose {statistics.median(core):.3f} s median (max {max(core):.3f}); "
          f"with unpickling {statistics.median(whole):.3f} s median (max {max(whole):.3f}); budget 1 s")


if __name__ == "__main__":
    main()
