"""A server the harness starts and owns (``ProcessTarget``): the simulator
(``python -m soak sim --port 0 --port-file ...``) or a launched vLLM, run as the
harness's child in its own session (so a Ctrl-C at the terminal reaches the
harness, which then stops the server in order), its output redacted on its way to
``server.log``; a daemonizing command's server followed by the run's marker;
stopped, its whole tree, by the one kill path.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Mapping, Sequence

from soak.clock import Clock, SystemClock
from soak.errors import TargetNotReady
from soak.redact import LineRedactor, Redactor
from soak.proc import identity as ident
from soak.proc.belonging import Proof, TargetIdentity, decide
from soak.proc.cgroup import Cgroup
from soak.proc.cgroup import create as make_cgroup
from soak.proc.cgroup import remove_empty_leftovers
from soak.proc.facts import MARKER_VARIABLE, OWNER_VARIABLE, Pin, owner_stamp
from soak.proc.kill import KillResult, clean_leftovers, group_stragglers, kill_processes, signal_if_allowed
from soak.proc.read import BOOT_CLOCK, pin_of, read_table, running
from soak.proc.tree import ProcessTree
from soak.run.readiness import SERVER_LOG, wait_ready
from soak.target.launch import LaunchSpec

if TYPE_CHECKING:
    from soak.run.guardian import Guardian


class ProcessTarget:
    """A server the harness starts and owns: the simulator or a launched vLLM."""

    def __init__(
        self,
        *,
        command: Sequence[str],
        what: str,
        run_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        base_url: str | None = None,
        port_file: Path | None = None,
        startup_timeout_s: float,
        poll_interval_s: float,
        stop_timeout_s: float,
        api_key: str | None = None,
        flight_recorder_pipe_stem: str | None = None,
        clock: Clock | None = None,
        restart_command: Callable[["ProcessTarget"], Sequence[str]] | None = None,
        redactor: Redactor | None = None,
        guardian: Guardian | None = None,
        on_log_error: Callable[[BaseException], None] | None = None,
        on_waiting: Callable[[str], None] | None = None,
    ) -> None:
        self._on_waiting = on_waiting  # why it is not ready yet (wait_ready), one line
        self._redactor = redactor or Redactor()
        self._guardian = guardian
        self._on_log_error = on_log_error
        self._pump: threading.Thread | None = None
        self.identity: Pin | None = None
        self._command = list(command)
        self._restart_command = restart_command
        self._what = what
        self._env = dict(env or {})
        if MARKER_VARIABLE in self._env:
            # Beside the marker, who set it: a later run tells a leftover (its harness
            # gone) from another live run's server by this (soak.proc.belonging).
            self._env[OWNER_VARIABLE] = _harness_stamp()
        # Processes of dead harnesses cleaned before the first start (reported by the run).
        self.leftovers: list[dict] = []
        self._cwd = cwd
        self._port_file = port_file
        self._fixed_url = base_url
        self.base_url = base_url or ""
        self.log_path: Path | None = Path(run_dir) / SERVER_LOG
        self.flight_recorder_pipe_stem = flight_recorder_pipe_stem
        self.models: tuple[str, ...] = ()
        self._startup_timeout_s = startup_timeout_s
        self._poll_interval_s = poll_interval_s
        self._stop_timeout_s = stop_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clock = clock or SystemClock()
        self._proc: asyncio.subprocess.Process | None = None
        # Every process of the server seen since its start (soak.proc.tree): a
        # worker whose parent died is reparented, and only this record still knows it.
        self._tree = ProcessTree()
        # A daemonizing command's server, adopted by the run's marker once it
        # serves the URL (the command itself exited 0).
        self._adopted: Pin | None = None
        self._daemonized = False
        # The server's own cgroup, where one can be made (soak.proc.cgroup); per start.
        self.cgroup: Cgroup | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0
        self._closed = False

    def _launch_env(self) -> dict[str, str]:
        """The server's environment: the harness's own, under the launch's (``server_env``, marker)."""
        return {**os.environ, **self._env}

    def launch_spec(self) -> LaunchSpec:
        """What the first start runs, as the launcher builds it (the build identity reads
        its executable, script, packages and library paths: soak.target.launch)."""
        return LaunchSpec(command=tuple(self._command), env=self._launch_env(),
                          cwd=str(self._cwd) if self._cwd else None)

    @property
    def root_pid(self) -> int | None:
        if self._adopted is not None:
            return self._adopted.pid
        return self._proc.pid if self._proc is not None else None

    def returncode(self) -> int | None:
        if self._adopted is not None:
            return None  # not our child: the process probe reads its liveness from /proc
        return self._proc.returncode if self._proc is not None else None

    def _exited_before_ready(self) -> int | None:
        """The launched command's exit code, unless it exited 0 leaving processes
        under the run's marker: a daemonizing command (``setsid -f``, a service
        wrapper), followed by its marker while its server comes up."""
        code = self.returncode()
        if code != 0:
            return code
        if self._marked():
            self._daemonized = True
            return None
        return code

    def _url_now(self) -> str | None:
        if self._fixed_url is not None:
            return self._fixed_url
        try:
            text = self._port_file.read_text().strip() if self._port_file else ""
        except OSError:
            return None
        return f"http://127.0.0.1:{int(text)}" if text.isdigit() else None

    async def start(self) -> None:
        if self._closed:
            raise RuntimeError("target is closed")
        command = self._command
        if self.starts and self._restart_command is not None:
            command = self._restart_command(self)
        if self._port_file is not None:
            self._port_file.unlink(missing_ok=True)
        if not self.starts and MARKER_VARIABLE in self._env:
            # A night that died without cleaning up must not poison this one: what
            # carries this harness's marker and outlived its harness goes first.
            cleaned = await asyncio.to_thread(clean_leftovers)
            self.leftovers.extend(_leftover_notes(cleaned))
            self.leftovers.extend({"cgroup_removed": name} for name in await asyncio.to_thread(remove_empty_leftovers))
        if self._fixed_url is not None:
            # A leftover server on the port would answer /health for us: refuse
            # before anything starts, naming it.
            await asyncio.to_thread(ident.verify_launch_port, self._fixed_url)
        if self._log is None:
            self._log = open(self.log_path, "ab", buffering=0)  # type: ignore[arg-type]
        self._write_log(f"--- soak: starting {self._what}: {' '.join(command)}\n".encode())
        env = self._launch_env()
        # The server's output goes through the harness (one line at a time, redacted)
        # on its way to server.log; a pipe, so nothing the server prints lands unredacted.
        marker = self._env.get(MARKER_VARIABLE)
        # A command that cannot run is left unwrapped, so its start fails with its own error.
        wrap = marker and _runnable(command[0], env.get("PATH"), self._cwd)
        self.cgroup = await asyncio.to_thread(
            lambda: make_cgroup(marker, owner=self._env.get(OWNER_VARIABLE))) if wrap else None
        spawn = self.cgroup.wrap(command) if self.cgroup is not None else command
        read_fd, write_fd = os.pipe()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *spawn,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=str(self._cwd) if self._cwd else None,
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            os.close(read_fd)
            raise TargetNotReady(f"cannot start {self._what}: {exc}") from exc
        finally:
            os.close(write_fd)
        self._pump = threading.Thread(target=self._pump_output, args=(read_fd,), name="soak-server-log", daemon=True)
        self._pump.start()
        if self._guardian is not None:
            self._guardian.watch(self._proc.pid)
            if self.cgroup is not None:
                self._guardian.watch_cgroup(self.cgroup)
        self._tree = ProcessTree()
        self._adopted, self._daemonized = None, False
        self.identity = pin_of(self._proc.pid)
        self.starts += 1
        try:
            self.base_url, self.models = await wait_ready(
                url=self._url_now,
                timeout_s=self._startup_timeout_s,
                interval_s=self._poll_interval_s,
                headers=self._headers,
                clock=self._clock,
                exited=self._exited_before_ready,
                what=self._what,
                on_waiting=self._on_waiting,
            )
            if self._daemonized:
                await asyncio.to_thread(self._adopt_daemon)
        except TargetNotReady:
            # Never ready: what the command left under the run's marker goes with it.
            await self._stop()
            raise
        if not self._daemonized:
            # Whoever answered must be ours (a server that came up on the port meanwhile is not).
            await asyncio.to_thread(ident.verify_launched_listener, self.base_url, self._proc.pid)
        await asyncio.to_thread(self._tree.snapshot, self.root_pid if self._adopted else self._own_pid(self._proc))

    @staticmethod
    def _own_pid(proc: asyncio.subprocess.Process) -> int | None:
        # Until it is reaped (returncode set) the number is ours, a zombie at worst;
        # after, it may be anyone's, and the tree must not adopt a stranger as root.
        return proc.pid if proc.returncode is None else None

    def _identity(self) -> TargetIdentity:
        """What proves a process is this server's: the run's marker, the root pinned at
        start, every process recorded in its tree, the session the root leads."""
        identity = self.identity
        return TargetIdentity(
            Proof.LAUNCHED,
            marker=self._env.get(MARKER_VARIABLE),
            root=identity,
            members=self._tree.pins(),
            session=self._proc.pid if self._proc is not None and self._adopted is None else None,
            cgroup=self.cgroup.name if self.cgroup is not None else None,
        )

    def _marked(self) -> tuple:
        """Every live process found by the run's marker or in its cgroup, now or before."""
        marker = self._env.get(MARKER_VARIABLE)
        if not marker:
            return ()
        self._tree.find_marked((MARKER_VARIABLE, marker))
        if self.cgroup is not None:
            self._tree.adopt(self.cgroup.pids(), via="cgroup")
        return tuple(info for info in self._tree.known()
                     if info.via in ("marker", "cgroup") and running(info.pin))

    def _adopt_daemon(self) -> None:
        """The daemon that answered becomes the root: the listener on the URL's
        port, which must carry this run's marker (``belonging.decide``); anything
        else on the port is a stranger and the run refuses (exit 3)."""
        port = ident.url_port(self.base_url)
        table = read_table()
        owners = table.listeners(port) if port is not None else ()
        identity = self._identity()
        ours = [o for o in owners if decide(o.pid, o.create_time, table, identity).allowed]
        if not owners or len(ours) != len(owners) or port in table.unseen_listeners:
            there = ", ".join(ident.describe(o.pid) for o in owners if o not in ours) or "a process this user cannot see"
            raise ident.TargetMismatch(
                f"{self.base_url} is served by {there}, not by the server the launched command daemonized: "
                "refusing to drive it"
            )
        # The oldest of the marked listeners leads (a server with SO_REUSEPORT workers).
        root = min(ours, key=lambda o: o.create_time)
        self._adopted = root.pin
        self.identity = self._adopted
        self._write_log(f"--- soak: the command daemonized; following its server pid {root.pid} by the run's marker\n"
                        .encode())
        if self._guardian is not None:
            self._guardian.watch(root.pid)

    def _terminate_adopted(self) -> bool:
        """SIGTERM to the adopted daemon (a graceful stop, as its own child would
        get), only if ``decide`` still allows it; whatever is left is SIGKILLed after."""
        adopted = self._adopted
        if adopted is None:
            return False
        return signal_if_allowed(adopted.pid, adopted.create_time, signal.SIGTERM, target=self._identity()).allowed

    def _write_log(self, data: bytes) -> None:
        if self._log is None or not data:
            return
        try:
            self._log.write(self._redactor.bytes(data))
        except (OSError, ValueError) as exc:
            if self._on_log_error is not None:
                self._on_log_error(exc)

    def _pump_output(self, read_fd: int) -> None:
        lines = LineRedactor(self._redactor)
        failed = False
        with open(read_fd, "rb", buffering=0) as pipe:
            while True:
                try:
                    data = pipe.read(65536)
                except OSError:
                    break
                if not data:
                    break
                out = lines.feed(data)
                if out and not failed:
                    failed = not self._write_raw(out)
            tail = lines.flush()
            if tail and not failed:
                self._write_raw(tail)

    def _write_raw(self, data: bytes) -> bool:
        """Already redacted; a write failure is reported once and the rest drained
        (the server must never block on a full pipe)."""
        log = self._log
        if log is None:
            return False
        try:
            log.write(data)
            return True
        except (OSError, ValueError) as exc:
            if self._on_log_error is not None and not isinstance(exc, ValueError):
                self._on_log_error(exc)
            return False

    async def restart(self) -> None:
        """Stop what is left of the old server (the responder has usually killed
        it already), then start and wait for it again."""
        await self._stop()
        await self.start()

    async def _stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            # Record the tree first: a worker can outlive and leave its parent.
            await asyncio.to_thread(self._tree.snapshot, proc.pid)
            # Our unreaped child, so the number is ours; still asked, as every signal is.
            if self.identity is not None and self._adopted is None:
                await asyncio.to_thread(signal_if_allowed, proc.pid, self.identity.create_time, signal.SIGTERM,
                                        target=self._identity())
            else:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
            except asyncio.TimeoutError:
                pass
        # Whatever of the record is left, reparented workers included, and whatever
        # carries the run's marker (a process that left the session: setsid, a
        # daemon); the one kill path, soak.proc.kill, asks belonging.decide.
        if self._adopted is not None and await asyncio.to_thread(self._terminate_adopted):
            deadline = self._clock.monotonic() + self._stop_timeout_s
            while running(self._adopted) and self._clock.monotonic() < deadline:
                await asyncio.sleep(0.05)
        members = await asyncio.to_thread(self._tree.snapshot, self._own_pid(proc))
        if self._adopted is not None and running(self._adopted):
            members = (*members, *await asyncio.to_thread(self._tree.snapshot, self._adopted.pid))
        marked = await asyncio.to_thread(self._marked)
        if members or marked:
            await asyncio.to_thread(kill_processes, (*members, *marked), target=self._identity(), timeout_s=10.0)
        if proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except asyncio.TimeoutError:
                pass
        # ...and the group's stragglers never seen, one by one: never killpg a reaped root's number.
        stragglers = await asyncio.to_thread(group_stragglers, proc.pid)
        if stragglers:
            await asyncio.to_thread(kill_processes, stragglers, target=self._identity(), timeout_s=10.0)
        if self.cgroup is not None:
            # The kernel removes it only once it is empty: a survivor keeps it (and its proof) alive.
            await asyncio.to_thread(self._remove_cgroup, self.cgroup)

    def _remove_cgroup(self, cgroup: Cgroup) -> None:
        deadline = self._clock.monotonic() + 2.0
        while not cgroup.remove() and cgroup.pids() == () and self._clock.monotonic() < deadline:
            time.sleep(0.02)  # the last member is exiting: the kernel lets go of it a moment later

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stop()
        finally:
            pump, self._pump = self._pump, None
            if pump is not None:
                # The tree is gone, so the pipe reaches EOF; a straggler holding it is not waited for.
                await asyncio.to_thread(pump.join, 2.0)
            if self._log is not None:
                self._log.close()


def _runnable(program: str, path: str | None, cwd: Path | None) -> bool:
    import shutil

    if os.sep in program:
        full = Path(program) if os.path.isabs(program) or cwd is None else Path(cwd) / program
        return full.is_file() and os.access(full, os.X_OK)
    return shutil.which(program, path=path) is not None


def _harness_stamp() -> str:
    me = pin_of(os.getpid())
    # Unreadable (a /proc without us): no stamp, and a later run never takes our server for a leftover.
    return owner_stamp(me.pid, me.create_time, boot_clock=BOOT_CLOCK) if me is not None else ""


def _leftover_notes(result: KillResult) -> list[dict]:
    from soak.redact import clip

    # redacted whole, then cut (soak.redact.clip): a cut first could split a secret past every rule
    return [{"pid": info.pid, "cmdline": clip(" ".join(info.cmdline), 200), "started_since_boot_s": info.create_time}
            for info in result.killed] + [{"note": note} for note in result.notes]
