"""Issue 32, "secrets by pattern, everywhere": URL userinfo, query parameters
named like credentials, secret-named flags and variables, and the values of any
variable or flag that holds a URL with credentials never reach a file or a
stream of the harness (soak/redact.py decides; every write boundary calls it).

The property: a generated secret, planted in one of those shapes, in a config,
a launch command, an environment, a server log line, a metric label or a
header, passes the write boundaries (the run store's JSONL, config.yaml,
summary.json, a bundle file, the report's files, stdout/stderr) and is never in
what they wrote. The real-process tests: ``soak run`` with secrets in a launched
command's ``--db-url``, an environment value and a server's log, then every
file of the run directory (gz segments decompressed) and its stdout/stderr
grepped; userinfo in ``base_url`` refused with one line; a target that is never
ready says why at once."""

from __future__ import annotations

import gzip
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loopback_app import serve_any_path
from soak.redact import RedactingStream, Redactor
from soak.target.config import redact_target

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+!$*"
# Shaped like a credential (letters and digits both): a word alone ("uthoriza")
# can be a piece of the harness's own text, which no redactor may hide.
secrets_ = st.text(_ALPHABET, min_size=8, max_size=40).filter(
    lambda s: s[0].isalnum() and s[-1].isalnum() and len(set(s)) > 3
    and any(c.isdigit() for c in s) and any(c.isalpha() for c in s))

CREDENTIAL_PARAMS = ["token", "key", "api_key", "apikey", "password", "secret", "sig", "signature", "auth",
                     "access_token", "X-Amz-Signature", "X-Amz-Credential", "client_secret", "refresh_token",
                     "pwd", "jwt", "X-Goog-Signature", "sessionid", "AccessKey"]
# Outside a URL only the last-word rule names a secret: "signature" is also the
# harness's own word for a matched log line, so sig/signature/jwt are secret in URLs only.
NAMED_ANYWHERE = [p for p in CREDENTIAL_PARAMS if p.lower() not in ("sig", "signature", "x-amz-signature",
                                                                     "x-goog-signature", "pwd", "jwt", "sessionid")]
SCHEMES = ["http", "https", "postgres", "postgresql", "mysql", "redis", "amqp", "mongodb+srv", "s3"]


@st.composite
def planted(draw, secret: str) -> dict:
    """One secret in one shape, as the harness would meet it: a URL, an env value,
    a flag, a log line, a metric label, a header."""
    scheme = draw(st.sampled_from(SCHEMES))
    host = draw(st.sampled_from(["db.internal:5432", "127.0.0.1:8000", "example.com", "[::1]:9000"]))
    param = draw(st.sampled_from(CREDENTIAL_PARAMS))
    label = draw(st.sampled_from(NAMED_ANYWHERE))
    urls = [
        f"{scheme}://user:{secret}@{host}/db",
        f"{scheme}://{secret}:x-oauth-basic@{host}/r",
        f"{scheme}://svc:{secret}@{host}",
        f"{scheme}://{host}/path?{param}={secret}",
        f"{scheme}://{host}/p?a=1&{param}={secret}&b=2",
        f"{scheme}://{host}/p?x=y?{param}={secret}",
        f"{scheme}://u:{secret}@{host}/p?{param}={secret}",
    ]
    url = draw(st.sampled_from(urls))
    var = draw(st.sampled_from(["DB_URL", "DATABASE_URL", "REDIS", "UPSTREAM", "http_proxy", "CONN"]))
    flag = draw(st.sampled_from(["--db-url", "--database", "--upstream", "--model-source", "--proxy"]))
    secret_flag = draw(st.sampled_from(["--api-key", "--hf-token", "--db-password", "--client-secret"]))
    shape = draw(st.sampled_from(["url_text", "env", "flag", "flag_eq", "secret_flag", "log", "label",
                                  "header_bearer", "header_basic", "header_key", "secret_env"]))
    env: dict[str, str] = {}
    command = ["vllm", "serve", "m", "--port", "8000"]
    if shape == "env":
        env[var] = url
    elif shape == "secret_env":
        env["SERVICE_TOKEN"] = secret
    elif shape == "flag":
        command += [flag, url]
    elif shape == "flag_eq":
        command += [f"{flag}={url}"]
    elif shape == "secret_flag":
        command += [secret_flag, secret]
    lines = {
        "url_text": f"connecting to {url} now",
        "env": f"{var}={url}",
        "secret_env": f"SERVICE_TOKEN={secret}",
        "flag": f"args: {' '.join(command)}",
        "flag_eq": f"args: {command!r}",
        "secret_flag": f"non-default args: {{'{secret_flag.lstrip('-').replace('-', '_')}': '{secret}'}}",
        "log": f"INFO 01-01 engine: upstream {url} answered 200",
        "label": f'vllm:requests_total{{model="m",{label.replace("-", "_")}="{secret}"}} 3',
        "header_bearer": f"Authorization: Bearer {secret}",
        "header_basic": f"authorization: Basic {secret}",
        "header_key": f"X-Api-Key: {secret}",
    }
    return {"shape": shape, "env": env, "command": command, "line": lines[shape], "url": url}


