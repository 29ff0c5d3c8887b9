"""The live view: one refreshing status on a terminal (rich), plain periodic lines otherwise.

A ``RunSink``: it keeps a small rolling state (bounded deques, the latest GPU
reading, counters) and renders it on its own timer. Nothing here grows with
the length of the run.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping, TextIO

from soak.clock import Clock
from soak.durations import format_duration
from soak.events import EventType
from soak.printable import printable
from soak.export.live_rows import StageWindow, incident_text, levels_text, suspect_text
from soak.percentiles import percentile
from soak.prove.sprt import Decision, ProofState
from soak.records import Assessment, DetectorState, IncidentRecord, RunInfo
from soak.samples import GpuReading, GpuSample, GpuSource, RequestRecord, Sample, ServerSample
from soak.counters import CounterDelta

if TYPE_CHECKING:  # rich is imported when a terminal view starts
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

TOKENS_WINDOW_S = 30.0
TTFT_WINDOW = 512
_STATE_STYLES = {DetectorState.HEALTHY: "green", DetectorState.SUSPECT: "yellow", DetectorState.HUNG: "bold red"}


class Phase(str, Enum):
    """Where the run is, as the view names it."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    DRAINING = "draining"
    STOPPED = "stopped"


# Run events that move the view to another phase.
_PHASE_OF_EVENT = {EventType.RESTART_STARTED: Phase.RESTARTING, EventType.LOAD_STOPPED: Phase.STOPPED,
                   EventType.DRAINING: Phase.DRAINING, EventType.RESTART_DONE: Phase.RUNNING}


