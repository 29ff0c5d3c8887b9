"""The fan-out of ``RunSink`` calls (the protocol itself is ``soak.records.RunSink``).

The run store (soak/store), the exporter (soak/export) and the live view
(soak/export/live.py) each implement ``RunSink``. ``FanOut`` passes each call to
every sink; a sink that raises is reported to the exception handler and the
others still get the call, so a broken exporter never costs the run its record.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

from soak.prove.sprt import Decision
from soak.records import Assessment, IncidentRecord, RunInfo, RunSink
from soak.samples import RequestRecord, Sample

log = logging.getLogger(__name__)

ExceptionHandler = Callable[[RunSink, str, BaseException], None]


def _log_sink_error(sink: RunSink, method: str, exc: BaseException) -> None:
    log.warning("sink %s.%s failed: %s", type(sink).__name__, method, exc, exc_info=exc)


class FanOut:
    """A ``RunSink`` that forwards every call to its sinks, in order."""

    def __init__(self, sinks: Sequence[RunSink], *, on_error: ExceptionHandler = _log_sink_error) -> None:
        self._sinks = list(sinks)
        self._on_error = on_error
        self._closed = False

    def _each(self, method: str, call: Callable[[RunSink], None]) -> None:
        for sink in self._sinks:
            try:
                call(sink)
            except Exception as exc:  # noqa: BLE001 - one sink must not sink the run
                self._on_error(sink, method, exc)

    def on_start(self, info: RunInfo) -> None:
        self._each("on_start", lambda sink: sink.on_start(info))

    def on_sample(self, sample: Sample) -> None:
        self._each("on_sample", lambda sink: sink.on_sample(sample))

    def on_request(self, record: RequestRecord) -> None:
        self._each("on_request", lambda sink: sink.on_request(record))

    def on_assessment(self, assessment: Assessment) -> None:
        self._each("on_assessment", lambda sink: sink.on_assessment(assessment))

    def on_incident(self, incident: IncidentRecord) -> None:
        self._each("on_incident", lambda sink: sink.on_incident(incident))

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None:
        self._each("on_event", lambda sink: sink.on_event(type, fields))

    def on_proof(self, decision: Decision) -> None:
        """A prove: run's sequential test, to the sinks that show it (the live view,
        the exporter); not part of RunSink: the run store records the decision as
        an event instead."""
        for sink in self._sinks:
            if hasattr(sink, "on_proof"):
                try:
                    sink.on_proof(decision)  # type: ignore[attr-defined]
                except Exception as exc:  # noqa: BLE001 - one sink must not sink the run
                    self._on_error(sink, "on_proof", exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._each("close", lambda sink: sink.close())
