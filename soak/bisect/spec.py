"""The bisect file (``soak bisect BISECT.yaml``): the ordered builds, the run
config every segment shares, how long a segment is, when to stop, and the
rates the posterior assumes. Validated whole before anything runs; every
failure is one ``ConfigError`` line naming the file and the field, an unknown
key with its did-you-mean (soak.configkeys), exit 2.

    name: demo-bisect
    base: run.yaml               # a run config (workload, load, detector...), or the mapping inline
    builds:                      # oldest first; each a label and a target: section or a run config
      - {label: b0, config: builds/b0.yaml}
      - label: b1
        target: {kind: launched, command: "vllm serve ..."}
        env: {VLLM_FOO: "1"}     # given to the server through the harness's environment, never written out
    segment: 2m                  # time at risk per segment (stopped at its first hang)
    stop_at: 0.95                # the posterior that names a build
    budget: {time_at_risk: 2h, segments: 40}
    prior: uniform               # or [weights], or {history: [DIR, ...]}
    rates: {min_ratio: 2, max_ratio: 100, good_mtbf: [1h, 30d], bad_mtbf: [1m, 1h]}
    executor: {kind: local}      # or {kind: slurm, slots: 2, gpus_per_segment: 8, partition: gpu}

A build's ``env`` (and a launched target's own ``env``) reaches the server
through the segment's ``soak run`` environment, so no segment config, run
directory or bisect.json holds a value of it: only names.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from soak.configbase import Duration, StrictModel, read_yaml, validation_error_to_config_error
from soak.errors import ConfigError
from soak.target.config import TargetConfig

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@/-]{0,79}")  # fullmatch: "$" lets a trailing newline in
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BuildSpec(StrictModel):
    label: str
    target: Optional[TargetConfig] = None  # what a target: section can start
    config: Optional[Path] = None  # or a run config whose target: is this build (beside the bisect file)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("label")
    @classmethod
    def _label(cls, value: str) -> str:
        if not _LABEL.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a label (letters, digits, . _ + : @ / -, at most 80)")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name[:40]!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _one_source(self):
        if (self.target is None) == (self.config is None):
            raise ValueError("give a target: section or a config: (a run config's path), one of them")
        if self.env and self.target is not None and self.target.kind == "attached":
            raise ValueError("env: reaches a server the harness starts; an attached server has its own")
        return self


class BudgetSpec(StrictModel):
    time_at_risk: Optional[Duration] = None  # total soak (exposure) over every segment
    segments: Optional[int] = Field(default=None, ge=1, le=1000)

    @field_validator("time_at_risk")
    @classmethod
    def _positive(cls, value: Optional[float]) -> Optional[float]:
        if value is not None and not value > 0:
            raise ValueError("must be a positive duration such as 2h")
        return value


class HistoryPrior(StrictModel):
    history: list[Path] = Field(min_length=1, max_length=100)  # run directories, or folders of them


class RatesSpec(StrictModel):
    """posterior.model's assumptions, as its docstring states them."""

    mtbf_min: Duration = 60.0  # the log-uniform prior's range for either MTBF
    mtbf_max: Duration = 30 * 86400.0
    min_ratio: float = Field(default=2.0, ge=1.0)  # a bad build hangs at least this many times as often
    max_ratio: Optional[float] = 100.0
    good_mtbf: Optional[tuple[Duration, Duration]] = None  # what you know: "it used to run for hours"
    bad_mtbf: Optional[tuple[Duration, Duration]] = None  # "it hangs every 20 minutes or so now"
    grid: int = Field(default=40, ge=4, le=200)


class LocalExecutorSpec(StrictModel):
    """One segment after another on this machine (soak.bisect.local)."""

    kind: Literal["local"] = "local"


_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class SlurmExecutorSpec(StrictModel):
    """Each segment a Slurm batch job (soak.bisect.slurm; docs/running.md, "cluster")."""

    kind: Literal["slurm"]
    slots: int = Field(default=2, ge=1, le=64)  # segments in flight at once
    cpus_per_segment: int = Field(default=1, ge=1, le=1024)
    gpus_per_segment: int = Field(default=0, ge=0, le=64)  # --gres=gpu:N
    partition: Optional[str] = None
    overhead: Duration = 600.0  # start-up, drain and report, added to the segment for --time
    poll: Duration = 2.0  # how often squeue's view is read

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _PARTITION.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a partition name")
        return value

    @field_validator("overhead", "poll")
    @classmethod
    def _positive(cls, value: float) -> float:
        if not value > 0:
            raise ValueError("must be a positive duration")
        return value


