"""The live dashboard's correctness row: are the answers right? The canaries' pass
rate, their verdicts over time and their share of server time (``soak_canaries_total``,
``soak_canary_share_ratio``; soak.export.names). The corruption annotation is in
``soak.export.dashboard_annotations``."""

from __future__ import annotations

from soak.export.dashboard_panels import BOX
from soak.export.grafana import Panel, Target

# The verdicts that say an answer was right: a match, or a divergence a near tie explains.
RIGHT = "match|explained"
JUDGED = "match|explained|corrupt|crosstalk"
# Canaries come one every 20 s by default: a 5-minute window holds about 15, enough for a rate.
WINDOW = "5m"


def _canaries(verdicts: str) -> str:
    return f'sum(increase(soak_canaries_total{{verdict=~"{verdicts}",{BOX}}}[{WINDOW}]))'


def oracle_row() -> list[Panel]:
    stat_opts = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "background"}
    return [
        Panel(
            "Canary pass rate",
            "stat",
            # -1 where no canary was judged in the window (no oracle, or only references taken so far):
            # said as such, never as a 100% nobody measured
            [Target(f"({_canaries(RIGHT)} / {_canaries(JUDGED)}) or on() "
                    f"(sum(soak_canaries_total{{{BOX}}}) * 0 - 1)", "pass rate")],
            width=4,
            height=6,
            unit="percentunit",
            min=0,
            max=1,
            mappings=[{"type": "value", "options": {"-1": {"text": "none judged", "color": "#808080", "index": 0}}}],
            description=("Judged canaries (greedy requests compared with their reference) that were right over "
                         f"the last {WINDOW}: matched, or diverged only at a near tie. Anything below 100% is a "
                         "corruption: the run's report shows the answers side by side. None judged (grey): no canary "
                         "was compared with a reference in the window."),
            thresholds={"mode": "absolute", "steps": [{"color": "#808080", "value": None}, {"color": "red", "value": 0},
                                                      {"color": "green", "value": 1}]},
            options=stat_opts,
        ),
        Panel(
            "Canaries by verdict",
            "timeseries",
            [Target(f"sum by (verdict) (increase(soak_canaries_total{{{BOX}}}[{WINDOW}]))", "{{verdict}}")],
            width=14,
            height=6,
            unit="short",
            description=f"Canary answers per {WINDOW} by verdict; corrupt and crosstalk are failures.",
            overrides=[{"matcher": {"id": "byName", "options": name},
                        "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]}
                       for name, colour in (("match", "green"), ("explained", "yellow"), ("corrupt", "red"),
                                            ("crosstalk", "purple"), ("unjudged", "gray"), ("reference", "blue"))],
        ),
        Panel(
            "Canaries' share of server time",
            "timeseries",
            [Target(f"max(soak_canary_share_ratio{{{BOX}}})", "measured share")],
            width=6,
            height=6,
            unit="percentunit",
            min=0,
            description="The canaries' measured share of server time (bounded by oracle.max_share, 2% by default).",
        ),
    ]
