"""deploy/nightly.sh ends in `soak history`: each night's small files are kept
beyond retention and the real `soak history` reads them all (soak run is a stub
that replays recorded nights, so no server is needed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "history"

STUB = f"""#!{sys.executable}
import os, shutil, sys
args = sys.argv[1:]
if args[0] == "run":
    out = args[args.index("--out") + 1]
    night = os.environ["STUB_NIGHT"]
    shutil.copytree(os.path.join({str(FIXTURES)!r}, night), out)
    open(os.path.join(out, "report.html"), "w").close()
    sys.exit(0)
os.execv({sys.executable!r}, [{sys.executable!r}, "-m", "soak", *args])
"""


def test_the_nightly_keeps_every_night_for_history_beyond_retention(tmp_path):
    stub = tmp_path / "soak"
    nights = ["n01-unfixed-hang", "n02-unfixed-restarts", "n04-fixed-clean", "n05-fixed-clean", "n06-fixed-clean"]
    stub.write_text(STUB)
    stub.chmod(0o755)
    runs, history = tmp_path / "runs", tmp_path / "history"
    env = {**os.environ, "SOAK_CONFIG": "/etc/soak/x.yaml", "SOAK_RUNS_DIR": str(runs), "SOAK_KEEP": "2",
           "SOAK_BIN": str(stub), "SOAK_PYTHON": sys.executable, "SOAK_HISTORY_DIR": str(history),
           "SOAK_BASELINE": "unfixed"}
    for night in nights:
        done = subprocess.run(["bash", str(REPO / "deploy" / "nightly.sh")], env={**env, "STUB_NIGHT": night},
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert "soak history failed" not in done.stderr, done.stderr
    kept = [p for p in runs.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(kept) == 3  # retention pruned the run directories (2 newest, 1 failing)...
    data = json.loads((history / "history.json").read_text())
    assert len(data["runs"]) == 5  # ...but history still counts every night
    builds = {b["build"]: b for b in data["builds"]}
    assert builds["unfixed"]["hangs"] == 3 and builds["unfixed"]["exposure_s"] == 3700
    assert builds["fixed"]["exposure_s"] == 3 * 3960 and builds["fixed"]["fixed"] is True
    assert (history / "history.html").is_file() and (history / "history.csv").is_file()
    assert not (history / "runs" / kept[0].name / "samples.jsonl").exists()  # only the small files
    # history.html links each night's report.html while retention keeps it, relative to the page
    page = (history / "history.html").read_text()
    links = set(re.findall(r"href='([^']+)'", page))
    assert links == {f"../runs/{p.name}/report.html" for p in kept}
    assert all((history / link).is_file() for link in links)