ExecutorSpec = Annotated[Union[LocalExecutorSpec, SlurmExecutorSpec], Field(discriminator="kind")]


class BisectConfig(StrictModel):
    name: str = Field(default="bisect", min_length=1, max_length=80)
    base: Union[Path, dict[str, Any], None] = None  # a run config (path or inline); None: the defaults
    builds: list[BuildSpec] = Field(min_length=2, max_length=64)
    segment: Duration
    stop_at: float = Field(default=0.95, gt=0.5, lt=1.0)
    budget: BudgetSpec = BudgetSpec()
    prior: Union[Literal["uniform"], list[float], HistoryPrior] = "uniform"
    rates: RatesSpec = RatesSpec()
    seed: int = 0  # each segment's seeds derive from it and the segment's number
    executor: ExecutorSpec = LocalExecutorSpec()  # who runs the segments, and where

    @field_validator("segment")
    @classmethod
    def _segment(cls, value: float) -> float:
        if not value > 0:
            raise ValueError("must be a positive duration such as 2m")
        return value

    @model_validator(mode="after")
    def _cross(self):
        labels = [b.label for b in self.builds]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"build labels must differ: {', '.join(twice)} given twice")
        if isinstance(self.prior, list) and len(self.prior) != len(self.builds):
            raise ValueError(f"prior: needs {len(self.builds)} weights, one per build, not {len(self.prior)}")
        return self


@dataclass(frozen=True)
class Bisect:
    """A loaded bisect: the config, each build's segment config (a run config as a
    mapping, target included, env taken out) and env, and the model."""

    config: BisectConfig
    path: Path
    segment_configs: tuple[dict[str, Any], ...]
    envs: tuple[dict[str, str], ...]
    model: Any  # posterior.Model

    @property
    def labels(self) -> list[str]:
        return [b.label for b in self.config.builds]


def _raw_run_config(source: Path | dict[str, Any] | None, *, path: Path, field: str) -> tuple[dict[str, Any], Path]:
    """A run config as the user wrote it (a mapping), and the folder its relative paths are read from."""
    if source is None:
        return {}, path.parent
    if isinstance(source, dict):
        return copy.deepcopy(source), path.parent
    file = source if source.is_absolute() else path.parent / source
    data = read_yaml(file)
    if not isinstance(data, dict) or not data:
        raise ConfigError("expected a run config (a mapping)", path=file)
    return data, file.parent