def _leaks(secret: str, text: str, baseline: str) -> bool:
    """The secret, or any 8-character piece of it that the same outputs without
    the secret do not hold anyway (a piece such as ``launched`` is also template
    text), is in ``text``."""
    if secret in text:
        return True
    return any(secret[i:i + 8] in text and secret[i:i + 8] not in baseline for i in range(0, len(secret) - 7))


def _boundaries(plant: dict, tmp: Path) -> dict[str, str]:
    """What each write boundary writes of the planted shapes."""
    from soak.redact import LineRedactor

    environ = {"HOME": "/root", **plant["env"]}
    redactor = Redactor.for_run(environ=environ, command=plant["command"], env=plant["env"])
    line = plant["line"]
    outputs: dict[str, str] = {}
    # The run store's JSONL writers: a JSON line with the secret in a field.
    outputs["jsonl"] = redactor.text(json.dumps({"type": "event", "message": line, "url": plant["url"]}))
    outputs["text"] = redactor.text(line)
    outputs["url"] = redactor.text(plant["url"])
    # config.yaml: the target section (redact_target) then the store's structure pass.
    target = {"kind": "launched", "base_url": "http://127.0.0.1:8000", "command": plant["command"],
              "env": plant["env"]}
    outputs["config.yaml"] = yaml.safe_dump(redactor.structure(redact_target(target)))
    # A bundle file, the server log (by line), the report's files (scrubbed by shape).
    outputs["bundle"] = redactor.bytes(("cmdline: " + " ".join(plant["command"]) + "\n" + line).encode()).decode()
    pump = LineRedactor(redactor)
    data = line.encode()
    outputs["server.log"] = (pump.feed(data[:7]) + pump.feed(data[7:] + b"\n") + pump.flush()).decode()
    page = tmp / "report.html"
    page.write_text(f"<html><body><pre>{line}</pre><p>{plant['url']}</p></body></html>")
    Redactor().scrub_file(page, shapes=True)  # soak report's own redactor knows no values: shapes only
    outputs["report.html"] = page.read_text()
    # stdout/stderr: the CLI's redacting stream with the environment's redactor alone.
    sink = io.StringIO()
    stream = RedactingStream(sink, Redactor.for_run(environ=environ))
    stream.write(f"soak run: {line}\n")
    print(f"soak: warning: {plant['url']}", file=stream)
    outputs["stderr (environment only)"] = sink.getvalue()
    return outputs


def _replaced(obj, old: str, new: str):
    if isinstance(obj, str):
        return obj.replace(old, new)
    if isinstance(obj, dict):
        return {_replaced(k, old, new): _replaced(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replaced(v, old, new) for v in obj]
    return obj


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), secret=secrets_)
def test_a_planted_secret_never_passes_a_write_boundary(tmp_path_factory, data, secret):
    plant = data.draw(planted(secret))
    tmp = tmp_path_factory.mktemp("boundaries")
    baseline = "\n".join(_boundaries(_replaced(plant, secret, "Q9zQ9zQ9zQ9z"), tmp).values())
    assume(secret not in baseline)  # the secret is template text too: nothing to tell apart
    for where, text in _boundaries(plant, tmp).items():
        assert not _leaks(secret, text, baseline), f"{plant['shape']}: the secret reached {where}: {text!r}"


def test_a_secret_learned_later_is_hidden_on_the_stream_too():
    sink = io.StringIO()
    stream = RedactingStream(sink, Redactor.for_run(environ={}))
    run = Redactor.for_run(environ={}, command=["vllm", "--db-url", "postgres://u:LateSecret99@h/db"])
    stream.follow(run)
    stream.write("LateSecret99 alone\n")
    assert "LateSecret99" not in sink.getvalue()


# --- real processes ------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WRAPPER = """
import os, sys
# A launched server that prints what vLLM prints: its args and its environment's URL.
print("non-default args:", sys.argv[1:], flush=True)
print("DB_URL=" + os.environ.get("DB_URL", ""), flush=True)
print("INFO connecting to " + sys.argv[sys.argv.index("--db-url") + 1], flush=True)
print('vllm:requests_total{model="m",api_key="' + os.environ["PLANTED_KEY"] + '"} 1', flush=True)
port = sys.argv[sys.argv.index("--port") + 1]
os.execv(sys.executable, [sys.executable, "-m", "soak", "sim", "--host", "127.0.0.1", "--port", port,
                          "--config", sys.argv[sys.argv.index("--sim-config") + 1]])
