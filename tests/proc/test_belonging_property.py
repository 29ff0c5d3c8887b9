"""Property: ``soak.proc.belonging.decide`` never allows the harness, its
ancestors, a forwarder, a reused PID, or any process without proof of belonging
to the target; and always allows the proven target's tree.

Process tables are generated: a harness with its ancestors (init, a shell, a CI
agent), the target's tree (some members reparented to init, some in a new
session), strangers (some carrying another run's marker, some a dead harness's
marker, some with a marker and no owner, some in another cgroup), a daemon that
escaped its session and environment but not the target's cgroup, a loopback
forwarder in front of the server, and PIDs reused with another start time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from soak.proc.belonging import (
    Pin,
    ProcFacts,
    ProcTable,
    Proof,
    Reason,
    TargetIdentity,
    decide,
    forwards_to,
    owner_stamp,
)

TOKEN = "nightly-20260101T000000Z-0123456789abcdef"
OTHER = "nightly-20260101T000000Z-fedcba9876543210"
SERVER_PORT, PROXY_PORT = 8000, 9000


@st.composite
def worlds(draw):
    """(table, target identity, pids that must be allowed, pids that must be refused)."""
    pids = iter(draw(st.permutations(range(2, 400)))[:120])
    procs: dict[int, ProcFacts] = {}

    def add(ppid: int, t: float, **kw) -> ProcFacts:
        f = ProcFacts(pid=next(pids), ppid=ppid, create_time=t, **kw)
        procs[f.pid] = f
        return f

    procs[1] = ProcFacts(pid=1, ppid=0, create_time=0.0, cmdline=("init",))
    chain = [procs[1]]
    for depth in range(draw(st.integers(0, 3))):
        chain.append(add(chain[-1].pid, 1.0 + depth, cmdline=("bash",),
                         # a harness started from inside an old target's environment still protects its parents
                         marker=draw(st.sampled_from([None, TOKEN]))))
    harness = add(chain[-1].pid, 10.0, cmdline=("python", "-m", "soak", "run"),
                  owner=None, marker=draw(st.sampled_from([None, TOKEN])))
    harness_stamp = owner_stamp(harness.pid, harness.create_time)
    kind = draw(st.sampled_from([Proof.LAUNCHED, Proof.ATTACHED_PID, Proof.ATTACHED_URL]))
    launched = kind is Proof.LAUNCHED
    marker = TOKEN if launched else None
    parent_of_root = harness.pid if launched else procs[1].pid
    root = add(parent_of_root, 20.0, cmdline=("vllm", "serve") if draw(st.booleans()) else ("python", "server.py"),
               marker=marker, owner=harness_stamp if launched else None, listens=frozenset({SERVER_PORT}),
               sid=None)
    root = replace(root, sid=root.pid)
    procs[root.pid] = root
    tree = [root]
    for i in range(draw(st.integers(0, 6))):
        parent = draw(st.sampled_from(tree))
        orphan = draw(st.booleans())
        f = add(1 if orphan else parent.pid, 21.0 + i, cmdline=("python", "worker"), marker=marker,
                owner=harness_stamp if launched else None, sid=draw(st.sampled_from([root.pid, None])))
        tree.append(f)
    # Reparented workers are proven only by the record (or the marker).
    recorded = frozenset(f.pin for f in tree)
    must_allow = {f.pid for f in tree}
    # A launched server's daemon that left the session, scrubbed its environment and was
    # never recorded: only the cgroup made for the target proves it.
    cgroup = "/soak-" + TOKEN if launched and draw(st.booleans()) else None
    if cgroup is not None:
        escaped = add(1, 29.0, cmdline=("python", "daemon"), cgroup=cgroup)
        must_allow.add(escaped.pid)

    must_refuse = {0, 1, harness.pid, *(f.pid for f in chain)}
    # Strangers: no marker, another live run's marker, a dead harness's marker.
    other_harness = add(1, 11.0, cmdline=("python", "-m", "soak", "run"))
    for i in range(draw(st.integers(0, 5))):
        style = draw(st.sampled_from(["plain", "other_run", "dead_owner", "no_owner", "other_cgroup",
                                      "dead_cgroup"]))
        alive_stamp = owner_stamp(other_harness.pid, other_harness.create_time)
        kw = {
            "plain": {},
            "other_run": {"marker": OTHER, "owner": alive_stamp},
            "dead_owner": {"marker": OTHER, "owner": owner_stamp(9999, 5.0)},
            "no_owner": {"marker": OTHER},
            # scrubbed environments, in another run's cgroup (its harness alive, or gone)
            "other_cgroup": {"cgroup": f"/soak-{OTHER}~{alive_stamp}"},
            "dead_cgroup": {"cgroup": f"/soak-{OTHER}~{owner_stamp(9999, 5.0)}"},
        }[style]
        kw.setdefault("cgroup", draw(st.sampled_from([None, "/", "/soak-" + OTHER])))
        f = add(draw(st.sampled_from([1, other_harness.pid])), 30.0 + i, cmdline=("python", "stranger"), **kw)
        must_refuse.add(f.pid)
    # A forwarder: listens on the URL's port and dials the server.
    proxy = None
    if kind is Proof.ATTACHED_URL and draw(st.booleans()):
        proxy = add(1, 40.0, cmdline=("python", "proxy.py"), listens=frozenset({PROXY_PORT}),
                    dials=frozenset({SERVER_PORT}))
        must_refuse.add(proxy.pid)
    # The harness's own children (the report child, py-spy) are not the target's.
    for i in range(draw(st.integers(0, 2))):
        must_refuse.add(add(harness.pid, 50.0 + i, cmdline=("python", "-m", "soak.report.child")).pid)

    table = ProcTable(me=harness.pid, procs=procs)
    if kind is Proof.LAUNCHED:
        target = TargetIdentity(Proof.LAUNCHED, marker=TOKEN, root=root.pin, members=recorded, session=root.pid,
                                cgroup=cgroup)
    elif kind is Proof.ATTACHED_PID:
        target = TargetIdentity(Proof.ATTACHED_PID, root=root.pin, members=recorded)
    else:
        port = PROXY_PORT if proxy is not None else SERVER_PORT
        target = TargetIdentity(Proof.ATTACHED_URL, port=port, members=recorded if proxy is None else frozenset())
        if proxy is not None:
            must_allow = set()  # behind a forwarder: nothing is proven, the server included
            must_refuse |= {f.pid for f in tree}
    return table, target, must_allow, must_refuse - must_allow if proxy is None else must_refuse


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(worlds())
def test_the_proven_tree_is_always_allowed_and_nothing_else_ever(world):
    table, target, must_allow, must_refuse = world
    for pid in must_allow:
        verdict = decide(pid, table.procs[pid].create_time, table, target)
        assert verdict.allowed, (pid, verdict)
    for pid in must_refuse:
        facts = table.procs.get(pid)
        verdict = decide(pid, facts.create_time if facts else None, table, target)
        assert not verdict.allowed, (pid, verdict, facts)
    # Whatever else: never the harness or an ancestor, whatever the target claims.
    for pid in (table.me, *table.ancestors(table.me)):
        assert not decide(pid, None, table, target).allowed


@SETTINGS
@given(worlds(), st.floats(min_value=0.2, max_value=1e6))
def test_a_reused_pid_is_never_allowed(world, shift):
    table, target, must_allow, _ = world
    assume(must_allow)
    for pid in must_allow:
        facts = table.procs[pid]
        # The same number, another start time: the kernel gave a dead member's PID to a stranger.
        stranger = replace(facts, create_time=facts.create_time + shift, marker=None, owner=None,
                           ppid=1, listens=frozenset(), sid=None, cgroup=None)
        reused = ProcTable(me=table.me, procs={**table.procs, pid: stranger})
        assert not decide(pid, facts.create_time, reused, target).allowed
        # ...and asked about without a pin, the stranger has no proof either (unless it is on the URL's port).
        verdict = decide(pid, None, reused, target)
        assert not verdict.allowed or verdict.reason is Reason.ROOT and target.proof is Proof.ATTACHED_URL


@SETTINGS
@given(worlds())
def test_leftover_cleanup_takes_only_marked_processes_of_dead_harnesses(world):
    table, _, _, _ = world
    leftover = TargetIdentity(Proof.LEFTOVER)
    for pid, facts in table.procs.items():
        verdict = decide(pid, facts.create_time, table, leftover)
        if verdict.allowed:
            # Proof: a marker and an owner, or a harness's cgroup named with its owner; that owner gone.
            stamp = facts.owner if facts.marker is not None and facts.owner is not None else None
            if facts.cgroup and "~" in facts.cgroup and (stamp is None or not verdict.detail.count("marker")):
                stamp = facts.cgroup.rsplit("~", 1)[1]
            assert stamp is not None, (facts, verdict)
            owner_pid = int(stamp.split("@")[0])
            owner = table.procs.get(owner_pid)
            assert owner is None or abs(owner.create_time - float(stamp.split("@")[1].removeprefix("b"))) > 0.05
            assert pid != table.me and pid not in table.ancestors(table.me)
            assert facts.pid_ns == table.procs[table.me].pid_ns  # its owner's PID means the same here
        elif pid != table.me and pid not in table.ancestors(table.me) and pid > 1:
            # ...and every process so proven is cleaned.
            assert not (facts.marker and facts.owner and facts.owner.startswith("9999@")), (facts, verdict)
            assert not (facts.cgroup and facts.cgroup.endswith("~" + owner_stamp(9999, 5.0))), (facts, verdict)


@given(kind=st.sampled_from(["pid", "time"]), other=st.sampled_from(["[4026532999]", None]), same=st.booleans())
def test_a_leftover_is_proven_only_in_the_harness_s_own_pid_and_time_namespaces(kind, other, same):
    """An owner stamp ``PID@START`` names a PID of the namespace it was written in (a
    harness in a container is "not found" from the host while it is alive), and its
    start is ticks since boot with its time namespace's offset: from another namespace
    of either kind it proves nothing."""
    here = f"{kind}:[4026531836]"
    ns = here if same else (f"{kind}:{other}" if other else None)
    field = f"{kind}_ns"
    table = ProcTable(me=99, procs={
        1: ProcFacts(1, 0, 0.0, **{field: here}), 99: ProcFacts(99, 1, 2.0, **{field: here}),
        50: ProcFacts(50, 1, 3.0, cmdline=("vllm", "serve"), marker="run-x", owner=owner_stamp(7, 1.0), **{field: ns})})
    verdict = decide(50, 3.0, table, TargetIdentity(Proof.LEFTOVER))
    assert verdict.allowed is same, verdict


def test_a_vllm_server_talking_to_a_local_service_is_not_a_forwarder():
    server = ProcFacts(pid=10, ppid=1, create_time=1.0, cmdline=("vllm", "serve", "m"), listens=frozenset({8000}),
                       dials=frozenset({6379}))
    redis = ProcFacts(pid=11, ppid=1, create_time=1.0, cmdline=("redis-server",), listens=frozenset({6379}))
    proxy = replace(server, pid=12, cmdline=("socat", "TCP-LISTEN:9000", "TCP:127.0.0.1:8000"),
                    listens=frozenset({9000}), dials=frozenset({8000}))
    table = ProcTable(me=99, procs={1: ProcFacts(1, 0, 0.0), 10: server, 11: redis, 12: proxy,
                                    99: ProcFacts(99, 1, 2.0)})
    assert forwards_to(server, table) == ()
    assert forwards_to(proxy, table) == (8000,)
    verdict = decide(12, 1.0, table, TargetIdentity(Proof.ATTACHED_URL, port=9000))
    assert verdict.reason is Reason.FORWARDER and "forwards to 127.0.0.1:8000" in verdict.detail
    assert decide(10, 1.0, table, TargetIdentity(Proof.ATTACHED_URL, port=8000)).allowed
    # Named by pid, the proxy is still not the server.
    assert decide(12, 1.0, table, TargetIdentity(Proof.ATTACHED_PID, root=Pin(12, 1.0))).reason is Reason.FORWARDER


def test_a_listener_nobody_can_see_is_never_a_proof():
    table = ProcTable(me=99, procs={1: ProcFacts(1, 0, 0.0), 99: ProcFacts(99, 1, 2.0),
                                    50: ProcFacts(50, 1, 3.0, cmdline=("python", "x"))},
                      unseen_listeners=frozenset({8000}))
    assert not decide(50, 3.0, table, TargetIdentity(Proof.ATTACHED_URL, port=8000)).allowed


@SETTINGS
@given(step=st.floats(-86400.0, 86400.0).filter(lambda s: abs(s) > 0.05), depth=st.integers(1, 3),
       in_cgroup=st.booleans())
def test_a_wall_clock_step_never_makes_a_live_run_s_server_a_leftover(step, depth, in_cgroup):
    """A clock step (a VM resumed, NTP at boot) moves every start time psutil reports
    (boot time + ticks), so a live harness no longer matches the stamp its server
    carries. Its server, still its descendant, is never a leftover; a dead harness's
    server reparented to init still is."""
    live, dead = owner_stamp(10, 100.0), owner_stamp(9999, 5.0)
    cgroup = ("/soak-" + TOKEN + "~" + live) if in_cgroup else None
    procs = {1: ProcFacts(1, 0, 0.0), 10: ProcFacts(10, 1, 100.0, cmdline=("python", "-m", "soak", "run")),
             99: ProcFacts(99, 1, 200.0, cmdline=("python", "-m", "soak", "run"))}
    parent = 10
    for k in range(depth):  # the sim's root, the engine core, a worker
        procs[20 + k] = ProcFacts(20 + k, parent, 101.0 + k, cmdline=("vllm",), marker=TOKEN, owner=live, cgroup=cgroup)
        parent = 20 + k
    procs[30] = ProcFacts(30, 1, 50.0, cmdline=("vllm",), marker=OTHER, owner=dead)  # a night killed hard
    stepped = {pid: replace(f, create_time=f.create_time + step) for pid, f in procs.items()}
    table = ProcTable(me=99, procs=stepped)
    for pid in range(20, 20 + depth):
        verdict = decide(pid, stepped[pid].create_time, table, TargetIdentity(Proof.LEFTOVER))
        assert not verdict.allowed and verdict.reason is Reason.OWNER_ALIVE, verdict
    assert decide(30, stepped[30].create_time, table, TargetIdentity(Proof.LEFTOVER)).allowed


@given(stamp_start=st.floats(0.0, 4e9), me_start=st.floats(0.0, 1e8), owner_pid=st.integers(2, 10**6),
       table_on_boot_clock=st.booleans())
def test_an_owner_stamp_on_another_clock_is_never_proof_that_its_harness_is_gone(
        stamp_start, me_start, owner_pid, table_on_boot_clock):
    """Pins are seconds since boot; a harness from before that (or on a box without
    procfs) wrote its wall-clock start time. Read against a table on the other clock, a
    stamp names no live process whether its harness runs or not: the process is left
    alone, not killed as a leftover. And an old harness, which reads every stamp as wall
    seconds, cannot read a new one at all (the clock tag): it leaves it alone too."""
    stamp = owner_stamp(owner_pid, stamp_start, boot_clock=not table_on_boot_clock)
    table = ProcTable(me=99, procs={
        1: ProcFacts(1, 0, 0.0), 99: ProcFacts(99, 1, me_start),
        owner_pid: ProcFacts(owner_pid, 1, stamp_start + 1000.0),
        50: ProcFacts(50, 1, me_start, cmdline=("vllm", "serve"), marker="run-x", owner=stamp)},
        boot_clock=table_on_boot_clock)
    verdict = decide(50, me_start, table, TargetIdentity(Proof.LEFTOVER))
    assert not verdict.allowed and verdict.reason is Reason.NO_PROOF, verdict
    with pytest.raises(ValueError):  # how a harness before the tag parsed a stamp's time
        float(owner_stamp(owner_pid, stamp_start).partition("@")[2])

