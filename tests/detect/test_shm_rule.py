"""vLLM's shm-broadcast line as hang evidence (the log rule), on generated sample
sequences: pure, no I/O, no clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.detect import Detector, DetectorConfig
from soak.logsignatures import parse_log_line
from soak.records import DetectorState, IncidentKind, RuleState, Topology
from soak.samples import LogSample, ServerSample

T0 = 1_800_000_000.0
STEP = 0.5  # the detector's assessment interval
JIT = ("(Worker_PP1 pid=7) WARNING 12-06 10:00:00 [jit_monitor.py:42] Triton kernel JIT compilation "
       "during inference: _topk_topp_kernel. This causes a latency spike.")


def shm_line(secs: float) -> str:
    return (f"(EngineCore_DP0 pid=5) INFO 12-06 10:00:00 [shm_broadcast.py:466] No available shared memory "
            f"broadcast block found in {secs:g} seconds. This typically happens when some processes are hanging.")


def log(t: float, line: str) -> LogSample:
    m = parse_log_line(line)
    return LogSample(T0 + t, m.signature, line, m.fatal, dict(m.fields))


def server(t: float, gen: float, running: float) -> ServerSample:
    return ServerSample(T0 + t, True, {"generation_tokens": gen, "num_requests_running": running,
                                       "kv_cache_usage_perc": 0.3, "prompt_tokens": 10.0})


def only_log_rule(**log_signature) -> Detector:
    """The log rule alone: the silence rules would fire on a long flat counter by themselves."""
    off = {"enabled": False}
    return Detector(DetectorConfig.model_validate({
        "generation_frozen": off, "client_stall": off, "pp_tail_stall": off, "server_gone": off,
        "log_signature": log_signature,
    }), topology=Topology.pipeline(2))


def run(det: Detector, samples, until: float):
    """Observe in time order, assessing every STEP s (and at once when observe says so)."""
    samples = sorted(samples, key=lambda s: s.ts)
    out = []  # (t, log rule status, decisions)
    i, t = 0, 0.0
    while t <= until:
        while i < len(samples) and samples[i].ts <= T0 + t:
            now_due = det.observe(samples[i])
            if now_due:
                a = det.assess(samples[i].ts)
                out.append((samples[i].ts - T0, _log_status(a), a.new_incidents))
            i += 1
        a = det.assess(T0 + t)
        out.append((t, _log_status(a), a.new_incidents))
        t += STEP
    return out


def _log_status(assessment):
    return next(s for s in assessment.rules if s.rule == "log_signature")


# A healthy prefix: the counter moves every second with requests running.
prefix = st.integers(min_value=1, max_value=20)
running = st.integers(min_value=1, max_value=12)
interval = st.sampled_from([1.0, 2.0, 5.0, 10.0])


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 8), st.booleans()), min_size=1, max_size=60),
)
def test_never_fires_without_the_shm_line(steps):
    """Any mix of a moving or flat counter, busy or idle, and JIT lines: no shm line, no firing."""
    det = only_log_rule()
    samples, gen = [], 100.0
    for k, (moves, run_n, jit) in enumerate(steps):
        gen += 7.0 if moves else 0.0
        samples.append(server(k, gen, run_n))
        if jit:
            samples.append(log(k + 0.3, JIT))
    for _, status, decisions in run(det, samples, len(steps) + 30):
        assert status.state is not RuleState.FIRED
        assert decisions == ()


@settings(max_examples=100, deadline=None)
@given(healthy=prefix, n_running=running, every=interval, repeats=st.integers(2, 4),
       jitter=st.floats(min_value=0.0, max_value=0.4))
def test_fires_within_a_bound_once_the_line_repeats_with_a_flat_counter_and_requests_running(
        healthy, n_running, every, repeats, jitter):
    det = only_log_rule(shm_broadcast_repeats=repeats)
    samples = [server(k, 100.0 + 7 * k, n_running) for k in range(healthy + 1)]
    stop = float(healthy)  # the last progress; the counter stays flat, requests keep running
    last_line = stop
    k = 1
    while k <= repeats + 2:
        last_line = stop + k * every + jitter
        samples.append(log(last_line, shm_line(every)))
        if k == repeats:
            due = last_line
        k += 1
    samples += [server(stop + j * 0.5, 100.0 + 7 * healthy, n_running) for j in range(1, int((last_line - stop) * 2) + 4)]
    results = run(det, samples, last_line + 5)
    fired = [(t, d) for t, _, ds in results for d in ds]
    assert len(fired) == 1
    t, decision = fired[0]
    # Bound: the repeats-th line's own arrival (observe settles it at once), never earlier.
    assert due - 1e-6 <= t <= due + STEP
    assert decision.rule == "log_signature" and decision.kind is IncidentKind.HANG
    assert decision.onset_at == T0 + stop
    assert "shm-broadcast wait logged" in decision.reasons[0]
    assert f"requests running: {n_running:g}" in " ".join(decision.reasons)


@settings(max_examples=100, deadline=None)
@given(healthy=prefix, every=interval, lines=st.integers(1, 12))
def test_never_fires_on_an_idle_server(healthy, every, lines):
    """No running requests (and no client in flight): the shm line alone settles nothing."""
    det = only_log_rule()
    samples = [server(k, 100.0 + 7 * k, 2) for k in range(healthy + 1)]
    stop = float(healthy)
    samples += [server(stop + j, 100.0 + 7 * healthy, 0) for j in range(1, int(lines * every) + 3)]
    samples += [log(stop + 0.5 + k * every, shm_line(every)) for k in range(1, lines + 1)]
    results = run(det, samples, stop + lines * every + 4)
    assert all(status.state is not RuleState.FIRED and ds == () for _, status, ds in results)


@settings(max_examples=100, deadline=None)
@given(slow_steps=st.lists(st.integers(1, 6), min_size=1, max_size=8), n_running=running)
def test_single_slow_steps_of_a_healthy_server_only_make_it_suspect(slow_steps, n_running):
    """Each slow step logs one wait, then tokens flow again: never a hang."""
    det = only_log_rule()
    samples, t, gen = [], 0.0, 100.0
    for pause in slow_steps:
        samples.append(server(t, gen, n_running))
        samples.append(log(t + pause - 0.2, shm_line(5)))
        t += pause
        gen += 11
        samples.append(server(t, gen, n_running))
        t += 1.0
    results = run(det, samples, t + 2)
    assert all(status.state is not RuleState.FIRED and ds == () for _, status, ds in results)
    assert any(status.state is RuleState.PENDING for _, status, _ in results)


def test_a_jit_compile_line_is_neither_suspect_nor_fatal():
    det = only_log_rule()
    det.observe(server(0, 100.0, 3))
    assert det.observe(log(1, JIT)) is False
    assert det.assess(T0 + 1.5).state is DetectorState.HEALTHY


@settings(max_examples=50, deadline=None)
@given(lines=st.integers(2, 10), n_running=running)
def test_before_the_first_token_the_line_only_makes_suspect(lines, n_running):
    """A start-up that compiles (vLLM logs the line then too) is generation_frozen's
    start-up grace to judge, not the log rule's."""
    det = only_log_rule()
    samples = [server(k, 0.0, n_running) for k in range(lines * 5 + 2)]
    samples += [log(k * 5 + 0.5, shm_line(5)) for k in range(1, lines + 1)]
    results = run(det, samples, lines * 5 + 2)
    assert all(status.state is not RuleState.FIRED and ds == () for _, status, ds in results)
    assert results[-1][1].state is RuleState.PENDING


def test_a_cold_server_needs_one_more_wait():
    """The first requests of a server life still prefilling (3 of 4 streams not started):
    a lazy compile may log the line twice; three lines settle it."""
    from soak.samples import ClientSample

    def client(t: float, tokens: int) -> ClientSample:
        return ClientSample(T0 + t, 4, tokens * 10, tokens, 0, 0.0, 1)  # 4 in flight, 1 streaming, none done

    det = only_log_rule()
    samples = [client(0, 0), server(0, 100.0, 4), client(1, 5), server(1, 107.0, 4)]
    samples += [server(1 + j * 0.5, 107.0, 4) for j in range(1, 40)]
    samples += [log(1 + 5 * k + 0.2, shm_line(5)) for k in (1, 2, 3)]
    results = run(det, samples, 18)
    fired = [(t, d) for t, _, ds in results for d in ds]
    (t, decision), = fired
    assert t >= 16.2 - 1e-6  # the third line, not the second (11.2 s)
    assert "(>= 3 while the server life's first requests still run)" in decision.reasons[0]
