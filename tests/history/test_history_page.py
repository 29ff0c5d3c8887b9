"""history.html as a person reads it the morning after, in headless Chromium (tests/browser.py),
over six real short nights of two simulator builds: "buggy" deadlocks and is restarted,
"fixed" does not, and one "fixed" night breaches a threshold (exit 99). Each run links
to its report.html while the file exists, the thresholds column says ✓ or names what
broke, a breached night is not clean, the baseline is the one named, and the MTBF of a
night reads the same on its report and in the history."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run"))

from browser import render, screenshot  # noqa: E402
from soakrun_helpers import small_config, soak_cmd, write_config  # noqa: E402

pytestmark = pytest.mark.timeout(900)

BREACH = "output_tokens_per_s > 1000000"


def night(tmp_path: Path, name: str, *, build: str, duration: str, seed: int, faults: list,
          thresholds: dict | None = None) -> tuple[Path, int]:
    config = small_config(duration=duration, build=build, seed=seed)
    config["workload"]["tokenizer"] = {"kind": "estimate"}  # no calibration pass: load begins sooner
    config["target"]["sim"] = {"time_scale": 20, "seed": seed, "faults": faults}
    config["response"] = {"on_hang": "restart", "max_restarts": 8,
                          "evidence": {"py_spy": False, "flight_recorder_wait": "0.5s"}}
    if faults:
        # The simulator writes NCCL's watchdog line at time scale (3 s of wall time), but the line says
        # 60 s, which dates the onset before the load began; the GPU rule dates it from what it saw.
        config["detector"] = {"log_signature": {"enabled": False}}
    if thresholds:
        config["thresholds"] = thresholds
    run_dir = tmp_path / "runs" / name
    done = subprocess.run(soak_cmd("run", str(write_config(tmp_path / f"{name}.yaml", config)), "--out", str(run_dir)),
                          capture_output=True, text=True, timeout=240)
    assert (run_dir / "summary.json").is_file(), done.stderr
    return run_dir, done.returncode


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("nights")
    deadlock = [{"kind": "pp_deadlock", "mtbf": "80s"}]  # as tests/history/test_history_live.py
    codes = {}
    for name, build, duration, seed, faults, thresholds in (
        ("n1-buggy", "buggy", "16s", 6, deadlock, None),
        ("n2-fixed", "fixed", "6s", 2, [], None),
        ("n3-buggy", "buggy", "16s", 2, deadlock, None),
        ("n4-fixed-slo", "fixed", "6s", 4, [], {"ttft_p99": "< 90s", "output_tokens_per_s": "> 1000000"}),
        ("n5-fixed", "fixed", "6s", 5, [], {"ttft_p99": "< 90s"}),
        ("n6-fixed", "fixed", "6s", 7, [], None),
    ):
        _run_dir, codes[name] = night(tmp_path, name, build=build, duration=duration, seed=seed, faults=faults,
                                     thresholds=thresholds)
    assert codes == {"n1-buggy": 1, "n2-fixed": 0, "n3-buggy": 1, "n4-fixed-slo": 99, "n5-fixed": 0, "n6-fixed": 0}
    runs = tmp_path / "runs"
    (runs / "n6-fixed" / "report.html").unlink()  # retention took it: no link to a missing page
    done = subprocess.run(soak_cmd("history", str(runs), "--baseline", "buggy", "--window", "1s"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return runs


def _rows(page) -> dict[str, dict[str, object]]:
    """The runs table: each row's cells by header, and the row itself."""
    table = page.soup.find("table", class_="runs")
    headers = [th.get_text(" ", strip=True) for th in table.find_all("th")]
    rows = {}
    for tr in table.find_all("tr")[1:]:
        cells = dict(zip(headers, tr.find_all("td")))
        name = cells["report"].get_text(strip=True)
        rows[name] = cells
    return rows


def test_each_run_links_its_report_and_says_which_thresholds_broke(nights):
    page = render(nights / "history.html")
    rows = _rows(page)
    assert set(rows) == {"n1-buggy", "n2-fixed", "n3-buggy", "n4-fixed-slo", "n5-fixed", "n6-fixed"}
    for name, cells in rows.items():
        link = cells["report"].find("a")
        if name == "n6-fixed":
            assert link is None  # its report.html is gone
            continue
        href = link["href"]
        assert not href.startswith("/") and (nights / href).resolve() == (nights / name / "report.html").resolve()
        assert (nights / href).is_file()
    assert rows["n4-fixed-slo"]["verdict"].get_text(strip=True) == "fail: thresholds breached, no incident"
    breached = rows["n4-fixed-slo"]["thresholds"].get_text(" ", strip=True)
    assert breached.startswith("✗") and BREACH in breached and "ttft_p99" not in breached
    assert rows["n5-fixed"]["thresholds"].get_text(strip=True) == "✓"
    assert rows["n2-fixed"]["thresholds"].get_text(strip=True) == "—"  # no thresholds configured
    # a breached night is no clean night; a hang-free pass is
    assert rows["n4-fixed-slo"]["clean"].get_text(strip=True) == ""
    assert rows["n5-fixed"]["clean"].get_text(strip=True) == "✓"
    assert rows["n1-buggy"]["clean"].get_text(strip=True) == ""

    builds = page.soup.find_all("table")[0]
    by_build = {tr.find_all("td")[0].get_text(strip=True): [td.get_text(strip=True) for td in tr.find_all("td")]
                for tr in builds.find_all("tr")[1:]}
    header = [th.get_text(strip=True) for th in builds.find_all("th")]
    fixed = dict(zip(header, by_build["fixed"]))
    assert fixed["runs"] == "4" and fixed["no hang"] == "4" and fixed["clean"] == "3"
    assert dict(zip(header, by_build["buggy"]))["verdict"] == "baseline"
    text = page.text()
    assert "Baseline: buggy" in text and "No baseline build" not in text

    shot = screenshot(nights / "history.html", nights / "history.png", width=1300, height=2600)
    if os.environ.get("SOAK_SHOTS"):  # where a person looks at it (the acceptance)
        Path(os.environ["SOAK_SHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["SOAK_SHOTS"]) / "history.png")


def test_a_nights_mtbf_reads_the_same_on_its_report_and_in_the_history(nights):
    from soak.report.stats import mtbf_estimate

    data = json.loads((nights / "history.json").read_text())
    hung = 0
    for run in data["runs"]:
        report = nights / Path(run["path"]).name / "report.html"
        if not report.is_file() or run["exposure_s"] <= 0:
            continue
        sentence = mtbf_estimate(run["hangs"], run["exposure_s"]).sentence()
        assert sentence in render(report).text(), (run["path"], sentence)
        summary = json.loads((report.parent / "summary.json").read_text())
        if run["hangs"]:
            hung += 1  # where time at risk and loaded time differ: the hung stretches
            assert run["exposure_s"] < summary["duration_s"]
    assert hung >= 1


def test_without_a_baseline_history_names_none_and_says_how_to_choose(nights, tmp_path):
    done = subprocess.run(soak_cmd("history", str(nights), "--out", str(tmp_path), "--window", "1s"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "No baseline build" in done.stdout and "--baseline BUILD" in done.stdout
    data = json.loads((tmp_path / "history.json").read_text())
    assert data["baseline"] is None and all(b["fixed"] is None and b["verdict"] == "" for b in data["builds"])
    text = render(tmp_path / "history.html").text()
    assert re.search(r"No baseline build: .*--baseline BUILD \(builds: buggy, fixed\)", text)
