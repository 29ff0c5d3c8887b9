"""The correctness oracle against vLLM's CPU build (issue 49): facts, then detection.

    # is greedy reproducible here? near ties, logprob noise, the top-1/top-2 gaps
    flock /tmp/soak-real-vllm.lock .venv/bin/python bench/oracle_real_vllm.py facts \
        --port 8141 [--alone 12] [--loaded 12] [--load 6] [--json /tmp/h7/facts.json] [--record DIR]
    # the same canary before and after SOAK_VLLM_FAULT=extra_send:rank=0:step=N
    flock /tmp/soak-real-vllm.lock .venv/bin/python bench/oracle_real_vllm.py fault \
        --port 8141 --step 200 [--json ...] [--record DIR]
    # speculative decoding (ngram) on the CPU build: what runs, /metrics spec_decode_*
    flock /tmp/soak-real-vllm.lock .venv/bin/python bench/oracle_real_vllm.py spec --port 8141 --pp 2
    # a soak run with extra_send: time and canaries from the fault to the corruption
    flock /tmp/soak-real-vllm.lock .venv/bin/python bench/oracle_real_vllm.py detect \
        --port 8141 --step 2000 [--out /tmp/h7/detect] [--duration 6m] [--oracle JSON] [--no-fit]

Each mode launches ``scripts/real-vllm serve --pp N --port P`` in a process group
of its own and kills that group when done (``facts``/``fault``/``spec``), or lets
``soak run`` launch it (``detect``). Every request loop is bounded in count and
time. The analysis (``compare_runs``, ``gaps``) is pure and read by
tests/real_vllm/test_real_vllm_oracle.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from soak.oracle.answer import Answer, answer_from_body  # noqa: E402

MODEL = "tiny-llama"
MARK = "SOAK_FAULT_INJECTED"
MAX_BODY = 4 << 20  # a canary's answer with 32 x 5 alternatives is a few tens of KB
SYSTEM = "You are a careful assistant. Answer in one short paragraph."
CANARY_PROMPTS = (
    "List three prime numbers and say why each is prime.",
    "def fib(n):\n    # complete this function\n",
    "Translate 'the quick brown fox' into French, then into German.",
)


def canary_body(prompt: str, *, max_tokens: int = 32, top: int = 5, ignore_eos: bool = True) -> dict:
    """The greedy request the canary probe sends: temperature 0, a fixed seed, logprobs with
    top alternatives (ignore_eos: every answer has all its positions, so runs compare position by position)."""
    return {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
            "temperature": 0, "seed": 0, "logprobs": True, "top_logprobs": top, "max_tokens": max_tokens,
            "ignore_eos": ignore_eos}


def post(base: str, path: str, body: dict, *, timeout: float = 120.0) -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY)


def get(base: str, path: str, *, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            return resp.status, resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY)
    except (OSError, urllib.error.URLError):
        return 0, b""


# ---------------------------------------------------------------- analysis (pure)

@dataclass(frozen=True)
class Divergence:
    """Where an answer first differs from the reference, and the logprob gaps there."""

    position: int
    ref_token: str
    got_token: str
    ref_gap: float | None  # reference's chosen logprob - its logprob of the answer's token (None: not in its top)
    got_gap: float | None  # answer's chosen logprob - its logprob of the reference's token


def _lp_of(top: tuple[tuple[str, float], ...], token: str) -> float | None:
    return next((lp for t, lp in top if t == token), None)


def first_divergence(ref: Answer, got: Answer) -> Divergence | None:
    for i, (a, b) in enumerate(zip(ref.tokens, got.tokens)):
        if a.token != b.token:
            ra, gb = _lp_of(a.top, b.token), _lp_of(b.top, a.token)
            return Divergence(i, a.token, b.token,
                              None if ra is None or a.logprob is None else a.logprob - ra,
                              None if gb is None or b.logprob is None else b.logprob - gb)
    if len(ref.tokens) != len(got.tokens):
        i = min(len(ref.tokens), len(got.tokens))
        return Divergence(i, ref.tokens[i].token if i < len(ref.tokens) else "",
                          got.tokens[i].token if i < len(got.tokens) else "", None, None)
    return None


def gaps(answer: Answer) -> list[float]:
    """Top-1 minus top-2 logprob at each position (how close every position is to a tie)."""
    out = []
    for t in answer.tokens:
        lps = sorted((lp for _, lp in t.top), reverse=True)
        if len(lps) >= 2:
            out.append(lps[0] - lps[1])
    return out


def compare_runs(ref: Answer, answers: list[Answer], *, tie_margin: float = 0.2) -> dict:
    """How a set of answers to the same greedy request agree with the reference: identical
    share, the first divergences, the logprob noise at matched positions (same prefix, same
    token), and the reference's top-1/top-2 gaps."""
    same, divergences, deltas = 0, [], []
    for got in answers:
        d = first_divergence(ref, got)
        same += d is None
        upto = len(ref.tokens) if d is None else d.position
        for a, b in zip(ref.tokens[:upto], got.tokens[:upto]):
            if a.logprob is not None and b.logprob is not None:
                deltas.append(b.logprob - a.logprob)
        if d is not None:
            divergences.append(d)
    all_gaps = gaps(ref)
    return {
        "answers": len(answers), "identical": same,
        "divergences": [d.__dict__ for d in divergences],
        "explained_by_margin": sum(1 for d in divergences if any(g is not None and g <= tie_margin
                                                                  for g in (d.ref_gap, d.got_gap))),
        "sigma": statistics.pstdev(deltas) if len(deltas) > 1 else 0.0,
        "max_abs_delta": max((abs(x) for x in deltas), default=0.0),
        "matched_positions": len(deltas),
        "gap_min": min(all_gaps, default=math.nan), "gap_median": statistics.median(all_gaps) if all_gaps else math.nan,
        "gap_share_below_margin": (sum(g <= tie_margin for g in all_gaps) / len(all_gaps)) if all_gaps else math.nan,
        "chosen_logprob_median": statistics.median([t.logprob for t in ref.tokens if t.logprob is not None] or [math.nan]),
    }