class ViewState:
    """What the view shows, updated by sink calls; ``line()`` and ``table()`` read it."""

    def __init__(self, *, clock: Clock) -> None:
        self.clock = clock
        self.info: RunInfo | None = None
        self.ok = 0
        self.failed = 0
        self.cut = 0  # cut short by the harness itself (drain, kill, Ctrl-C): not the server's failures
        self.tokens_total = 0
        self._recent_tokens: deque[tuple[float, int]] = deque()
        self._ttft: deque[float] = deque(maxlen=TTFT_WINDOW)
        self.context_tokens: int | None = None
        self.max_context_tokens = 0
        self._hits = CounterDelta()
        self._queries = CounterDelta()
        self.gpus: tuple[GpuReading, ...] = ()
        self.gpu_source: GpuSource | None = None
        self.detector_state = DetectorState.HEALTHY
        self.suspect: str | None = None  # which rule holds the detector off healthy, and how far along
        self.stages = StageWindow()  # max and mean over the last seconds, never an instant sample
        self.build: str | None = None  # the build event's label (soak.history.build.build_key)
        self.stopped_at: float | None = None  # when the load stopped: no time left is shown after it
        self.incidents = 0
        self.phase = Phase.STARTING
        self.gpu_stale: str | None = None  # the stale-GPU-source message while it lasts
        self.warnings: list[str] = []  # e.g. a vLLM version soak has no facts for
        # Warnings that come and go by topic (metrics stale, a failure criterion at risk or failed).
        self.alerts: dict[str, str] = {}
        self.proof: str | None = None  # prove: the sequential test's sentence (soak.prove.sprt)
        self.proof_said = False  # its decision said once, as a line that stays

    def on_request(self, record: RequestRecord) -> None:
        if record.outcome == "ok":
            self.ok += 1
            if record.ttft_s is not None and not record.warmup:
                self._ttft.append(record.ttft_s)
        elif record.cut_by:
            self.cut += 1
        else:
            self.failed += 1
        self.tokens_total += record.output_tokens
        self._recent_tokens.append((record.ended_at, record.output_tokens))
        self._trim(record.ended_at)
        if record.prompt_tokens:
            self.context_tokens = record.prompt_tokens
            self.max_context_tokens = max(self.max_context_tokens, record.prompt_tokens)

    def on_sample(self, sample: Sample) -> None:
        if isinstance(sample, GpuSample) and sample.error is None:
            self.gpus = sample.gpus
            self.gpu_source = sample.source
            self.stages.add(sample)
        elif isinstance(sample, ServerSample) and sample.ok:
            hits = sample.values.get("prefix_cache_hits")
            queries = sample.values.get("prefix_cache_queries")
            if hits is not None and queries is not None:
                self._hits.add(hits)
                self._queries.add(queries)

    def _trim(self, now: float) -> None:
        while self._recent_tokens and self._recent_tokens[0][0] < now - TOKENS_WINDOW_S:
            self._recent_tokens.popleft()

    def tokens_per_s(self, now: float) -> float:
        self._trim(now)
        if not self._recent_tokens or self.info is None:
            return 0.0
        window = min(TOKENS_WINDOW_S, max(1e-6, now - self.info.started_at))
        return sum(t for _, t in self._recent_tokens) / window

    def ttft(self, q: float) -> float | None:
        return percentile(list(self._ttft), q)

    @property
    def hit_ratio(self) -> float | None:
        if self._queries.total > 0:
            return self._hits.total / self._queries.total
        return None

    def elapsed_remaining(self, now: float) -> tuple[float, float]:
        if self.info is None:
            return 0.0, 0.0
        end = now if self.stopped_at is None else min(now, self.stopped_at)
        elapsed = max(0.0, end - self.info.started_at)
        return elapsed, max(0.0, self.info.duration_s - elapsed)

    def time_text(self, now: float) -> str:
        """Elapsed and left while the load runs; once it stopped (or drains), no time left is said."""
        elapsed, remaining = self.elapsed_remaining(now)
        if self.phase is Phase.STOPPED or self.stopped_at is not None:
            return f"after {format_duration(round(elapsed))} of load"
        if self.phase is Phase.DRAINING:
            return f"{format_duration(round(elapsed))} elapsed, draining"
        return f"{format_duration(round(elapsed))} elapsed, {format_duration(round(remaining))} left"

    def detector_text(self) -> str:
        return self.suspect or self.detector_state.value

    def line(self, now: float) -> str:
        p50, p99 = self.ttft(50), self.ttft(99)
        ratio = self.hit_ratio
        stage_cpu = self.gpu_source is GpuSource.STAGE_CPU
        levels = levels_text(self.stages.levels(now))
        return (
            f"soak {self.phase.value} {self.time_text(now)} | " + (f"build {self.build} | " if self.build else "")
            + f"requests ok {self.ok} failed {self.failed}" + (f" cut {self.cut}" if self.cut else "")
            + f" | {self.tokens_per_s(now):.1f} tok/s | "
            f"ttft p50 {_s(p50)} p99 {_s(p99)} | context {_k(self.context_tokens)} | "
            f"prefix hit {_pct(ratio)} | {'stage CPU%' if stage_cpu else 'gpu%'} max/mean {levels} | "
            f"detector {self.detector_text()}"
            + (f" | incidents {self.incidents}" if self.incidents else "")
            + (f" | proof: {self.proof}" if self.proof else "")
            + (" | GPU READINGS STALE" if self.gpu_stale else "")
            + "".join(f" | WARNING {text}" for text in self.alerts.values())
        )

    def table(self, now: float) -> Table:
        from rich.table import Table
        from rich.text import Text

        title = f"soak {self.info.run_id if self.info else ''}" + (f" · build {self.build}" if self.build else "")
        table = Table(title=title, show_header=False, expand=False, box=None, padding=(0, 1))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("phase", self.phase.value)
        table.add_row("time", self.time_text(now))
        table.add_row("requests", f"[green]{self.ok} ok[/]  [red]{self.failed} failed[/]"
                      + (f"  {self.cut} cut by the harness" if self.cut else ""))
        table.add_row("tokens/s", f"{self.tokens_per_s(now):.1f}  ({self.tokens_total} generated)")
        table.add_row("TTFT", f"p50 {_s(self.ttft(50))}  p99 {_s(self.ttft(99))}")
        table.add_row("context", f"{_k(self.context_tokens)} (max {_k(self.max_context_tokens or None)})")
        table.add_row("prefix hit", _pct(self.hit_ratio))
        for level in self.stages.levels(now):
            # the bar is the mean over the last seconds; a stage busy in bursts reads busy, a dark one dark
            filled = int(round(max(0.0, min(100.0, level.mean_pct)) / 5))
            bar = Text("█" * filled, style="green" if level.max_pct >= 5 else "red")
            bar.append("·" * (20 - filled), style="dim")
            bar.append(f" max {level.max_pct:5.1f}%  mean {level.mean_pct:5.1f}%")
            table.add_row(level.label, bar)
        if self.gpu_stale:
            table.add_row("gpu source", Text(self.gpu_stale, style="bold yellow"))
        for warning in self.warnings[-3:]:
            table.add_row("warning", Text(warning, style="yellow"))
        style = _STATE_STYLES[self.detector_state]
        table.add_row("detector", Text(self.detector_text(), style=style))
        if self.incidents:
            table.add_row("incidents", f"[bold red]{self.incidents}[/]")
        if self.proof:
            table.add_row("proof", Text(self.proof))
        for topic, text in self.alerts.items():
            table.add_row(topic, Text(text, style="bold yellow"))
        return table


