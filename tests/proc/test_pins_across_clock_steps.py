"""Invariant: a wall-clock step changes no process identity.

Real processes, and a step as psutil sees one: its start times are the boot time
(``/proc/stat``'s ``btime``, which the kernel moves with the wall clock) plus the
ticks since boot, so patching psutil's boot time shifts every start time psutil
reports exactly as stepping the clock does. soak's pins are ticks since boot, so
after any step in a day either way:

- a live process is still the one pinned before the step (never "PID reused"), so
  the harness can still kill its own hung target;
- a live harness is still alive by its owner stamp, so a later run never takes
  its daemonized server (reparented away from it) for a leftover;
- a dead harness's server still is a leftover.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from unittest import mock

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.proc.belonging import Proof, Reason, TargetIdentity, decide
from soak.proc.facts import MARKER_VARIABLE, OWNER_VARIABLE, owner_stamp
from soak.proc.read import facts_of, pin_of, read_table, running, start_since_boot

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="start ticks come from /proc")

_DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)  # the middle process exits: the daemon is reparented away from the test
os.setsid()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])  # whole or absent: the test never reads it half-written
time.sleep(120)
"""


def _daemon(tmp_path, name: str, env: dict) -> int:
    """A process reparented away from this test (as a daemonizing server is), carrying ``env``."""
    pid_file = tmp_path / f"{name}.pid"
    # tmp_path outlives one hypothesis example: an earlier example's file must not be read as this one's
    pid_file.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", _DAEMON, str(pid_file)], env={**os.environ, **env}, check=True, timeout=30)
    for _ in range(200):  # bounded: the daemon writes its PID at once
        text = pid_file.read_text() if pid_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError("the daemon never wrote its PID")


@pytest.fixture
def daemons(tmp_path):
    made: list[int] = []

    def make(name: str, env: dict) -> int:
        pid = _daemon(tmp_path, name, env)
        made.append(pid)
        return pid

    yield make
    for pid in made:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


@pytest.fixture
def dead_harness_stamp():
    """The owner stamp of a harness that has exited (a real process, reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pin = pin_of(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    assert pin is not None
    return owner_stamp(pin.pid, pin.create_time)


def _stepped(step_s: float):
    from psutil import _pslinux

    real = _pslinux.boot_time()
    return mock.patch.object(_pslinux, "boot_time", lambda: real + step_s)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step_s=st.floats(-86400.0, 86400.0).filter(lambda s: abs(s) >= 10.0))
def test_after_a_wall_clock_step_a_live_target_is_still_itself_and_a_live_run_s_daemon_no_leftover(
        step_s, daemons, dead_harness_stamp):
    me = pin_of(os.getpid())
    assert me is not None
    live_owned = daemons("live", {MARKER_VARIABLE: "other-run", OWNER_VARIABLE: owner_stamp(me.pid, me.create_time)})
    dead_owned = daemons("dead", {MARKER_VARIABLE: "dead-run", OWNER_VARIABLE: dead_harness_stamp})
    before = {pid: pin_of(pid) for pid in (live_owned, dead_owned)}
    assert all(before.values())
    assert psutil.Process(live_owned).ppid() != os.getpid()  # not in our parent chain: the stamp alone decides
    wall_start = psutil.Process(live_owned).create_time()

    with _stepped(step_s):
        seen = psutil.Process(live_owned).create_time() - wall_start
        if abs(seen) < 2.0:
            pytest.skip("this psutil caches its boot time (before 7.1): a step cannot be shown through it")
        # psutil sees the step (give or take a second: btime is whole seconds, and NTP may move it)
        assert abs(seen - step_s) < 2.0
        for pid, pin in before.items():
            assert running(pin), f"pid {pid} read as another process after a {step_s:+.0f} s step"
            assert pin_of(pid) == pin and facts_of(pid).pin.matches(pid, pin.create_time)
        table = read_table()
        target = TargetIdentity(Proof.ATTACHED_PID, root=before[live_owned])
        own = decide(live_owned, before[live_owned].create_time, table, target)
        assert own.reason is not Reason.REUSED, own
        leftover = TargetIdentity(Proof.LEFTOVER)
        spared = decide(live_owned, table.procs[live_owned].create_time, table, leftover)
        assert not spared.allowed and spared.reason is Reason.OWNER_ALIVE, spared
        stale = decide(dead_owned, table.procs[dead_owned].create_time, table, leftover)
        assert stale.allowed and stale.reason is Reason.LEFTOVER, stale


@given(comm=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=16),
       ticks=st.integers(0, 2**62), hz=st.sampled_from([100, 250, 1000]))
def test_the_start_is_read_after_the_last_parenthesis_whatever_the_command_name(comm, ticks, hz):
    # /proc/PID/stat: "pid (comm) state ppid ... starttime(22) ..."; comm may hold ") " itself.
    fields = ["S", "1", "1", "1", "0", "-1", "4194304"] + ["0"] * 12 + [str(ticks), "1000", "200"]
    line = f"4242 ({comm}) " + " ".join(fields) + "\n"
    assert start_since_boot(line, ticks_per_s=hz) == ticks / hz


@pytest.mark.parametrize("line", ["", "4242 (x", "4242 (x) S 1 2", "4242 (x) " + " ".join(["-5"] * 25)])
def test_a_malformed_stat_line_is_refused(line):
    with pytest.raises(ValueError):
        start_since_boot(line, ticks_per_s=100)
