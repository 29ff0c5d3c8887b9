"""Client overhead: soak's load generator against guidellm and aiperf, side by side.

One simulator (``soak sim`` with a request-byte counter, pinned to one CPU) and
one workload shape for every client: streaming chat requests with ~20K-token
prompts and a fixed ``max_tokens`` (``ignore_eos``), closed loop at N
concurrent streams, ``--requests-per-stream`` x N requests a run. Each client
runs in turn, pinned to the other CPU, at every N of ``--streams``. For each
run the bench reports

- client CPU: user+sys of the client's whole process tree (psutil, sampled
  every 0.25 s, the per-PID maxima summed so multiprocessing workers count;
  the whole-run figure also takes the kernel's rusage of the reaped tree);
- streamed tokens: the simulator's ``vllm:generation_tokens_total`` delta
  (the same counter for every client), prompt tokens likewise;
- prompt bytes: request-body bytes of the POSTs to ``/v1/...`` counted by the
  simulator (bench/client_overhead/counting_sim.py), so the same for everyone;
- CPU-s per million streamed tokens and per GB of request body, over the whole
  run (start-up and exit included) and over the streaming window (from the
  first to the last sample where the token counter moved: the marginal cost);
- sustained: see SUSTAINED below, printed with the results.

Then the ratios soak / best peer at every N. The goal (issue 4): at most 0.5
in streaming-window CPU per token. inference-perf is not measured: it does
not install from PyPI here ("No matching distribution").

    .venv/bin/python bench/client_overhead.py \\
        --guidellm /path/to/venv/bin/guidellm --aiperf /path/to/venv/bin/aiperf

A peer whose executable is not given or not there is skipped with a line.
Install the peers in their own virtual environments (their pins clash with
soak's): ``python -m venv V && V/bin/pip install guidellm`` (and ``aiperf``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODEL = "deepseek-v4-flash"
SIM_FLAGS = [
    # cheap steps and one-step prefill: what is measured is the clients, and the
    # simulator must stream faster than any client on its one core
    "--max-num-seqs", "256", "--max-num-batched-tokens", "65536", "--kv-cache-blocks", "100000",
    "--num-speculative-tokens", "7", "--spec-acceptance", "0.9", "--stage-time", "0.0015",
    "--stage-time-per-token", "0", "--log-stats-interval", "0", "--no-processes", "--time-scale", "1",
]
SUSTAINED_FRACTION = 0.9
SUSTAINED = (
    "a client sustains N streams when it exits 0 within --run-timeout and the median, over its streaming "
    f"window, of the simulator's sampled num_requests_running + num_requests_waiting is at least "
    f"{SUSTAINED_FRACTION:.0%} of N (the server sees the client keep N requests open: its dispatch keeps up)"
)
SAMPLE_S = 0.25


# ---------------------------------------------------------------------------
# the simulator's counters


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback only
        return response.read()


METRIC = re.compile(rb"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.eE+-]+)$", re.MULTILINE)
WANTED = {b"vllm:generation_tokens_total", b"vllm:prompt_tokens_total", b"vllm:num_requests_running",
          b"vllm:num_requests_waiting"}


@dataclass(frozen=True)
class ServerReading:
    generation: float
    prompt: float
    in_flight: float
    body_bytes: int
    requests: int


def read_server(base: str) -> ServerReading:
    values: dict[bytes, float] = {}
    for name, value in METRIC.findall(_get(base + "/metrics")):
        if name in WANTED:
            values[name] = values.get(name, 0.0) + float(value)
    counts = json.loads(_get(base + "/bench/bytes"))
    return ServerReading(
        generation=values.get(b"vllm:generation_tokens_total", 0.0),
        prompt=values.get(b"vllm:prompt_tokens_total", 0.0),
        in_flight=values.get(b"vllm:num_requests_running", 0.0) + values.get(b"vllm:num_requests_waiting", 0.0),
        body_bytes=int(counts["body_bytes"]),
        requests=int(counts["requests"]),
    )


# ---------------------------------------------------------------------------
# the client's process tree


class TreeCpu:
    """user+sys of a process tree: the per-PID maxima seen, summed."""

    def __init__(self, root_pid: int) -> None:
        self.root = psutil.Process(root_pid)
        self.max_cpu: dict[tuple[int, float], float] = {}  # (pid, create_time): a reused PID is a new process

    def sample(self) -> float:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
            except psutil.Error:
                continue
            self.max_cpu[key] = max(self.max_cpu.get(key, 0.0), times.user + times.system)
        return self.total()

    def total(self) -> float:
        return sum(self.max_cpu.values())

    def pids(self) -> list[int]:
        return [pid for pid, _ in self.max_cpu]


@dataclass
class RunResult:
    client: str
    streams: int
    rc: int | None
    timed_out: bool
    wall_s: float
    cpu_s: float
    tokens: float
    prompt_tokens: float
    body_bytes: int
    requests: int
    window_s: float = 0.0
    window_cpu_s: float = 0.0
    window_tokens: float = 0.0
    window_bytes: float = 0.0
    median_in_flight: float = 0.0
    note: str = ""

    @property
    def sustained(self) -> bool:
        return (self.rc == 0 and not self.timed_out and self.window_tokens > 0
                and self.median_in_flight >= SUSTAINED_FRACTION * self.streams)

    def per_mtok(self, window: bool) -> float | None:
        cpu, tok = (self.window_cpu_s, self.window_tokens) if window else (self.cpu_s, self.tokens)
        return cpu / tok * 1e6 if tok > 0 else None

    def per_gb(self, window: bool) -> float | None:
        cpu, size = (self.window_cpu_s, self.window_bytes) if window else (self.cpu_s, self.body_bytes)
        return cpu / size * 1e9 if size > 0 else None


def _pin(cpu: int | None):
    def preexec() -> None:
        if cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                pass
    return preexec


def _stop_tree(proc: subprocess.Popen, tree: TreeCpu) -> None:
    """SIGINT, then SIGKILL, of the client's own session and every PID of its tree seen."""
    for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGKILL:
            for pid in tree.pids():
                try:
                    p = psutil.Process(pid)
                    if p.create_time() in {ct for q, ct in tree.max_cpu if q == pid}:
                        p.kill()
                except psutil.Error:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            time.sleep(0.1)


