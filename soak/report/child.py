"""The report at a run's end, rendered in a child process.

Rendering imports scipy and matplotlib (about 3 CPU-seconds and 85 MB) and reads
the whole run again. In the harness process that cost lands on every run's end,
the memory stays in the harness, and a renderer that raises, hangs or runs out
of memory is the harness's problem. So ``soak run`` starts this child as the
load starts (it imports, then sleeps on its stdin: the run's end pays no
import), and once summary.json is written tells it to render. The child renders
from that summary.json (the run's one judgement), reading the records only for
its plots and tables:

    python -m soak.report.child RUN_DIR [--no-html]   # imports, then waits for "render" on stdin

(``--no-html``: junit.xml only, without plotting.)

The child renders on ``render``, and exits without writing anything when its
stdin closes first (the harness died or gave up). Whatever the child does, the
run's exit status stays the run's: a failure is a ``report_failed`` event, and
``soak report RUN_DIR`` renders again later.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

GO = b"render\n"
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ReportOutcome:
    ok: bool
    elapsed_s: float  # from the render request to the child's exit
    returncode: int | None
    error: str | None = None


class ReportChild:
    """One child per run. ``start()`` spawns it (a failure to spawn is kept, not
    raised), ``render()`` asks for the report and waits at most ``timeout_s``,
    ``aclose()`` (idempotent) ends a child that is still there."""

    def __init__(self, run_dir: Path, *, command: Sequence[str] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, html: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self._command = list(command) if command is not None else [sys.executable, "-m", "soak.report.child"]
        self._html = html
        self._timeout_s = timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._spawn_error: str | None = None

    async def start(self) -> None:
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self._command, str(self.run_dir), *(() if self._html else ("--no-html",)),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                # Its own session: a Ctrl-C at the terminal stops the run, not the report of what it recorded.
                start_new_session=True,
            )
        except OSError as exc:
            self._spawn_error = f"could not start the report process: {exc}"

    async def render(self) -> ReportOutcome:
        started = time.monotonic()
        proc = self._proc
        if proc is None:
            return ReportOutcome(False, 0.0, None, self._spawn_error or "the report process was not started")
        try:
            assert proc.stdin is not None
            proc.stdin.write(GO)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it already exited; its status and stderr say why
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except asyncio.TimeoutError:
            await self.aclose()
            return ReportOutcome(False, time.monotonic() - started, None,
                                 f"the report took longer than {self._timeout_s:g} s and was stopped")
        elapsed = time.monotonic() - started
        if proc.returncode == 0:
            return ReportOutcome(True, elapsed, 0)
        return ReportOutcome(False, elapsed, proc.returncode, _last_line(stderr) or f"exit status {proc.returncode}")

    async def aclose(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        await proc.wait()


def _last_line(stderr: bytes | None) -> str | None:
    lines = [line.strip() for line in (stderr or b"").decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:500] if lines else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    html = "--no-html" not in argv
    argv = [a for a in argv if a != "--no-html"]
    if len(argv) != 1:
        print("usage: python -m soak.report.child RUN_DIR [--no-html]", file=sys.stderr)
        return 2
    from soak.report.render import write_report  # the heavy imports, while the run goes on

    if html:
        from soak.report import plots  # noqa: F401  matplotlib too, before the run's end asks

    if sys.stdin.buffer.readline() != GO:
        return 0  # the harness went away before asking: write nothing
    run_dir = Path(argv[0])
    # The run just judged itself and wrote summary.json: render that, judge nothing again.
    # Without one (its write failed) the run is judged here, as `soak report` would.
    from collections.abc import Mapping

    from soak.store.rundir import RunDir

    summary = RunDir(run_dir).summary_json()
    if isinstance(summary, Mapping):
        written = write_report(run_dir, html=html, summary=summary, write_summary=False)
    else:
        written = write_report(run_dir, html=html)
    # As `soak report` does: the files a reader of the run directory writes pass the redactor's shapes.
    import os

    from soak.redact import Redactor

    redactor = Redactor.for_run(environ=os.environ)
    for path in (written.html, written.junit, written.summary):
        if path is not None:
            redactor.scrub_file(path, shapes=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
