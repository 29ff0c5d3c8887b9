"""Workloads: what the load generator sends (docs/ARCHITECTURE.md, "Workloads").

``build_workload(config, base_dir=..., seed=..., model=...)`` gives a workload;
``await workload.calibrate(counter)`` counts its text once; then
``workload.plan(...)`` says what it will send, and ``new_session(i)`` /
``arrivals()`` produce the requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from soak.workload.config import (
    CorpusConfig,
    MooncakeTraceConfig,
    ReplayJsonlConfig,
    SyntheticAgenticConfig,
    WorkloadConfig,
    absolutize,
    load_workload_file,
    load_workload_section,
)
from soak.workload.counters import EstimateCounter, LocalTokenizerCounter, SimCounter, TargetCounter, TokenCounter, make_counter
from soak.workload.plan import Plan, PlannedTurn
from soak.workload.types import Arrival, Session, TurnRequest, Workload

if TYPE_CHECKING:
    from soak.workload.corpus import Corpus

__all__ = [
    "Arrival",
    "EstimateCounter",
    "LocalTokenizerCounter",
    "Plan",
    "PlannedTurn",
    "Session",
    "SimCounter",
    "TargetCounter",
    "TokenCounter",
    "TurnRequest",
    "Workload",
    "WorkloadConfig",
    "build_workload",
    "load_workload_file",
    "load_workload_section",
    "make_counter",
]


def build_workload(
    config: SyntheticAgenticConfig | ReplayJsonlConfig | MooncakeTraceConfig,
    *,
    base_dir: str | Path,
    seed: int,
    model: str,
    block_size: int = 256,
    config_path: str | Path | None = None,
    corpora: dict[str, Corpus] | None = None,
) -> Workload:
    """The workload for a config section. Reads its files now (a missing corpus or
    a malformed trace is a ``WorkloadError`` here); counting waits for ``calibrate``.

    ``corpora`` keeps the corpora read, by their config, for the next call: a run
    builds its workload twice (to fail early, then for the served model), and
    reading a corpus is most of a build."""
    config = absolutize(config, Path(base_dir))
    if isinstance(config, SyntheticAgenticConfig):
        from soak.workload.agentic import SyntheticAgenticWorkload

        corpus = _corpus(config.corpus, corpora, config_path)
        return SyntheticAgenticWorkload(
            config, corpus=corpus, seed=seed, model=model, block_size=block_size, config_path=config_path
        )
    if isinstance(config, ReplayJsonlConfig):
        from soak.workload.replay import JsonlReplayWorkload

        return JsonlReplayWorkload(config, seed=seed, model=model, block_size=block_size)
    if isinstance(config, MooncakeTraceConfig):
        from soak.workload.mooncake import MooncakeWorkload

        corpus = _corpus(config.corpus, corpora, config_path)
        return MooncakeWorkload(config, corpus=corpus, seed=seed, model=model, block_size=block_size)
    raise TypeError(f"not a workload section: {config!r}")


def _corpus(config: CorpusConfig, corpora: dict[str, Corpus] | None, config_path: str | Path | None) -> Corpus:
    from soak.workload.corpus import load_corpus

    key = config.model_dump_json()
    if corpora is not None and key in corpora:
        return corpora[key]
    corpus = load_corpus(config, field="workload.corpus", config_path=config_path)
    if corpora is not None:
        corpora[key] = corpus
    return corpus