# ---------------------------------------------------------------- the server

@contextlib.contextmanager
def served(port: int, *, pp: int = 2, env: dict | None = None, extra: list[str] | None = None,
           log: Path, start_s: float = 900.0) -> Iterator[str]:
    """`scripts/real-vllm serve` in a process group of its own, killed (the whole group) on the way out."""
    cmd = [str(REPO / "scripts" / "real-vllm"), "serve", "--pp", str(pp), "--port", str(port)]
    if extra:
        cmd += ["--", *extra]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
            if get(base, "/health", timeout=2)[0] == 200 and get(base, "/v1/models", timeout=5)[0] == 200:
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"the server was not ready in {start_s:.0f} s")
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left (workers, tracker)
        proc.wait(timeout=30)


class Load:
    """K threads sending other chat requests (longer prompts, sampled, varied lengths) until stopped:
    the batches the canaries share. Bounded: each thread stops after ``max_each`` requests or at stop."""

    def __init__(self, base: str, k: int, *, seed: int = 1, max_each: int = 500) -> None:
        self.base, self.k, self.stop, self.sent, self.failed = base, k, threading.Event(), 0, 0
        self._threads = [threading.Thread(target=self._run, args=(seed + i, max_each), daemon=True) for i in range(k)]

    def _run(self, seed: int, max_each: int) -> None:
        rng = random.Random(seed)
        words = [f"w{rng.randrange(5000)}" for _ in range(4000)]
        for _ in range(max_each):
            if self.stop.is_set():
                return
            n = rng.randrange(50, 1500)
            body = {"model": MODEL, "messages": [{"role": "user", "content": " ".join(rng.choices(words, k=n))}],
                    "temperature": 0.8, "max_tokens": rng.randrange(8, 64), "ignore_eos": True}
            status, _ = post(self.base, "/v1/chat/completions", body, timeout=300)
            self.sent += 1
            self.failed += status != 200

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        time.sleep(2)  # the first of them in the engine before the canaries go
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=300)


def ask(base: str, body: dict, path: str = "/v1/chat/completions") -> tuple[Answer, bytes, float]:
    t0 = time.monotonic()
    status, raw = post(base, path, body)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
    return answer_from_body(json.loads(raw)), raw, time.monotonic() - t0


