"""process_states.json's reader on real processes: a stopped one reads T, a spinning
one R with about a core, a sleeping one S; the title is the one it has now."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from soak.respond.evidence import process_states

SPIN = "import sys\nwhile True: pass\n"
SLEEP = "import time\ntime.sleep(60)\n"


def test_a_stopped_a_spinning_and_a_sleeping_process_read_as_they_are():
    procs = [subprocess.Popen([sys.executable, "-c", code, f"VLLM::Worker_PP{i}"]) for i, code in
             enumerate((SLEEP, SPIN, SLEEP))]
    try:
        time.sleep(1.0)
        os.kill(procs[2].pid, signal.SIGSTOP)
        time.sleep(0.2)
        states = process_states([p.pid for p in procs], interval_s=0.5)["pids"]
        sleeping, spinning, stopped = (states[str(p.pid)] for p in procs)
        assert sleeping["state"] == "S" and sleeping["cpu"] < 0.2
        assert spinning["state"] == "R" and spinning["cpu"] > sleeping["cpu"]  # a core, shared with a busy box
        assert stopped["state"] == "T" and stopped["cpu"] == 0.0
        assert spinning["title"].endswith("VLLM::Worker_PP1")
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert str(gone.pid) not in process_states([gone.pid], interval_s=0.01)["pids"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