"""


def _grep_tree(root: Path, needles: list[str]) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        for needle in needles:
            if needle.encode() in data:
                hits.append(f"{path.relative_to(root)}: {needle}")
    return hits


def test_soak_run_leaves_no_planted_secret_anywhere(tmp_path):
    from soakrun_helpers import small_config, soak_cmd, write_config

    secrets = {"flag": "FlagPw7x9Q2z", "env": "EnvPw3k8L1m", "harness_env": "HarnEnv5t6Y",
               "key": "sk-PlantedKey4411", "query": "QryTok8c2V", "push": "PushPw55xQ"}
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    sim_config = tmp_path / "sim.yaml"
    sim_config.write_text(yaml.safe_dump({"time_scale": 20}))
    port = _free_port()
    config = small_config(duration="3s")
    config["target"] = {
        "kind": "launched",
        "command": [sys.executable, str(wrapper), "--port", str(port), "--sim-config", str(sim_config),
                    "--db-url", f"postgres://soak:{secrets['flag']}@db.internal:5432/x?sslmode=require",
                    "--upstream", f"https://up.example/v1?token={secrets['query']}"],
        "env": {"DB_URL": f"postgresql://app:{secrets['env']}@db:5432/app", "PLANTED_KEY": secrets["key"]},
        "base_url": f"http://127.0.0.1:{port}",
        "startup_timeout": "60s",
        "flight_recorder": False,
    }
    config["workload"] = {**config["workload"], "tokenizer": {"kind": "estimate"}}
    config["probes"] = {"gpu": {"kind": "none"}}
    # A push that fails prints its URL on stderr and in the push_failed event.
    config["pushgateway"] = {"url": f"http://pusher:{secrets['push']}@127.0.0.1:{_free_port()}", "timeout": "2s"}
    path = write_config(tmp_path / "config.yaml", config)
    run_dir = tmp_path / "run"
    env = {**os.environ, "SOAK_STORE_URL": f"redis://:{secrets['harness_env']}@cache:6379/0", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(soak_cmd("run", str(path), "--out", str(run_dir)), capture_output=True, text=True,
                          timeout=180, env=env, stdin=subprocess.DEVNULL)
    assert (run_dir / "summary.json").exists(), done.stderr
    log = (run_dir / "server.log").read_text()
    assert "non-default args" in log and "INFO connecting to" in log  # the server did print them
    assert (run_dir / "report.html").exists()
    assert "push to http://***@127.0.0.1" in done.stderr, done.stderr  # said, without the password
    needles = list(secrets.values())
    assert _grep_tree(run_dir, needles) == []
    for stream in (done.stdout, done.stderr):
        assert not [n for n in needles if n in stream], stream


def test_userinfo_in_base_url_is_refused_with_one_line(tmp_path):
    from soakrun_helpers import small_config, soak_cmd, write_config

    for extra in ({}, {"api_key_env": "SOAK_TEST_KEY"}):
        config = small_config()
        config["target"] = {"kind": "attached", "base_url": "http://user:UiSecret77x@127.0.0.1:9/", **extra}
        path = write_config(tmp_path / "config.yaml", config)
        run_dir = tmp_path / f"run{len(extra)}"
        done = subprocess.run(soak_cmd("run", str(path), "--out", str(run_dir)), capture_output=True, text=True,
                              timeout=60, env={**os.environ, "SOAK_TEST_KEY": "k-1234567"}, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "target.base_url" in lines[0] and "credentials in the URL" in lines[0], lines
        assert "UiSecret77x" not in done.stderr + done.stdout
        assert not run_dir.exists() or _grep_tree(run_dir, ["UiSecret77x"]) == []


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 401

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def answering():
    servers = []

    def start(status: int) -> str:
        handler = type("Answer", (_Answer,), {"status": status})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _attached(tmp_path: Path, url: str) -> Path:
    from soakrun_helpers import small_config, write_config

    config = small_config()
    config["target"] = {"kind": "attached", "base_url": url, "startup_timeout": "30m", "ready_poll_interval": "0.5s"}
    config["workload"] = {**config["workload"], "tokenizer": {"kind": "estimate"}}
    config["probes"] = {"gpu": {"kind": "none"}}
    return write_config(tmp_path / "config.yaml", config)


def test_a_target_refusing_the_credentials_ends_the_wait_at_once_with_one_line(tmp_path, answering):
    from soakrun_helpers import soak_cmd

    url = answering(401)
    started = time.monotonic()
    done = subprocess.run(soak_cmd("run", str(_attached(tmp_path, url)), "--out", str(tmp_path / "run"), "--no-html"),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 60  # not the 30-minute start-up timeout
    last = done.stderr.strip().splitlines()[-1]
    assert "HTTP 401" in last and "credentials" in last, done.stderr


def test_a_target_that_is_not_ready_says_why_within_the_first_poll(tmp_path, harness):
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens: connection refused
    run_dir = tmp_path / "run"
    h = harness(_attached(tmp_path, url), run_dir)
    from soakrun_helpers import events, wait_for

    def said() -> bool:
        try:
            return any(e["type"] == "target_waiting" for e in events(run_dir))
        except (OSError, ValueError):
            return False

    started = time.monotonic()
    wait_for(said, 30, "a target_waiting event")
    waited = [e for e in events(run_dir) if e["type"] == "target_waiting"]
    assert "connection refused" in waited[0]["message"] and url in waited[0]["message"]
    assert time.monotonic() - started < 30
    wait_for(lambda: "not ready yet" in h.stdout_path.read_text(), 10, "the live view's line")


# --- a target that is never ready says why at its first poll --------------------------------------

class _Said(Exception):
    pass


@pytest.fixture(scope="module")
def behaving_server():
    """A loopback server whose /health and /v1/models answer what the example says."""
    import asyncio

    from aiohttp import web

    behaviour = {"health": 200, "models": 200, "hits": 0, "body": "ok"}
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict = {}

    async def answer(request: web.Request) -> web.Response:
        behaviour["hits"] += 1
        status = behaviour["health" if request.path == "/health" else "models"]
        if status == 200 and request.path == "/v1/models":
            if behaviour["body"] == "deep":  # past the nesting bound (soak.bounds)
                return web.Response(body=b'{"data": ' + b"[" * 1000 + b"]" * 1000 + b"}")
            if behaviour["body"] == "garbage":
                return web.Response(body=b"<html>not json</html>")
            return web.json_response({"data": [{"id": "m"}]})
        headers = {"Location": "http://127.0.0.1:9/elsewhere"} if 300 <= status < 400 else {}
        return web.Response(status=status, headers=headers)

    async def start() -> None:
        holder["runner"], holder["url"] = await serve_any_path(answer)

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10)
    yield holder["url"], behaviour
    asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


_STATUSES = st.one_of(st.just(200), st.integers(300, 399), st.sampled_from([401, 403, 404, 500, 502, 503]),
                      st.integers(400, 599))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(health=_STATUSES, models=_STATUSES, refused=st.booleans(), body=st.sampled_from(["ok", "deep", "garbage"]))
def test_readiness_is_ready_refused_or_says_why_after_its_first_poll(behaving_server, health, models, refused, body):
    import asyncio

    from soak.clock import SystemClock
    from soak.errors import TargetNotReady
    from soak.run.readiness import wait_ready

    url, behaviour = behaving_server
    behaviour.update(health=health, models=models, hits=0, body=body)
    base = f"http://127.0.0.1:{_free_port()}" if refused else url
    said: list[str] = []

    def on_waiting(line: str) -> None:
        said.append(line)
        raise _Said  # the first line is what matters: stop polling

    async def go() -> str:
        try:
            await wait_ready(url=lambda: base, timeout_s=1800, interval_s=30, headers={}, clock=SystemClock(),
                             what="the target", on_waiting=on_waiting)
            return "ready"
        except TargetNotReady as exc:
            return f"refused: {exc}"
        except _Said:
            return "said"

    outcome = asyncio.run(go())
    if refused:
        assert outcome == "said" and "connection refused" in said[0]
        return
    first_bad = next(((p, s) for p, s in (("/health", health), ("/v1/models", models)) if s != 200), None)
    if first_bad is None and body != "ok":  # a /v1/models past a bound or not JSON: the endpoint is named
        assert outcome == "said" and len(said) == 1 and said[0].count("/v1/models") == 1, said
        assert "\n" not in said[0]
        return
    if first_bad is None:
        assert outcome == "ready"
        return
    path, status = first_bad
    assert behaviour["hits"] <= 2  # one poll: /health, then /v1/models if /health was 200
    if 300 <= status < 400:
        assert outcome.startswith("refused") and "redirect" in outcome and f"HTTP {status}" in outcome
    elif status in (401, 403):
        assert outcome.startswith("refused") and f"HTTP {status}" in outcome and "credentials" in outcome
    else:
        assert outcome == "said" and len(said) == 1 and f"{path} answered HTTP {status}" in said[0]
        assert "\n" not in said[0]
