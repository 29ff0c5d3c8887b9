"""The headless browser the page tests rely on runs scripts and draws."""

from __future__ import annotations

from browser import render, screenshot


def test_the_browser_runs_a_pages_scripts_and_draws_it(tmp_path):
    page = tmp_path / "p.html"
    page.write_text("<html><body><h1 id=t>before</h1>"
                    "<script>setTimeout(() => { document.getElementById('t').textContent = 'after'; }, 100)"
                    "</script></body></html>", encoding="utf-8")
    assert render(page).soup.find(id="t").get_text() == "after"
    png = screenshot(page, tmp_path / "p.png", width=400, height=300)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
