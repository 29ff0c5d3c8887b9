"""The streams the harness cut (the drain, an incident's kill, Ctrl-C) have one
word for people on every page: "cut" (summary.json keeps its keys, a contract)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bs4 import BeautifulSoup

from soak.report.render import write_report


def test_the_streams_the_harness_cut_are_cut_in_the_reports_request_counts_too(tmp_path) -> None:
    """One word for them: the banner's "cut by the harness", the end block's "cut",
    and the Requests section's counts (which said "aborted", the outcome's name)."""
    run_dir = tmp_path / "night"
    shutil.copytree(Path(__file__).parent / "fixtures" / "hang-restart", run_dir)
    write_report(run_dir)
    soup = BeautifulSoup((run_dir / "report.html").read_text(encoding="utf-8"), "html.parser")
    heading = next(h for h in soup.find_all("h2") if h.get_text(strip=True) == "Requests")
    counts = heading.find_next("p").get_text(" ", strip=True)
    assert "cut by the harness: 4" in counts and "aborted" not in counts, counts
    assert "4 cut by the harness" in soup.get_text(" ")
