"""A night with a corruption is a failure night in soak history (issue 49): listed as a
failure with its kind on history.html, history.csv and history.json, never clean, and
beside a clean night of the same build."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

from bs4 import BeautifulSoup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from oracle_run import seed_story  # noqa: E402
from report_paths import RUNS  # noqa: E402

from soak.history.collect import build_history, find_runs  # noqa: E402
from soak.history.render import write_history  # noqa: E402


def test_a_corrupt_night_is_listed_as_a_failure_with_its_kind(tmp_path):
    nights = tmp_path / "nights"
    corrupt = seed_story(nights / "corrupt")
    shutil.copytree(RUNS / "pass", nights / "clean")
    history = build_history(find_runs([nights]), confidence=0.95)
    by_path = {Path(r.path).name: r for r in history.runs}
    night = by_path["corrupt"]
    assert night.corrupt and not night.clean
    assert dict(night.incident_kinds) == {"corruption": 1, "hang": 1}
    assert not by_path["clean"].corrupt

    paths = write_history(history, tmp_path / "history")
    soup = BeautifulSoup(paths["html"].read_text(), "html.parser")
    table = soup.select_one("table.runs")
    header = [th.get_text() for th in table.select("tr")[0].select("th")]
    rows = [[td.get_text() for td in tr.select("td")] for tr in table.select("tr")[1:]]
    row = next(r for r in rows if r[header.index("verdict")] == "fail: corruption")
    assert row[header.index("incidents")] == "1 corruption, 1 hang"
    assert row[header.index("clean")] == ""
    assert "A corruption (a canary's answer the oracle could not explain) is a failure night" in soup.get_text()

    csv_rows = {Path(r["path"]).name: r for r in csv.DictReader(paths["csv"].open())}
    assert csv_rows["corrupt"]["incident_kinds"] == "1 corruption;1 hang"
    assert csv_rows["corrupt"]["clean"] == "false"
    runs = {Path(r["path"]).name: r for r in json.loads(paths["json"].read_text())["runs"]}
    assert runs["corrupt"]["corrupt"] is True and runs["corrupt"]["incident_kinds"] == {"corruption": 1, "hang": 1}
    assert [i["kind"] for i in runs["corrupt"]["incidents"]] == ["corruption", "hang"]
    assert corrupt.is_dir()
