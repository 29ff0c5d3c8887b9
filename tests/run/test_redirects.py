"""Issue 32, "traffic only to the target": no outbound call of the harness ever
follows a redirect (soak/net.py holds it). A 3xx is the call's recorded outcome,
naming where it pointed (redacted), and nothing is sent there.

The property: for any 3xx status and any Location (another host, the same URL
(a loop), relative, scheme-relative, malformed, absent, carrying credentials),
every harness call makes exactly one request to the target, records the
redirect, and the second loopback server it points at receives nothing. The
real-process tests: ``soak run`` against a fake whose completions redirect to
another server, and one whose completions redirect to themselves."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopback_app import serve_any_path
from soak import net
from soak.clock import SystemClock
from soak.errors import TargetNotReady, TransportError

SECRET = "Sup3rS3cretRedirectTok"


class _Servers:
    """Two loopback servers on a thread of their own: the target, answering every
    request with the status and Location of the current example, and the place it
    points at, which must never be asked anything."""

    def __init__(self) -> None:
        self.status = 307
        self.location: str | None = None
        self.target_hits: list[str] = []
        self.elsewhere_hits: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        async def target(request: web.Request) -> web.Response:
            await request.read()
            self.target_hits.append(f"{request.method} {request.path_qs}")
            headers = {"Location": self.location} if self.location is not None else {}
            return web.Response(status=self.status, headers=headers, body=b"moved")

        async def elsewhere(request: web.Request) -> web.Response:
            await request.read()
            self.elsewhere_hits.append(f"{request.method} {request.path_qs}")
            return web.Response(status=200, text='data: [DONE]\n\n', content_type="text/event-stream")

        served = [await serve_any_path(handler) for handler in (target, elsewhere)]
        self._runners = [runner for runner, _ in served]
        self.target, self.elsewhere = [url for _, url in served]
        self.target_port, self.elsewhere_port = [urlsplit(url).port for _, url in served]

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def servers():
    s = _Servers()
    yield s
    s.close()


def _locations(elsewhere_port: int, target_port: int):
    other = f"http://127.0.0.1:{elsewhere_port}"
    same = f"http://127.0.0.1:{target_port}"
    paths = st.sampled_from(["/", "/v1/chat/completions", "/metrics", "/health", "/x/../y", "/a?b=c"])
    header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=60)
    return st.one_of(
        st.none(),  # a 3xx without a Location
        paths.map(lambda p: other + p),  # another server
        paths.map(lambda p: same + p),  # the same server: a loop
        paths,  # relative
        paths.map(lambda p: f"//127.0.0.1:{elsewhere_port}{p}"),  # scheme-relative, another server
        paths.map(lambda p: f"http://user:{SECRET}@127.0.0.1:{elsewhere_port}{p}?token={SECRET}x"),
        paths.map(lambda p: f"{other}{p}?X-Amz-Signature={SECRET}&sig={SECRET}"),
        header_text,  # anything printable, malformed or not
    )


class _Turn:
    session_id = None
    turn = None
    path = "/v1/chat/completions"
    body = b'{"model": "m", "messages": [], "stream": true}'
    planned_prompt_tokens = 3
    max_tokens = 4


async def _every_call(base: str) -> list[tuple[str, str]]:
    """Each outbound call of the harness once against ``base``: (call, what it recorded)."""
    from soak.report.push import push_run
    from soak.export.push_config import PushgatewayConfig
    from soak.load.client import StreamingClient
    from soak.load.config import TimeoutsConfig
    from soak.load.progress import ProgressTracker
    from soak.probes.gpu import DcgmGpuSource
    from soak.probes.metrics import MetricsProbe
    from soak.probes.target import HealthProbe
    from soak.respond.evidence import fetch_metrics
    from soak.run.readiness import wait_ready
    from soak.run.target_facts import read_version
    from soak.workload.counters import TargetCounter

    clock = SystemClock()
    out: list[tuple[str, str]] = []
    client = StreamingClient(base_url=base, timeouts=TimeoutsConfig(), tracker=ProgressTracker(), max_connections=4)
    async with client:
        record = await client.send(_Turn(), request_id="r1")
    out.append(("client", f"{record.outcome} {record.http_status} {record.error}"))
    async with net.session() as session:
        [health] = await HealthProbe(base, session=session, clock=clock).collect()
        out.append(("health", f"{health.ok} {health.error}"))
        [scrape] = await MetricsProbe(base, session=session, clock=clock).collect()
        out.append(("metrics", f"{scrape.ok} {scrape.error}"))
        gpu = await DcgmGpuSource(base + "/metrics", session=session, clock=clock).read()
        out.append(("dcgm", f"{gpu.error}"))
    counter = TargetCounter(base, "m")
    try:
        await counter.count_text("hello")
        out.append(("tokenize", "counted"))
    except TransportError as exc:
        out.append(("tokenize", str(exc)))
    finally:
        await counter.aclose()
    async with net.session() as session:
        answer = await read_version(session, base, api_key=None)
    out.append(("version", f"{answer.body} {answer.refused}"))
    try:
        await fetch_metrics(base, 5.0)
        out.append(("evidence", "fetched"))
    except net.RedirectRefused as exc:
        out.append(("evidence", str(exc)))
    try:
        await wait_ready(url=lambda: base, timeout_s=30, interval_s=0.05, headers={}, clock=clock)
        out.append(("readiness", "ready"))
    except TargetNotReady as exc:
        out.append(("readiness", str(exc)))
    try:
        await asyncio.to_thread(push_run, PushgatewayConfig(url=base, timeout=5), {"verdict": "pass"}, exit_code=0)
        out.append(("push", "pushed"))
    except net.RedirectRefused as exc:
        out.append(("push", str(exc)))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), status=st.integers(300, 399))
def test_no_harness_call_follows_a_redirect(servers, data, status):
    location = data.draw(_locations(servers.elsewhere_port, servers.target_port))
    servers.status, servers.location = status, location
    servers.target_hits.clear()
    servers.elsewhere_hits.clear()
    recorded = asyncio.run(_every_call(servers.target))
    assert servers.elsewhere_hits == [], f"a redirect was followed: {servers.elsewhere_hits}"
    # One request per call (readiness stops at its first answer: waiting cannot change a redirect).
    assert len(servers.target_hits) == len(recorded), (servers.target_hits, recorded)
    said = dict(recorded)
    assert said["client"].startswith(f"redirect {status} HTTP {status} redirect to ")
    for call in ("health", "metrics", "dcgm", "tokenize", "version", "evidence", "readiness", "push"):
        assert f"HTTP {status} redirect to" in said[call], (call, said[call])
    assert said["version"].startswith("None ")  # no version read through a redirect
    for text in said.values():
        assert SECRET not in text  # the Location is redacted where it is named
    if location is not None and location.isprintable():
        from soak.redact import Redactor

        assert Redactor().text(location)[:200] in said["client"]  # named as it came, redacted


def test_the_session_refuses_to_be_told_to_follow():
    async def go() -> None:
        async with net.session() as session:
            for name in ("allow_redirects", "max_redirects"):
                with pytest.raises(TypeError):
                    session.get("http://127.0.0.1:9/", **{name: True})

    asyncio.run(go())


# --- real processes --------------------------------------------------------------------------

class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def _any(self) -> None:
        type(self).hits.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = _any

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def elsewhere():
    """A loopback HTTP server that counts every request it gets."""
    handler = type("Counting", (_Counting,), {"hits": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.hits
    server.shutdown()
    server.server_close()


def _soak_run(tmp_path: Path, url: str) -> tuple[int, Path, str]:
    from soakrun_helpers import attached_config, soak_cmd, write_config

    path = write_config(tmp_path / "config.yaml", attached_config(url, duration="3s"))
    run_dir = tmp_path / "run"
    done = subprocess.run(soak_cmd("run", str(path), "--out", str(run_dir), "--no-html"), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    return done.returncode, run_dir, done.stderr


@pytest.mark.parametrize("mode", ["redirect_other", "redirect_loop"])
def test_soak_run_against_redirecting_completions_sends_nothing_elsewhere_and_fails(tmp_path, elsewhere, fake_vllm,
                                                                                     mode):
    dest_url, dest_hits = elsewhere
    url = fake_vllm(mode, env={"FAKE_REDIRECT_TO": dest_url}).url
    code, run_dir, stderr = _soak_run(tmp_path, url)
    assert dest_hits == [], f"the harness sent {len(dest_hits)} requests elsewhere: {dest_hits[:3]}"
    assert code == 1, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    assert "redirect" in summary.get("reason", "") or "redirect" in json.dumps(summary.get("criteria", {})), summary
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    finished = [r for r in records if r["outcome"] != "aborted"]
    assert finished and all(r["outcome"] == "redirect" for r in finished), {r["outcome"] for r in records}
    assert all(300 <= r["http_status"] < 400 and "redirect to " in r["error"] for r in finished)
    if mode == "redirect_other":
        assert all(dest_url in r["error"] for r in finished)
    else:
        # The fake numbers each POST it gets in its Location: each request was sent once, never re-sent.
        # A followed loop would use ten numbers a record; a cut request may leave one unseen.
        numbers = [int(r["error"].split("n=")[1].split()[0]) for r in finished]
        assert len(set(numbers)) == len(numbers) and max(numbers) <= len(numbers) + 3, sorted(numbers)


def test_every_outbound_http_call_of_the_harness_is_made_by_soak_net():
    """The one place: a new caller that opens its own aiohttp session or urllib
    opener (and with it, a default that follows redirects) fails here. The
    simulator is a server, not the harness."""
    import re

    root = Path(__file__).resolve().parents[2] / "soak"
    pattern = re.compile(r"ClientSession\(|aiohttp\.request\(|urlopen\(|build_opener\(|HTTPS?Connection\(|"
                         r"push_to_gateway\(")
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "net.py" or rel.startswith("sim/"):
            continue
        text = path.read_text(encoding="utf-8")
        for match in pattern.finditer(text):
            if match.group(0) == "push_to_gateway(" and "handler=push_handler(" in text[match.end():match.end() + 300]:
                continue  # prometheus_client's push, with soak.net's handler
            line = text.count("\n", 0, match.start()) + 1
            offenders.append(f"soak/{rel}:{line}: {match.group(0)}")
    assert offenders == []


def test_soak_run_with_redirecting_probes_sends_nothing_elsewhere_and_names_the_location(tmp_path, elsewhere,
                                                                                         fake_vllm):
    dest_url, dest_hits = elsewhere
    url = fake_vllm("redirect_probes", env={"FAKE_REDIRECT_TO": dest_url}).url
    code, run_dir, stderr = _soak_run(tmp_path, url)
    assert dest_hits == [], f"the harness sent {len(dest_hits)} requests elsewhere: {dest_hits[:3]}"
    assert (run_dir / "summary.json").exists(), stderr
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    assert any(e["type"] == "warning" and "GET /version: HTTP 302 redirect to " + dest_url in e["message"]
               for e in events), [e for e in events if e["type"] == "warning"]
    samples = "".join(p.read_text() for p in sorted(run_dir.glob("samples*.jsonl")))
    assert f"HTTP 302 redirect to {dest_url}/metrics" in samples