def _terminal(text: str) -> str:
    """Incident summaries, warnings and the status line quote the server (titles, errors,
    log lines): no escape sequence or stray line break of theirs reaches the terminal."""
    return "\n".join(printable(line) for line in text.split("\n"))


def _warning(type: EventType | str, fields: Mapping[str, Any], start: float | None) -> tuple[str, str] | None:
    """(topic, text) for an event the operator should see now; an empty text clears the topic."""
    if type == EventType.METRICS_STALE:
        since = fields.get("since")
        when = f"+{since - start:.0f}s" if isinstance(since, (int, float)) and start is not None else "the start"
        return "metrics", (f"/metrics stale since {when} ({fields.get('error', 'no answer')}): server token totals "
                           "and the hit ratio cover only the time before")
    if type == EventType.METRICS_FRESH:
        return "metrics", ""
    if type == EventType.TARGET_WAITING:  # why the target is not ready yet: said at once, not after the timeout
        return "target", str(fields.get("message") or "the target is not ready yet")
    if type == EventType.TARGET_READY:
        return "target", ""
    if type in (EventType.CRITERION_AT_RISK, EventType.CRITERION_FAIL):
        reasons = fields.get("reasons") or []
        state = "failed" if type == EventType.CRITERION_FAIL else "at risk"
        return f"criterion {fields.get('criterion')}", f"{fields.get('criterion')} {state}: {reasons[0] if reasons else ''}"
    return None


def clean_label(value: Any) -> str:
    """A label for one terminal line: printable, bounded."""
    return printable(str(value))[:80]


