"""Headless Chromium for tests that look at a page as a person does: the DOM after
its scripts ran (``render``), parsed with BeautifulSoup, and a screenshot
(``screenshot``). The browser is Debian's ``chromium``, installed by scripts/test;
a missing browser fails the test that asked for it (a page nobody rendered is not
a page that passed).

Each call gets a profile folder of its own, so xdist workers never share one
(Chromium refuses a profile another instance holds)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

# Pages may draw with scripts after load; virtual time lets timers run without waiting.
VIRTUAL_TIME_BUDGET_MS = 5000
TIMEOUT_S = 90.0


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("headless Chromium is missing: scripts/test installs Debian's chromium package")
    return found


def _run(page: Path, *flags: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="soak-chromium-") as profile:
        args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}", *flags, page.resolve().as_uri()]
        done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        pytest.fail(f"chromium exited {done.returncode} on {page}: {done.stderr[-1000:]}")
    return done


@dataclass(frozen=True)
class Page:
    """A page as the browser left it after its scripts ran."""

    path: Path
    dom: str

    @property
    def soup(self) -> BeautifulSoup:
        return BeautifulSoup(self.dom, "html.parser")

    def text(self) -> str:
        """What a person reads: the visible text, whitespace folded."""
        soup = self.soup
        for hidden in soup(["script", "style", "template"]):
            hidden.decompose()
        return " ".join(soup.get_text(" ").split())


def render(page: Path) -> Page:
    return Page(page, _run(page, "--dump-dom").stdout)


def screenshot(page: Path, out: Path, *, width: int = 1400, height: int = 3000) -> Path:
    """A PNG of the page's first ``height`` pixels at ``width``."""
    _run(page, f"--screenshot={out.resolve()}", f"--window-size={width},{height}", "--hide-scrollbars")
    if not out.is_file() or out.stat().st_size == 0:
        pytest.fail(f"chromium wrote no screenshot of {page}")
    return out
