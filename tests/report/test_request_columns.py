"""The report reads requests.jsonl as columns, in the summary's one pass: the
figures must be those of the records, whatever a hostile file holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from soak.report import plots
from soak.report.render import request_statistics
from soak.report.rundir import RequestColumnsBuilder, load_run


def _records():
    rows = []
    for i in range(40):
        rows.append({"request_id": f"r{i}", "outcome": "ok" if i % 5 else "http_status", "started_at": 1000.0 + i,
                     "ended_at": 1001.0 + i, "ttft_s": 0.01 * (i + 1), "tpot_s": 0.002, "e2e_s": 1.0,
                     "itl_mean_s": 0.01, "itl_p99_s": 0.02, "prompt_tokens": 1000 + i, "output_tokens": 10,
                     "cached_tokens": 500, "warmup": i < 3})
    rows[10]["ttft_s"] = "fast"  # a figure that is not a number
    rows[11]["ttft_s"] = None
    del rows[12]["e2e_s"]
    rows[13]["prompt_tokens"] = 0  # no cached share for it
    rows[14]["outcome"] = {"odd": 1}  # an outcome that is not a string
    rows[15]["output_tokens"] = "many"  # a count that is not a number counts nothing
    rows[16]["cached_tokens"] = [1]
    return rows


def _expected(rows, key):
    values = [r.get(key) for r in rows if not r.get("warmup") and r.get("outcome") == "ok"]
    return [v for v in values if isinstance(v, (int, float))]


def test_a_hostile_requests_file_reads_into_the_same_figures(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = _records()
    lines = [json.dumps(r) for r in rows]
    lines.insert(20, "{not json")  # a bad line in the middle
    (run / "events.jsonl").write_text('{"ts": 1000.0, "type": "run_started", "run_id": "x"}\n')
    (run / "requests.jsonl").write_text("\n".join(lines) + '\n{"request_id": "torn", "outc')
    data = load_run(run)
    assert len(data.requests) == 37  # warm-up left out
    assert data.bad_lines == {"requests.jsonl": 2}  # the bad line and the torn one
    assert data.summary.requests.warmup == 3  # the same pass gave the summary
    assert data.summary.tokens.generated == 10 * 39
    stats = dict(request_statistics(data.requests)[0])
    for label, key in (("TTFT", "ttft_s"), ("end-to-end latency", "e2e_s"), ("prompt tokens", "prompt_tokens")):
        expected = _expected(rows, key)
        assert stats[label]["n"] == len(expected)
        assert stats[label]["p50"] == pytest.approx(float(np.percentile(expected, 50)))
        assert stats[label]["max"] == pytest.approx(max(expected))
    shares = [r["cached_tokens"] / r["prompt_tokens"] * 100 for r in rows
              if not r["warmup"] and r["outcome"] == "ok" and r["prompt_tokens"]
              and isinstance(r["cached_tokens"], (int, float))]
    assert stats["cached share of prompt (%)"]["n"] == len(shares)
    outcomes = dict(request_statistics(data.requests)[1])
    assert outcomes["http_status"] == 7 and outcomes["{'odd': 1}"] == 1
    assert math.isnan(data.requests["ttft_s"][10 - 3])


def test_a_scatter_draws_an_even_subsample_of_a_long_run():
    n = plots.MAX_SCATTER_POINTS * 3 + 7
    ts = np.arange(n, dtype=float)
    shown_ts, shown_v = plots._thin(ts, ts * 2)
    assert shown_ts.size <= plots.MAX_SCATTER_POINTS and shown_ts[0] == 0 and shown_ts[-1] >= n - 5
    assert np.all(np.diff(shown_ts) == np.diff(shown_ts)[0]) and np.all(shown_v == shown_ts * 2)
    small = np.arange(10.0)
    assert plots._thin(small)[0] is small


def test_columns_of_no_requests_are_empty():
    empty = RequestColumnsBuilder().build()
    assert len(empty) == 0 and empty.ok_values("ttft_s").size == 0
    assert request_statistics(empty)[0][0][1]["n"] == 0


def test_the_plotted_server_series_are_metrics_soak_reads() -> None:
    from soak.metric_names import VLLM_METRICS
    from soak.report.rundir import PLOTTED_SERVER_SERIES

    assert set(PLOTTED_SERVER_SERIES) <= set(VLLM_METRICS)  # a misspelt key would plot an empty series
    run = load_run(Path(__file__).parents[1] / "fixtures" / "runs" / "pass")
    assert set(run.server) == set(PLOTTED_SERVER_SERIES)
    assert all(len(series) == len(run.server_ts) for series in run.server.values())