def _print_stats(label: str, stats: dict) -> None:
    print(f"  {label}: {stats['identical']}/{stats['answers']} identical, sigma {stats['sigma']:.2e} nats "
          f"(max |d| {stats['max_abs_delta']:.2e}, {stats['matched_positions']} positions), ref gap min "
          f"{stats['gap_min']:.3f} median {stats['gap_median']:.3f}, share <= margin {stats['gap_share_below_margin']:.2f}")
    for d in stats["divergences"]:
        print(f"    diverged at {d['position']}: ref {d['ref_token']!r} got {d['got_token']!r}, "
              f"gaps ref {d['ref_gap']} got {d['got_gap']}")


def cmd_facts(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {"prompts": {}}
    with served(args.port, log=args.tmp / "facts-server.log") as base:
        ask(base, canary_body(CANARY_PROMPTS[0]))  # warm: the first request compiles
        for p_i, prompt in enumerate(CANARY_PROMPTS[:args.prompts]):
            body = canary_body(prompt, max_tokens=args.max_tokens)
            ref, raw_ref, _ = ask(base, body)
            alone = [ask(base, body) for _ in range(args.alone)]
            with Load(base, args.load) as load:
                loaded = [ask(base, body) for _ in range(args.loaded)]
            entry = {"alone": compare_runs(ref, [a for a, _, _ in alone]),
                     "loaded": compare_runs(ref, [a for a, _, _ in loaded]),
                     "load_requests": load.sent, "load_failed": load.failed,
                     "latency_alone_s": statistics.median(t for _, _, t in alone),
                     "latency_loaded_s": statistics.median(t for _, _, t in loaded),
                     "ref_text": ref.text}
            report["prompts"][prompt] = entry
            print(f"prompt {p_i}: {prompt[:40]!r}  latency alone {entry['latency_alone_s']:.2f} s, "
                  f"loaded {entry['latency_loaded_s']:.2f} s ({load.sent} load requests, {load.failed} failed)")
            _print_stats("alone", entry["alone"])
            _print_stats("loaded", entry["loaded"])
            if args.record and p_i == 0:
                args.record.mkdir(parents=True, exist_ok=True)
                (args.record / "oracle_chat_healthy.json").write_bytes(raw_ref)
                diverged = [raw for a, raw, _ in alone + loaded if first_divergence(ref, a) is not None]
                (args.record / "oracle_chat_healthy_again.json").write_bytes(
                    diverged[0] if diverged else (loaded or alone)[-1][1])
        if args.record:
            status, raw = post(base, "/v1/completions", {"model": MODEL, "prompt": "def f(x):\n" * 10, "max_tokens": 12,
                                                          "temperature": 0, "seed": 0, "logprobs": 5, "ignore_eos": True})
            assert status == 200, raw[:300]
            (args.record / "oracle_completion_logprobs5.json").write_bytes(raw)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def stamps(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if MARK in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line.split(MARK, 1)[1]))
    return out


def cmd_fault(args: argparse.Namespace) -> int:
    """The same canaries, round after round, before and after extra_send fires at step N."""
    log = args.tmp / "fault-server.log"
    rounds: list[dict] = []
    fault = f"extra_send:rank=0:step={args.step}"
    with served(args.port, log=log, env={"SOAK_VLLM_FAULT": fault}) as base:
        bodies = [canary_body(p, max_tokens=args.max_tokens) for p in CANARY_PROMPTS[:args.prompts]]
        refs: list[Answer | None] = [None] * len(bodies)
        raws: dict[str, bytes] = {}
        for r in range(args.rounds):
            fired = bool(stamps(log))
            row = {"round": r, "fired_before": fired, "answers": []}
            for i, body in enumerate(bodies):
                try:
                    got, raw, took = ask(base, body)
                except (RuntimeError, OSError) as exc:
                    row["answers"].append({"prompt": i, "error": str(exc)[:300]})
                    continue
                if refs[i] is None and not fired:
                    refs[i] = got
                    raws.setdefault("healthy", raw)
                ref = refs[i]
                d = first_divergence(ref, got) if ref is not None else None
                if d is not None and fired:
                    raws.setdefault("corrupt", raw)
                    raws.setdefault("corrupt_ref", json.dumps({"prompt": i}).encode())
                row["answers"].append({"prompt": i, "took_s": round(took, 3), "divergence": d and d.__dict__,
                                       "text": got.text[:80]})
            rounds.append(row)
            print(json.dumps(row)[:600])
            if fired and r >= args.after_rounds_min and all(a.get("divergence") or a.get("error") for a in row["answers"]):
                pass
        print("stamps:", stamps(log))
        if args.record and "corrupt" in raws:
            args.record.mkdir(parents=True, exist_ok=True)
            (args.record / "oracle_chat_extra_send_healthy.json").write_bytes(raws["healthy"])
            (args.record / "oracle_chat_extra_send_corrupt.json").write_bytes(raws["corrupt"])
    if args.json:
        args.json.write_text(json.dumps({"fault": fault, "stamps": stamps(log), "rounds": rounds}, indent=1))
    return 0


