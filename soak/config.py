"""The run config: one YAML file, validated whole before anything starts.

Sections are owned by their stages (``soak/<stage>/config.py``); this module
composes them and turns every failure into one ``ConfigError`` line that names
the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from soak.configbase import Duration, StrictModel
from soak.detect.config import DetectorConfig
from soak.errors import ConfigError
from soak.export.config import ExporterConfig
from soak.load.config import LoadConfig
from soak.probes.config import ProbesConfig
from soak.respond.config import ResponseConfig
from soak.run.config import SimulatorTarget, TargetConfig
from soak.workload.config import SyntheticAgenticConfig, WorkloadConfig


class RunConfig(StrictModel):
    name: str = "soak"
    duration: Duration = 300.0
    warmup: Duration = 0.0
    seed: int = 0
    target: TargetConfig = SimulatorTarget()
    workload: WorkloadConfig = SyntheticAgenticConfig()
    load: LoadConfig = LoadConfig()
    probes: ProbesConfig = ProbesConfig()
    detector: DetectorConfig = DetectorConfig()
    response: ResponseConfig = ResponseConfig()
    exporter: ExporterConfig = ExporterConfig()


def field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a dotted path; tagged-union branch names dropped."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif isinstance(item, str) and (item.startswith("function-") or "[" in item):
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "<root>"


def validation_error_to_config_error(exc: ValidationError, path: str | Path, prefix: str = "") -> ConfigError:
    first = exc.errors(include_url=False)[0]
    field = field_path(tuple(first["loc"]))
    if prefix:
        field = f"{prefix}.{field}" if field != "<root>" else prefix
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    return ConfigError(message, path=path, field=field)


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError("no such file", path=path) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", path=path) from exc
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise ConfigError(f"invalid YAML: {exc.problem}", path=path, line=line) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=path) from exc


def load_run_config(path: str | Path) -> RunConfig:
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=path)
    try:
        return RunConfig.model_validate(data, context={"base_dir": Path(path).parent})
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, path) from exc