def _absolute(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Relative paths a run config holds, made absolute: the segment config is written elsewhere."""
    out = copy.deepcopy(data)
    if isinstance(out.get("workload"), str) and not Path(out["workload"]).is_absolute():
        out["workload"] = str((folder / out["workload"]).resolve())
    target = out.get("target")
    if isinstance(target, dict) and isinstance(target.get("cwd"), str) and not Path(target["cwd"]).is_absolute():
        target["cwd"] = str((folder / target["cwd"]).resolve())
    return out


def segment_config(base: dict[str, Any], target: dict[str, Any], *, label: str, name: str,
                   segment_s: float) -> tuple[dict[str, Any], dict[str, str]]:
    """One build's segment run config (the base with the build's target, its label
    as ``build:`` for history, a run as long as a segment plus warm-up, ending at the
    first hang) and the env to give it through the environment."""
    target = copy.deepcopy(target)
    env = dict(target.pop("env", None) or {})
    out = copy.deepcopy(base)
    out.pop("prove", None)  # a segment's stopping rule is the bisect's
    warmup = out.get("warmup", 0) or 0
    from soak.durations import parse_duration

    out.update(name=f"{name}-{label}"[:80], build=label, target=target,
               duration=f"{segment_s + parse_duration(warmup):g}s")
    response = dict(out.get("response") or {})
    response["on_hang"] = "stop"  # a segment ends at its first hang: the posterior's stopping rule
    out["response"] = response
    return out, env


def load_bisect(path: str | Path) -> Bisect:
    """Read and check a bisect file and every build's segment config (each
    validated as a run config now, so a typo in build 7 fails before build 0 runs)."""
    from soak.bisect.posterior import model as make_model
    from soak.config import RunConfig, check_run_config

    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError("expected a bisect file (a mapping with builds: and segment:)", path=path)
    try:
        config = BisectConfig.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, path, data=data, model=BisectConfig) from exc
    base, base_dir = _raw_run_config(config.base, path=path, field="base")
    base = _absolute(base, base_dir)
    base.pop("target", None)
    segment_configs, envs = [], []
    for i, (spec, raw) in enumerate(zip(config.builds, data["builds"])):
        field = f"builds[{i}]"
        if spec.config is not None:
            own, own_dir = _raw_run_config(spec.config, path=path, field=f"{field}.config")
            target = _absolute(own, own_dir).get("target")
            if not isinstance(target, dict):
                raise ConfigError(f"{spec.config} has no target: section", path=path, field=f"{field}.config")
        else:
            target = _absolute({"target": raw["target"]}, path.parent)["target"]
        seg, env = segment_config(base, target, label=spec.label, name=config.name, segment_s=config.segment)
        env.update(spec.env)
        if env and target.get("kind", "simulator") != "launched":
            raise ConfigError("env: reaches a launched server; this build's target is "
                              f"{target.get('kind', 'simulator')}", path=path, field=f"{field}.env")
        try:
            checked = RunConfig.model_validate(seg, context={"base_dir": base_dir})
            check_run_config(checked, path)
        except ValidationError as exc:
            raise validation_error_to_config_error(exc, path, prefix=field) from exc
        segment_configs.append(seg)
        envs.append(env)
    try:
        model = make_model(builds=len(config.builds), prior=_prior(config, path=path),
                           mtbf_min_s=config.rates.mtbf_min, mtbf_max_s=config.rates.mtbf_max,
                           grid=config.rates.grid, min_ratio=config.rates.min_ratio,
                           max_ratio=config.rates.max_ratio, good_mtbf_s=config.rates.good_mtbf,
                           bad_mtbf_s=config.rates.bad_mtbf)
    except ValueError as exc:
        # the model checks both; a bad prior named at rates: sends the user to the wrong section
        raise ConfigError(str(exc), path=path, field="prior" if "prior" in str(exc) else "rates") from exc
    return Bisect(config, path, tuple(segment_configs), tuple(envs), model)


def _prior(config: BisectConfig, *, path: Path) -> list[float] | None:
    if config.prior == "uniform":
        return None
    if isinstance(config.prior, list):
        return config.prior
    return history_prior([b.label for b in config.builds], config.prior.history, path=path, rates=config.rates)


def history_prior(labels: list[str], dirs: list[Path], *, path: Path, rates: RatesSpec) -> list[float]:
    """The prior from history: the posterior over the first bad build that the
    nights of these builds (runs whose build or label is one of ``labels``) give
    under a uniform prior. What history says of the two rates is not carried over:
    the bisect integrates them afresh over its own segments and history's pooled."""
    from soak.bisect.posterior import Segment, model as make_model, posterior
    from soak.history.collect import find_runs
    from soak.history.model import run_record
    from soak.history.prove import runs_of
    from soak.report.rundir import load_run

    records = []
    for d in dirs:
        for run in find_runs([d if d.is_absolute() else path.parent / d]):
            try:
                data = load_run(run)
                records.append(run_record(path=str(run), summary=data.summary, events=data.events, config=data.config))
            except ConfigError:
                continue  # one unreadable night never blocks the others
    segments = [Segment(i, r.exposure_s, r.hangs) for i, label in enumerate(labels) for r in runs_of(records, label)]
    if not segments:
        raise ConfigError("history holds no run of these builds (their labels as the runs' build:)",
                          path=path, field="prior.history")
    flat = make_model(builds=len(labels), mtbf_min_s=rates.mtbf_min, mtbf_max_s=rates.mtbf_max, grid=rates.grid,
                      min_ratio=rates.min_ratio, max_ratio=rates.max_ratio, good_mtbf_s=rates.good_mtbf,
                      bad_mtbf_s=rates.bad_mtbf)
    return list(posterior(segments, model=flat).first_bad)
