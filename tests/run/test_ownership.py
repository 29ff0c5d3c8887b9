"""Two soaks of one config started in the same second (cron, a CI matrix) share a
run id; the marker their servers inherit, which the guardian and the responder
kill by, must still be each run's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from soak.respond.flight import ownership_env, ownership_variable
from soak.run.wiring import new_ownership_token, new_run_id


def _server(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, **env},
                            start_new_session=True, stdin=subprocess.DEVNULL)


def test_a_dying_harness_takes_only_its_own_runs_server_when_another_run_shares_its_id() -> None:
    now = time.time()
    run_id = new_run_id("nightly", now)
    assert run_id == new_run_id("nightly", now)  # the same name in the same second: the same id
    mine, theirs = new_ownership_token(run_id), new_ownership_token(run_id)
    my_server, their_server = _server(ownership_env(mine)), _server(ownership_env(theirs))
    guardian = subprocess.Popen(
        [sys.executable, "-m", "soak.run.guardian", "--parent", str(os.getpid()), "--interval", "0.1",
         "--marker", f"{ownership_variable}={mine}"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        guardian.stdin.close()  # as when the harness is SIGKILLed: EOF without "done"
        assert guardian.wait(timeout=30) == 0
        assert my_server.wait(timeout=10) == -9  # the dying run's own server: gone
        assert their_server.poll() is None, "the other run's server was killed"
    finally:
        for proc in (my_server, their_server, guardian):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