def measure(client: str, streams: int, command: list[str], *, base: str, log: Path, cpu: int | None,
            timeout_s: float, env: dict[str, str] | None = None) -> RunResult:
    start = read_server(base)
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_pin(cpu), env=env)
    tree = TreeCpu(proc.pid)
    samples: list[tuple[float, float, ServerReading]] = []  # (mono, tree cpu, server)
    timed_out = False
    rusage_cpu = 0.0
    rc: int | None = None
    try:
        while True:
            cpu_now = tree.sample()
            samples.append((time.monotonic(), cpu_now, read_server(base)))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                proc.returncode = rc  # reaped here: Popen must not wait again
                rusage_cpu = usage.ru_utime + usage.ru_stime
                break
            if time.monotonic() - t0 > timeout_s:
                timed_out = True
                break
            time.sleep(SAMPLE_S)
    finally:
        if rc is None:
            _stop_tree(proc, tree)
            rc = proc.returncode
    wall = time.monotonic() - t0
    end = read_server(base)
    result = RunResult(
        client=client, streams=streams, rc=rc, timed_out=timed_out, wall_s=wall,
        cpu_s=max(tree.total(), rusage_cpu), tokens=end.generation - start.generation,
        prompt_tokens=end.prompt - start.prompt, body_bytes=end.body_bytes - start.body_bytes,
        requests=end.requests - start.requests,
    )
    moved = [i for i in range(1, len(samples)) if samples[i][2].generation > samples[i - 1][2].generation]
    if moved:
        first, last = moved[0] - 1, moved[-1]
        (m0, c0, s0), (m1, c1, s1) = samples[first], samples[last]
        result.window_s = m1 - m0
        result.window_cpu_s = c1 - c0
        result.window_tokens = s1.generation - s0.generation
        result.window_bytes = s1.body_bytes - s0.body_bytes
        result.median_in_flight = statistics.median(s[2].in_flight for s in samples[first + 1:last + 1])
    if timed_out:
        result.note = f"stopped after {timeout_s:.0f} s"
    elif rc != 0:
        result.note = f"exit {rc}: see {log}"
    return result


