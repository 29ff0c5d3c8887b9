"""Simulator fixtures shared by every stage's tests.

``sim_process(*args, time_scale=..., env=...)`` starts ``python -m soak sim
--port 0 --port-file ...`` as a real subprocess (with the engine-core/worker
tree), waits for /health, and returns a ``SimProcess`` (``.base_url``,
``.pid``, ``.log_path``, ``.log_text()``, ``.state()``, ``.close()``). Every
process it started is killed at teardown, even after a failed test, from PIDs
recorded while the tree was alive (orphans included).

``sim_app(config=None, **overrides)`` runs ``create_app`` in-process on
aiohttp's TestServer (127.0.0.1, port 0) and returns an object with
``.base_url``, ``.server`` (the ``SimServer``) and ``.app``; pass ``log=SimLog(stream=io.StringIO(), pid=0)``
to capture the log lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterable

import pytest
from hypothesis import settings

# CI draws the same examples every run (a property that fails there fails again
# on a developer's machine with CI=true); locally each run explores new ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

READY_TIMEOUT_S = 60.0


def _http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


class SimProcess:
    """A running ``soak sim``; ``close()`` kills the whole tree and is idempotent."""

    def __init__(self, popen: subprocess.Popen, *, base_url: str, log_path: Path, log_file) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.base_url = base_url
        self.log_path = log_path
        self._log_file = log_file
        self._known: dict[int, float] = {}  # pid -> create time, so a reused PID is never killed
        self._closed = False

    def remember_tree(self) -> list[int]:
        """Record the current tree (API server, engine core, workers, even own-session ones)."""
        pids = [self.pid] + _descendants(self.pid)
        try:
            state = self.state()
            procs = state.get("processes", {})
            pids += [p for p in [procs.get("engine_core")] + list(procs.get("workers", [])) if p]
        except Exception:
            pass
        try:
            import psutil

            for pid in pids:
                if pid not in self._known:
                    try:
                        self._known[pid] = psutil.Process(pid).create_time()
                    except psutil.Error:
                        pass
        except ImportError:
            for pid in pids:
                self._known.setdefault(pid, 0.0)
        return sorted(set(pids))

    def state(self) -> dict:
        return _http_json(self.base_url + "/sim/state")

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive_pids(self) -> list[int]:
        return [pid for pid in self._known if _pid_alive(pid)]

    def kill_tree(self) -> None:
        """SIGKILL every recorded process (and any descendants still attached)."""
        self.remember_tree() if self.popen.poll() is None else None
        try:
            import psutil
        except ImportError:
            psutil = None
        for pid, created in list(self._known.items()):
            if psutil is not None:
                try:
                    proc = psutil.Process(pid)
                    if created and abs(proc.create_time() - created) > 0.01:
                        continue  # not ours any more
                except psutil.Error:
                    continue
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.kill_tree()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        while self.alive_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            self._log_file.close()
        except OSError:
            pass


def start_sim_process(tmp_dir: Path, args: Iterable[str] = (), *, time_scale: float | None = 20.0,
                      env: dict | None = None, processes: bool = True, wait_ready: bool = True) -> SimProcess:
    """Start ``soak sim`` and wait until /health answers 200 (or the process dies)."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(tmp_dir.glob("sim-*.log")))
    port_file = tmp_dir / f"sim-{n}.port"
    log_path = tmp_dir / f"sim-{n}.log"
    cmd = [sys.executable, "-m", "soak", "sim", "--port", "0", "--port-file", str(port_file)]
    if time_scale is not None:
        cmd += ["--time-scale", str(time_scale)]
    if not processes:
        cmd.append("--no-processes")
    cmd += list(args)
    log_file = open(log_path, "w", encoding="utf-8")
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env)
    proc = SimProcess(popen, base_url="", log_path=log_path, log_file=log_file)
    proc._known[popen.pid] = 0.0
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while not port_file.exists():
            if popen.poll() is not None:
                raise RuntimeError(f"soak sim exited with {popen.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"soak sim wrote no port file in {READY_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.02)
        port = int(port_file.read_text().strip())
        proc.base_url = f"http://127.0.0.1:{port}"
        while wait_ready:
            try:
                with urllib.request.urlopen(proc.base_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if popen.poll() is not None:
                raise RuntimeError(f"soak sim exited with {popen.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("soak sim never became healthy")
            time.sleep(0.02)
        proc.remember_tree()
    except BaseException:
        proc.close()
        raise
    return proc


@pytest.fixture
def sim_process(tmp_path):
    """Factory: ``sim = sim_process("--fault", "crash:at=5", time_scale=50)``; all closed at teardown."""
    created: list[SimProcess] = []

    def factory(*args: str, time_scale: float | None = 20.0, env: dict | None = None,
                processes: bool = True, wait_ready: bool = True) -> SimProcess:
        proc = start_sim_process(tmp_path / "sim", args, time_scale=time_scale, env=env,
                                 processes=processes, wait_ready=wait_ready)
        created.append(proc)
        return proc

    yield factory
    for proc in created:
        proc.close()


class SimApp:
    def __init__(self, app, test_server) -> None:
        from soak.sim.server import SIM_KEY

        self.app = app
        self.test_server = test_server
        self.server = app[SIM_KEY]
        self.base_url = str(test_server.make_url("")).rstrip("/")


@pytest.fixture
async def sim_app():
    """Factory (async): ``sim = await sim_app(time_scale=100, max_num_seqs=4)``; closed at teardown."""
    from aiohttp.test_utils import TestServer

    from soak.sim.app import create_app
    from soak.sim.config import SimConfig

    servers: list[TestServer] = []

    async def factory(config: SimConfig | None = None, *, clock=None, spawn_processes: bool = False, log=None,
                      **overrides) -> SimApp:
        if config is None:
            config = SimConfig(**{"time_scale": 100.0, "log_stats_interval": 0.0, **overrides})
        elif overrides:
            config = config.model_copy(update=overrides)
        app = create_app(config, clock=clock, spawn_processes=spawn_processes, log=log)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return SimApp(app, server)

    yield factory
    for server in servers:
        await server.close()


@pytest.fixture(scope="session")
def trace_make():
    """tests/fixtures/traces/make.py, the replay recorder (a script, not a package), loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trace_make", Path(__file__).parent / "fixtures" / "traces" / "make.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["trace_make"] = module  # its dataclasses look themselves up by module name
    spec.loader.exec_module(module)
    return module
