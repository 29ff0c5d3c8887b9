"""Whether the server's /metrics still answers with its counters: the
``metrics_stale`` warning once it stops, ``metrics_fresh`` once it is back (the
summary says which span the server figures cover from samples.jsonl itself).
Pure: the run hands it each scrape."""

from __future__ import annotations

from typing import Any

from soak.events import EventType
from soak.samples import ServerSample


class MetricsFreshness:
    def __init__(self, *, metrics_interval_s: float, server_keys: frozenset[str] | set[str] | tuple[str, ...]) -> None:
        # A scrape or two may miss; three intervals (5 s at least) without the counters is stale.
        self.stale_after_s = max(5.0, 3.0 * metrics_interval_s)
        self._keys = server_keys
        self._fresh_at: float | None = None
        self._stale_since: float | None = None

    def observe(self, sample: ServerSample) -> tuple[EventType, dict[str, Any]] | None:
        """The event this scrape changes the freshness by, if any."""
        if sample.ok and any(k in sample.values for k in self._keys):
            change = None
            if self._stale_since is not None:
                change = (EventType.METRICS_FRESH, {"stale_since": self._stale_since,
                                                    "stale_s": round(sample.ts - self._stale_since, 3)})
                self._stale_since = None
            self._fresh_at = sample.ts
            return change
        if self._stale_since is not None:
            return None
        since = self._fresh_at
        if since is not None and sample.ts - since < self.stale_after_s:
            return None
        self._stale_since = since if since is not None else sample.ts
        error = sample.error or "the scrape has none of the server counters"
        return (EventType.METRICS_STALE, {"since": since, "error": str(error)[:200],
                                          "note": "server token totals and the prefix-cache hit ratio cover only "
                                                  "the time before"})
