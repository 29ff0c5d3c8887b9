"""``soak plan --json``: the text's figures as one JSON document, for any baseline and
confidence (a property), and from a real ``soak`` subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.report.plan_cli import plan_json, plan_lines
from soak.report.stats import required_clean_exposure


@settings(max_examples=60, deadline=None)
@given(baseline=st.floats(min_value=1.0, max_value=1e7), confidence=st.floats(min_value=0.5, max_value=0.999),
       max_hangs=st.integers(min_value=0, max_value=6))
def test_the_document_holds_what_the_text_says(baseline, confidence, max_hangs):
    document = plan_json(baseline, confidence=confidence, max_hangs=max_hangs)
    json.dumps(document, allow_nan=False)  # a valid JSON document, always
    assert document["lines"] == plan_lines(baseline, confidence=confidence, max_hangs=max_hangs)
    assert [a["hangs"] for a in document["allowed"]] == list(range(max_hangs + 1))
    assert document["allowed"][0]["exposure_s"] == document["clean_exposure_s"]
    exposures = [a["exposure_s"] for a in document["allowed"]]
    assert exposures == sorted(exposures)  # each hang allowed costs more load, never less
    for a in document["allowed"]:
        assert a["exposure_s"] == required_clean_exposure(baseline, confidence=confidence,
                                                          allowed_failures=a["hangs"])
    assert document["factor"] * baseline == __import__("pytest").approx(document["clean_exposure_s"])


def test_soak_plan_json_on_stdout_matches_the_text():
    cmd = [sys.executable, "-m", "soak", "plan", "--baseline-mtbf", "15m"]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["version"] == 1 and document["baseline_mtbf_s"] == 900.0
    assert document["lines"] == text.stdout.splitlines()
    minutes = float(re.search(r"\(([\d.]+) min of load\)", text.stdout).group(1))
    assert round(document["clean_exposure_s"] / 60, 1) == minutes


def test_bad_flags_stay_one_line_and_exit_2_with_json():
    done = subprocess.run([sys.executable, "-m", "soak", "plan", "--baseline-mtbf", "soon", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
