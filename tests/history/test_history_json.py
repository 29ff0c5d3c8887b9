"""``soak history DIR --json``: the text's content as one JSON document on stdout,
over the shipped fixture nights, as a nightly script would read it (a real subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "history"


def _history(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    runs = tmp_path / "runs"
    if not runs.exists():
        shutil.copytree(FIXTURES, runs, ignore=shutil.ignore_patterns("*.py"))
    return subprocess.run([sys.executable, "-m", "soak", "history", str(runs), "--baseline", "unfixed", *extra],
                          capture_output=True, text=True, timeout=120)


def test_json_is_one_document_with_the_texts_content_and_the_files_still_written(tmp_path):
    text = _history(tmp_path)
    assert text.returncode == 0, text.stderr
    done = _history(tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # stdout is the document and nothing else
    assert set(document) == {"version", "lines", "history", "written", "pushed"}
    assert document["version"] == 1 and document["pushed"] is None
    # the same content as the text: every line the text printed before its "wrote" lines
    text_lines = [line for line in text.stdout.splitlines() if not line.startswith("wrote ")]
    assert document["lines"] == text_lines
    assert any(line.startswith("fixed: fixed at 95%: ") for line in document["lines"])
    on_disk = json.loads((tmp_path / "runs" / "history.json").read_text())
    assert document["history"] == on_disk
    assert {b["build"] for b in document["history"]["builds"]} == {"unfixed", "fixed", "vllm 0.11.3 · 5e1f00d"}
    assert set(document["written"]) == {"html", "csv", "json"}
    assert all(Path(p).is_file() for p in document["written"].values())


def test_help_documents_the_keys():
    done = subprocess.run([sys.executable, "-m", "soak", "history", "--help"], capture_output=True, text=True,
                          timeout=60)
    flat = " ".join(done.stdout.split())
    for key in ("version (1)", "lines", "history", "written", "pushed"):
        assert key in flat, flat