# ---------------------------------------------------------------------------
# the clients


def write_replay_jsonl(path: Path, *, lines: int, prompt_tokens: int, output_tokens: int, seed: int = 0) -> int:
    """Chat requests with distinct prompts of exactly ``prompt_tokens`` simulator
    tokens (stdlib source text); returns the mean body size in bytes."""
    from soak.tokens.tokenizer import count

    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:120])
    corpus = corpus.encode("ascii", "replace").decode("ascii")  # one token never straddles odd characters
    rng = random.Random(seed)
    total = 0
    with path.open("w", encoding="utf-8") as handle:
        for index in range(lines):
            head = f"request {index}: summarize this code.\n"
            chars = prompt_tokens * 3
            offset = rng.randrange(0, len(corpus) - chars * 2)
            text = head + corpus[offset:offset + chars]
            while count(text) < prompt_tokens:
                chars += 1000
                text = head + corpus[offset:offset + chars]
            lo, hi = len(head), len(text)
            while lo < hi:  # the longest prefix with at most prompt_tokens tokens
                mid = (lo + hi + 1) // 2
                if count(text[:mid]) <= prompt_tokens:
                    lo = mid
                else:
                    hi = mid - 1
            body = {"messages": [{"role": "user", "content": text[:lo]}], "max_tokens": output_tokens, "ignore_eos": True}
            line = json.dumps(body, separators=(",", ":"))
            total += len(line)
            handle.write(line + "\n")
    return total // max(1, lines)


def soak_command(soak: list[str], *, base: str, jsonl: Path, streams: int, requests: int, work: Path) -> list[str]:
    config = {
        "name": f"client-overhead-{streams}",
        "duration": "10m",  # the request cap ends it first
        "warmup": 0,
        "target": {"kind": "attached", "base_url": base},
        "workload": {"kind": "replay_jsonl", "path": str(jsonl), "count_tokens": False},
        "load": {"mode": "closed", "concurrency": streams, "max_requests": requests, "drain": "2m"},
        "probes": {"gpu": {"kind": "sim"}},  # probes and detector on, as in a real run
        "exporter": {"enabled": True, "port": 0, "final_scrape_wait": 0},
        "view": {"mode": "plain"},
    }
    path = work / f"soak-{streams}.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return [*soak, "run", str(path), "--out", str(work / f"soak-run-{streams}")]


def guidellm_command(exe: str, *, base: str, tok: Path, streams: int, requests: int, prompt_tokens: int,
                     output_tokens: int, work: Path) -> list[str]:
    return [exe, "run", "--backend", f"kind=openai_http,target={base}",
            "--profile", f"kind=concurrent,streams={streams}",
            "--constraint", f"kind=max_requests,count={requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tok}",
            "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
            "--disable-console-interactive", "--output", f"kind=json,path={work / f'guidellm-{streams}.json'}"]


def aiperf_command(exe: str, *, base: str, tok: Path, streams: int, requests: int, prompt_tokens: int,
                   output_tokens: int, work: Path) -> list[str]:
    return [exe, "profile", "--model", MODEL, "--url", base, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(tok), "--concurrency", str(streams), "--request-count", str(requests),
            "--synthetic-input-tokens-mean", str(prompt_tokens), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(output_tokens), "--output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--ui", "none", "--no-gpu-telemetry",
            "--output-artifact-dir", str(work / f"aiperf-{streams}")]


