"""The run config: one YAML file, validated whole before anything starts.

Sections are owned by their stages (``soak/<stage>/config.py``); this module
composes them and turns every failure into one ``ConfigError`` line that names
the file and the field.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import Field, ValidationError

from soak.configbase import Duration, StrictModel, read_yaml, validation_error_to_config_error
from soak.criteria.config import CriteriaConfig
from soak.detect.config import DetectorConfig
from soak.errors import ConfigError
from soak.export.config import ExporterConfig, ViewConfig
from soak.export.push_config import PushgatewayConfig
from soak.load.config import LoadConfig
from soak.oracle.config import OracleConfig
from soak.probes.config import ProbesConfig
from soak.prove.config import ProveConfig
from soak.respond.config import ResponseConfig
from soak.target.config import SimulatorTarget, TargetConfig, redact_target
from soak.thresholds.config import ThresholdsConfig, threshold_problem
from soak.workload.config import SyntheticAgenticConfig, WorkloadConfig


class RunConfig(StrictModel):
    name: str = "soak"
    # The server build this run exercises, as you name it; `soak history` groups nights by it
    # and by what ran (a label whose nights ran another executable, script, packages,
    # LD_LIBRARY_PATH, PYTHONPATH or model revision is several builds; None: the vLLM
    # version from /version and the digest of what ran).
    build: Optional[str] = Field(None, min_length=1, max_length=200)
    duration: Duration = 300.0
    warmup: Duration = 0.0
    seed: int = 0
    target: TargetConfig = SimulatorTarget()
    workload: WorkloadConfig = SyntheticAgenticConfig()
    load: LoadConfig = LoadConfig()
    probes: ProbesConfig = ProbesConfig()
    detector: DetectorConfig = DetectorConfig()
    criteria: CriteriaConfig = CriteriaConfig()
    response: ResponseConfig = ResponseConfig()
    exporter: ExporterConfig = ExporterConfig()
    view: ViewConfig = ViewConfig()
    thresholds: ThresholdsConfig = {}
    pushgateway: PushgatewayConfig = PushgatewayConfig()
    # Is this build fixed? Wald's sequential test on the run's time at risk (docs/prove.md).
    prove: Optional[ProveConfig] = None
    # Were the answers right? Greedy canaries judged against a reference (docs/oracle.md).
    oracle: OracleConfig = OracleConfig()


def load_run_config(path: str | Path, *, duration: float | None = None,
                    warn: Callable[[str], None] | None = None) -> RunConfig:
    """Read, validate and check a run config; ``duration`` (seconds, from
    ``--duration``) overrides the file's. Every failure is one ``ConfigError``.
    ``warn`` hears one line about durations written without a unit (default: stderr)."""
    data = read_yaml(path)
    if data is None or data == {}:
        # An empty file is a mistake (a wrong path, a truncated copy), not a request
        # for a default soak: say so instead of running one.
        raise ConfigError(
            "the config is empty: nothing to run (start from workloads/demo.yaml)", path=path, line=1
        )
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=path)
    if "kind" in data and "workload" not in data:
        raise ConfigError("a workload file, not a run config: name it in one (workload: PATH), "
                          "as examples/real-vllm-attach.yaml does", path=path, field="kind")
    if duration is not None:
        data = {**data, "duration": duration}
    try:
        # base_dir: a workload given as a path is resolved beside the config file.
        config = RunConfig.model_validate(data, context={"base_dir": Path(path).parent})
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, path, data=data, model=RunConfig) from exc
    check_run_config(config, path)
    line = bare_duration_warning(path, data, overridden=duration is not None)
    if line is not None:
        (warn or _stderr)(line)
    return config


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def bare_duration_warning(path: str | Path, data: dict[str, Any], *, overridden: bool = False) -> str | None:
    """One line naming the durations the file gives as bare numbers (read as
    seconds, kept for the configs that say ``duration: 300``), or None."""
    from soak.configkeys import bare_durations, key_lines

    found = [(keys, value) for keys, value in bare_durations(RunConfig, data)
             if not (overridden and keys == ["duration"])]
    if not found:
        return None
    lines = key_lines(path, [keys for keys, _ in found])
    names = [_dotted(keys) for keys, _ in found]
    if len(found) == 1:
        value = found[0][1]
        where = f"{path}:{lines[0]}" if lines[0] is not None else str(path)
        return (f"warning: {where}: {names[0]}: {value} has no unit and is read as {value}s; "
                f"write {value}s (or {value}m if minutes were meant)")
    shown = [f"{n} (line {ln})" if ln is not None else n for n, ln in zip(names, lines)][:5]
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return (f"warning: {path}: {len(found)} durations have no unit and are read as seconds: "
            f"{', '.join(shown)}{more}; write the unit (30s, 30m)")


def _dotted(keys: list[str | int]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else ("." if i else "") + str(k) for i, k in enumerate(keys))


def check_run_config(config: RunConfig, path: str | Path) -> None:
    """Rules across fields, each naming the field it blames."""

    def fail(field: str, message: str) -> None:
        raise ConfigError(message, path=path, field=field)

    if config.duration <= 0:
        fail("duration", "must be greater than 0")
    if config.warmup >= config.duration:
        fail("warmup", f"must be shorter than the duration ({config.duration:g}s)")
    load = config.load
    if load.mode == "open" and load.rate is None:
        fail("load.rate", "mode open needs a rate (requests per second)")
    if load.mode == "closed" and load.rate is not None:
        fail("load.rate", "only mode open sends at a rate; closed mode is paced by concurrency and think time")
    timeouts = load.timeouts
    if timeouts.stall > timeouts.total:
        fail("load.timeouts.stall", "must not exceed load.timeouts.total")
    if timeouts.first_token > timeouts.total:
        fail("load.timeouts.first_token", "must not exceed load.timeouts.total")
    problem = threshold_problem(config.thresholds)
    if problem is not None:
        fail(*problem)


def redacted_config(config: RunConfig) -> dict[str, Any]:
    """The resolved config as written to the run directory: secrets as ``***``."""
    data = config.model_dump(mode="json")
    data["target"] = redact_target(data["target"])
    return data