def _s(value: float | None) -> str:
    return "-" if value is None else (f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s")


def _k(value: int | None) -> str:
    return "-" if not value else (f"{value / 1000:.1f}K" if value >= 1000 else str(value))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


class LiveView:
    """The view sink. ``mode``: rich, plain or off (``auto`` picks by ``isatty``).
    ``environ`` (default: the process's) says whether colour is allowed: NO_COLOR
    set and not empty means none (soak.colour), the table's cursor moves stay."""

    def __init__(
        self,
        *,
        clock: Clock,
        mode: str = "auto",
        refresh_s: float = 1.0,
        plain_interval_s: float = 30.0,
        stream: TextIO | None = None,
        exporter_url: str | None = None,
        console: Console | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        import os

        from soak.colour import no_color

        self._no_color = no_color(os.environ if environ is None else environ)
        self._stream = stream or sys.stdout
        self._exporter_url = exporter_url
        self._console = console
        if mode == "auto":
            mode = "rich" if self._stream.isatty() else "plain"
        self.mode = mode
        self.state = ViewState(clock=clock)
        self._clock = clock
        self._interval = refresh_s if mode == "rich" else plain_interval_s
        self._task: asyncio.Task[None] | None = None
        self._live: Live | None = None
        self._closed = False

    def on_start(self, info: RunInfo) -> None:
        self.state.info = info
        self.state.phase = Phase.RUNNING
        if self.mode == "off":
            return
        build = f" (build {self.state.build})" if self.state.build else ""
        start_line = (f"soak: run {info.run_id}{build} against {info.target_kind.value} at {info.base_url}, "
                      f"writing {info.run_dir}")
        if self._exporter_url:
            start_line += f"; metrics on {self._exporter_url}"
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live

            console = self._console or Console(file=self._stream, no_color=self._no_color)
            self._live = Live(self.state.table(self._clock.now()), console=console, auto_refresh=False, transient=False)
            self._live.start()
            self._say(start_line)
        else:
            self._print(start_line)
        self._task = asyncio.get_running_loop().create_task(self._refresh(), name="soak-live-view")

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.render()

    def render(self) -> None:
        now = self._clock.now()
        if self._live is not None:
            self._live.update(self.state.table(now), refresh=True)
        elif self.mode == "plain":
            self._print(self.state.line(now))

    def _say(self, text: str) -> None:
        """A line that stays: above the live table on a terminal, a plain line otherwise."""
        text = _terminal(text)
        if self._live is not None:
            try:
                # markup off: run directories and reasons may hold [brackets]
                self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
            except (OSError, ValueError):
                pass
        elif self.mode == "plain":
            self._print(text)

    def _print(self, text: str) -> None:
        try:
            print(_terminal(text), file=self._stream, flush=True)
        except (OSError, ValueError):
            pass  # a closed pipe must not end the soak

    def on_sample(self, sample: Sample) -> None:
        self.state.on_sample(sample)

    def on_request(self, record: RequestRecord) -> None:
        self.state.on_request(record)

    def on_assessment(self, assessment: Assessment) -> None:
        self.state.detector_state = assessment.state
        self.state.suspect = suspect_text(assessment, last=self.state.suspect)

    def on_incident(self, incident: IncidentRecord) -> None:
        self.state.incidents += 1
        self._say(incident_text(incident))

    def on_proof(self, decision: Decision) -> None:
        """Where the sequential test stands (a ``prove:`` run, each detector tick); its
        decision is said once, as a line that stays."""
        sentence = printable(decision.sentence)
        if decision.state is ProofState.UNDECIDED:
            self.state.proof = sentence
            return
        self.state.proof = f"{decision.state.value}: {sentence}"
        if not self.state.proof_said:
            self.state.proof_said = True
            self._say(f"soak: proof: {self.state.proof}")

    def on_event(self, type: EventType | str, fields: Mapping[str, Any]) -> None:
        warning = _warning(type, fields, self.state.info.started_at if self.state.info else None)
        if warning is not None:
            topic, text = warning
            if text:
                self.state.alerts[topic] = text
                self._say(f"soak: warning: {text}")
            else:
                self.state.alerts.pop(topic, None)
        if type in _PHASE_OF_EVENT:
            self.state.phase = _PHASE_OF_EVENT[type]
            if type == EventType.LOAD_STOPPED:
                ts = fields.get("ts")
                self.state.stopped_at = ts if isinstance(ts, (int, float)) else self._clock.now()
        elif type == EventType.BUILD:
            build = fields.get("build") or fields.get("label")
            self.state.build = clean_label(build) if build else None
        elif type == EventType.GPU_SOURCE_STALE:
            self.state.gpu_stale = str(fields.get("message") or "GPU readings are stale")
            # While the harness relaunches the server there is nothing to read: the
            # line would blame the source every 30 s for the harness's own restart.
            if self.mode == "plain" and self.state.phase is not Phase.RESTARTING:
                self._print(f"soak: warning: {self.state.gpu_stale}")
        elif type == EventType.GPU_SOURCE_FRESH:
            self.state.gpu_stale = None
        elif type == EventType.WARNING:
            self.state.warnings.append(str(fields.get("message")))
            if self.mode == "plain":
                self._print(f"soak: warning: {fields.get('message')}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        if self.mode != "off" and self.state.info is not None:
            self.render()
        if self._live is not None:
            self._live.stop()