# ---------------------------------------------------------------------------
# output


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def print_results(results: list[RunResult]) -> None:
    print("client_overhead: per run (CPU-s = user+sys of the client's process tree; tokens = simulator's counters)")
    head = (f"{'client':<9}{'N':>5}{'ok':>4}{'wall s':>8}{'reqs':>6}{'out tok':>10}{'prompt tok':>12}{'body MB':>9}"
            f"{'CPU s':>8}{'CPU/Mtok':>10}{'CPU/GB':>10}{'win s':>7}{'win CPU':>8}{'win/Mtok':>10}{'win/GB':>10}"
            f"{'in-flight':>10}{'sust':>6}")
    print(head)
    for r in results:
        print(f"{r.client:<9}{r.streams:>5}{('y' if r.rc == 0 else 'n'):>4}{r.wall_s:>8.1f}{r.requests:>6}"
              f"{r.tokens:>10,.0f}{r.prompt_tokens:>12,.0f}{r.body_bytes / 1e6:>9.1f}{r.cpu_s:>8.2f}"
              f"{_fmt(r.per_mtok(False)):>10}{_fmt(r.per_gb(False), ',.0f'):>10}{r.window_s:>7.1f}{r.window_cpu_s:>8.2f}"
              f"{_fmt(r.per_mtok(True)):>10}{_fmt(r.per_gb(True), ',.0f'):>10}{r.median_in_flight:>10.0f}"
              f"{('yes' if r.sustained else 'no'):>6}" + (f"  ({r.note})" if r.note else ""))