def cmd_spec(args: argparse.Namespace) -> int:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                       "prompt_lookup_min": 2})
    log = args.tmp / f"spec-pp{args.pp}-server.log"
    try:
        with served(args.port, pp=args.pp, log=log, extra=["--speculative-config", spec], start_s=args.start_s) as base:
            prompt = "one two three four five six seven eight nine ten " * 8
            for _ in range(4):
                status, raw = post(base, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 48,
                                                              "temperature": 0, "ignore_eos": True})
                print("completion", status, raw[:200])
            body = canary_body(CANARY_PROMPTS[0])
            a, raw, _ = ask(base, body)
            b, _, _ = ask(base, body)
            print("greedy canary twice:", "identical" if first_divergence(a, b) is None else first_divergence(a, b))
            # against the same request answered without speculative decoding (a recorded fixture)
            from soak.oracle.compare import judge_answer

            reference = answer_from_body(json.loads(args.reference.read_bytes()))
            print("against the no-spec greedy answer:", judge_answer(reference, a, tie_margin=0.2).reason)
            status, metrics = get(base, "/metrics")
            lines = [ln for ln in metrics.decode(errors="replace").splitlines() if "spec_decode" in ln and not ln.startswith("#")]
            print("spec_decode lines:", *lines[:20], sep="\n  ")
            if args.record:
                args.record.mkdir(parents=True, exist_ok=True)
                (args.record / f"metrics_spec_decode_pp{args.pp}.txt").write_bytes(metrics)
                (args.record / f"oracle_chat_spec_ngram_pp{args.pp}.json").write_bytes(raw)
    except RuntimeError as exc:
        print(f"spec pp {args.pp}: FAILED: {exc}"[:4000])
        return 1
    return 0


# ---------------------------------------------------------------- detect: a soak run with extra_send

def detect_config(dest: Path, *, port: int, step: int, duration: str, oracle: dict | None = None,
                  concurrency: int | None = None, home: str | None = None, fit: bool = True) -> Path:
    """examples/real-vllm-oracle.yaml on ``port`` with SOAK_VLLM_FAULT=extra_send:rank=0:step=N:fit=1
    in target.env (and ``oracle`` fields over the example's), written to ``dest``. Without ``fit``
    vLLM raises at the first step whose token count differs from the one before: a crash under
    a mixed load, not a corruption (docs/real-vllm.md)."""
    import yaml

    example = REPO / "examples" / "real-vllm-oracle.yaml"
    config = yaml.safe_load(example.read_text())
    config["target"]["command"] = [str(REPO / "scripts" / "real-vllm"), "serve", "--pp", "2", "--port", str(port)]
    config["target"]["base_url"] = f"http://127.0.0.1:{port}"
    env = {"SOAK_VLLM_FAULT": f"extra_send:rank=0:step={step}" + (":fit=1" if fit else "")}
    if home:
        env["REAL_VLLM_HOME"] = home
    config["target"]["env"] = env
    config["workload"] = str((example.parent / config["workload"]).resolve())
    config["duration"] = duration
    config["oracle"] = {**config.get("oracle", {}), **(oracle or {})}
    if concurrency:
        config["load"]["concurrency"] = concurrency
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(config))
    return dest


def _jsonl(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def detection(out: Path) -> dict:
    """From a finished run directory: the fault's stamp, the corruption incident, the canaries
    (judged before the stamp, between the stamp and the detection) and their measured share."""
    summary = json.loads((out / "summary.json").read_text())
    stamp = next(iter(stamps(out / "server.log")), None)
    canaries = [s for s in _jsonl(out / "samples.jsonl") if s.get("kind") == "canary"]
    corruption = next((i for i in summary.get("incidents", []) if i.get("kind") == "corruption"), None)
    row: dict[str, Any] = {"verdict": summary.get("verdict"), "stamp": stamp, "incident": corruption,
                           "incidents": [(i.get("kind"), i.get("rule")) for i in summary.get("incidents", [])],
                           "canaries": len(canaries),
                           "verdicts": dict(Counter(str(c.get("verdict")) for c in canaries))}
    shares = [c["share"] for c in canaries if isinstance(c.get("share"), (int, float))]
    row["share_last"] = shares[-1] if shares else None
    row["share_max"] = max(shares) if shares else None
    if stamp and corruption:
        ts, detected = stamp["ts"], corruption["detected_at"]
        row["detect_s"] = detected - ts
        # judged after the fault fired, up to the one that decided (its verdict is judged at c["ts"])
        row["canaries_after_onset"] = sum(1 for c in canaries if ts <= c["ts"] <= detected + 1e-6)
        row["canaries_before_onset"] = sum(1 for c in canaries if c["ts"] < ts)
        row["onset_earliest_at"] = corruption.get("onset_earliest_at")
        row["onset_latest_at"] = corruption.get("onset_latest_at")
    return row


def cmd_detect(args: argparse.Namespace) -> int:
    out = args.out
    if out.exists():
        raise SystemExit(f"{out} exists: give --out a new folder")
    config = detect_config(out.parent / (out.name + ".yaml"), port=args.port, step=args.step, duration=args.duration,
                           oracle=json.loads(args.oracle), concurrency=args.concurrency, fit=not args.no_fit)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "soak", "run", str(config), "--out", str(out)], cwd=REPO,
                          timeout=3600)
    row = detection(out)
    row["exit"], row["wall_s"] = done.returncode, round(time.monotonic() - t0, 1)
    print(json.dumps(row, indent=1, default=str))
    (out / "oracle_detect.json").write_text(json.dumps(row, indent=1, default=str))
    return 0 if done.returncode == 1 and row.get("incident") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for name in ("facts", "fault", "spec", "detect"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, default=8141)
        p.add_argument("--tmp", type=Path, default=Path("/tmp/h7"))
        p.add_argument("--json", type=Path)
        p.add_argument("--record", type=Path, help="write response bodies as fixtures here")
        p.add_argument("--max-tokens", type=int, default=32)
        p.add_argument("--prompts", type=int, default=len(CANARY_PROMPTS))
    facts = sub.choices["facts"]
    facts.add_argument("--alone", type=int, default=12)
    facts.add_argument("--loaded", type=int, default=12)
    facts.add_argument("--load", type=int, default=6)
    fault = sub.choices["fault"]
    fault.add_argument("--step", type=int, default=200)
    fault.add_argument("--rounds", type=int, default=8)
    fault.add_argument("--after-rounds-min", type=int, default=2)
    spec = sub.choices["spec"]
    spec.add_argument("--pp", type=int, default=2)
    spec.add_argument("--start-s", type=float, default=600.0)
    spec.add_argument("--reference", type=Path, default=REPO / "tests" / "fixtures" / "real_vllm" / "oracle_chat_healthy.json",
                      help="the canary's answer without speculative decoding")
    detect = sub.choices["detect"]
    detect.add_argument("--step", type=int, default=2000)
    detect.add_argument("--out", type=Path, default=Path("/tmp/h7/detect"))
    detect.add_argument("--duration", default="6m")
    detect.add_argument("--oracle", default="{}", help="JSON: oracle: fields over the example's (default: its defaults)")
    detect.add_argument("--concurrency", type=int)
    detect.add_argument("--no-fit", action="store_true", help="extra_send as it is (crashes under a mixed load)")
    args = parser.parse_args(argv)
    args.tmp.mkdir(parents=True, exist_ok=True)
    return {"facts": cmd_facts, "fault": cmd_fault, "spec": cmd_spec, "detect": cmd_detect}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