def print_ratios(results: list[RunResult], clients: list[str]) -> bool | None:
    print(f"client_overhead: sustained = {SUSTAINED}")
    for client in clients:
        ok = [r.streams for r in results if r.client == client and r.sustained]
        print(f"client_overhead: most concurrent streams sustained: {client} {max(ok) if ok else 'none of the sweep'}")
    peers = [c for c in clients if c != "soak"]
    if "soak" not in clients or not peers:
        print("client_overhead: no ratios (soak and at least one peer are needed)")
        return None
    verdict: bool | None = None
    print("client_overhead: ratios soak / best peer (lower is better; best peer = the lowest CPU of the peers at that N)")
    for streams in sorted({r.streams for r in results}):
        mine = next((r for r in results if r.client == "soak" and r.streams == streams), None)
        theirs = [r for r in results if r.client in peers and r.streams == streams]
        if mine is None or not theirs:
            continue
        parts = []
        for label, getter in (("CPU/Mtok window", lambda r: r.per_mtok(True)), ("CPU/Mtok whole", lambda r: r.per_mtok(False)),
                              ("CPU/GB window", lambda r: r.per_gb(True)), ("CPU/GB whole", lambda r: r.per_gb(False))):
            values = [(getter(r), r.client) for r in theirs if getter(r)]
            if not values or not getter(mine):
                parts.append(f"{label} -")
                continue
            best, who = min(values)
            ratio = getter(mine) / best
            parts.append(f"{label} {ratio:.2f} (vs {who})")
            if label == "CPU/Mtok window":
                met = ratio <= 0.5
                verdict = met if verdict is None else (verdict and met)
        print(f"client_overhead:   N={streams}: " + "; ".join(parts))
    if verdict is not None:
        print(f"client_overhead: goal soak <= 0.5 x best peer CPU per streamed token (window), every N: "
              f"{'met' if verdict else 'NOT met'}")
    return verdict


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guidellm", help="the guidellm executable (e.g. VENV/bin/guidellm); absent: skipped")
    ap.add_argument("--aiperf", help="the aiperf executable (e.g. VENV/bin/aiperf); absent: skipped")
    ap.add_argument("--streams", default="32,64,128,256", help="the concurrency sweep (default 32,64,128,256)")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=20000)
    ap.add_argument("--output-tokens", type=int, default=1024)
    ap.add_argument("--run-timeout", type=float, default=120.0, help="seconds one client run may take")
    ap.add_argument("--sim-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--keep", help="keep the work directory (logs, run dirs) here")
    a = ap.parse_args()
    try:
        sweep = sorted({int(s) for s in a.streams.split(",") if s.strip()})
    except ValueError:
        print(f"client_overhead: --streams: expected numbers separated by commas, got {a.streams!r}", file=sys.stderr)
        return 2
    if not sweep or min(sweep) < 1 or max(sweep) > 256:
        print("client_overhead: --streams: each value must be 1..256 (the simulator's --max-num-seqs)", file=sys.stderr)
        return 2
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    pin = a.sim_cpu in cpus and a.client_cpu in cpus and a.sim_cpu != a.client_cpu
    if not pin:
        print(f"client_overhead: not pinning (CPUs {sorted(cpus)} do not include --sim-cpu and --client-cpu)")

    clients: list[str] = ["soak"]
    peers: dict[str, str] = {}
    for name, exe in (("guidellm", a.guidellm), ("aiperf", a.aiperf)):
        found = shutil.which(exe) if exe else None
        if found:
            peers[name] = found
            clients.append(name)
        else:
            why = "not given" if not exe else f"{exe} is not an executable"
            print(f"client_overhead: skipping {name}: {why} (install: python -m venv V && V/bin/pip install {name}; "
                  f"then --{name} V/bin/{name})")
    print("client_overhead: skipping inference-perf: pip finds no installable distribution here (\"No matching distribution\")")

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="client-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    sim: subprocess.Popen | None = None
    results: list[RunResult] = []
    try:
        tok = work / "tokenizer"
        if peers:
            import importlib.util

            spec = importlib.util.spec_from_file_location("client_overhead_tokenizer", HERE / "client_overhead" / "tokenizer.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            build_tokenizer = module.build_tokenizer
            try:
                build_tokenizer(tok)
            except ImportError:
                print("client_overhead: the peers need a tokenizer and the `tokenizers` package is missing "
                      "(pip install tokenizers); skipping the peers")
                clients = ["soak"]
        jsonl = work / "requests.jsonl"
        mean_body = write_replay_jsonl(jsonl, lines=max(sweep) * a.requests_per_stream,
                                       prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens)
        print(f"client_overhead: workload: streaming chat, prompt {a.prompt_tokens:,} tokens (soak: simulator tokens, "
              f"{mean_body / 1e3:.0f} KB a body; peers: their tokenizer's), max_tokens {a.output_tokens} with ignore_eos, "
              f"closed loop, {a.requests_per_stream} x N requests a run; sweep N = {sweep}")

        port_file = work / "sim.port"
        sim = subprocess.Popen(
            [sys.executable, str(HERE / "client_overhead" / "counting_sim.py"), "--port", "0", "--port-file", str(port_file), *SIM_FLAGS],
            stdout=(work / "sim.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_pin(a.sim_cpu if pin else None), cwd=REPO)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if sim.poll() is not None or time.monotonic() > deadline:
                print(f"client_overhead: the simulator did not start (see {work / 'sim.log'})", file=sys.stderr)
                return 1
            time.sleep(0.05)
        base = f"http://127.0.0.1:{int(port_file.read_text())}"
        if pin:
            os.sched_setaffinity(0, {a.sim_cpu})  # the sampler shares the simulator's CPU, not the client's
            print(f"client_overhead: simulator and this sampler pinned to CPU {a.sim_cpu}, each client to CPU {a.client_cpu} "
                  "(the machine is shared: CPU seconds are robust to that, sustained streams less so)")

        soak = [sys.executable, "-m", "soak"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for streams in sweep:
            requests = streams * a.requests_per_stream
            for client in clients:
                if client == "soak":
                    command = soak_command(soak, base=base, jsonl=jsonl, streams=streams, requests=requests, work=work)
                else:
                    build = guidellm_command if client == "guidellm" else aiperf_command
                    command = build(peers[client], base=base, tok=tok, streams=streams, requests=requests,
                                    prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens, work=work)
                result = measure(client, streams, command, base=base, log=work / f"{client}-{streams}.log",
                                 cpu=a.client_cpu if pin else None, timeout_s=a.run_timeout,
                                 env=env if client == "soak" else None)
                results.append(result)
                print(f"client_overhead: {client} N={streams}: {result.wall_s:.0f} s, CPU {result.cpu_s:.1f} s, "
                      f"{result.tokens:,.0f} tokens, sustained {'yes' if result.sustained else 'no'}"
                      + (f" ({result.note})" if result.note else ""), flush=True)
    finally:
        if sim is not None and sim.poll() is None:
            sim.terminate()
            try:
                sim.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(sim.pid, signal.SIGKILL)
                sim.wait(5)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_results(results)
    verdict = print_ratios(results, clients)
    print("client_overhead: not measured: inference-perf (no installable distribution on PyPI here)")
    return 0 if verdict in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
