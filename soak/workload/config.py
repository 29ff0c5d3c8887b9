"""Workload files, tagged by ``kind``.

A workload section is one of three kinds:

- ``synthetic_agentic``: closed-loop agent sessions whose context grows turn by
  turn inside ``[min_context_tokens, max_context_tokens]``;
- ``replay_jsonl``: OpenAI chat or completion requests captured from an agent,
  one a line;
- ``mooncake_trace``: the Mooncake trace format (``hash_ids`` of 512-token blocks).

Sizes and times come from seeded distributions, tagged by ``dist``
(``constant``, ``uniform``, ``lognormal``); a bare number means ``constant``.

In a run config the section may also be a path to a workload file (or straight
to a trace file) beside the config: ``load_workload_section(value, base_dir)``
resolves it, and so does validating the run config with
``context={"base_dir": DIR}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import (
    BeforeValidator,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from soak.configbase import StrictModel
from soak.errors import WorkloadError

# ---------------------------------------------------------------------------
# tagged unions with "unknown kind X, known: a, b" errors


def _tag_checker(tag: str, known: tuple[str, ...], *, default: str | None = None, bare_number: bool = False):
    def check(value: Any) -> Any:
        if bare_number and isinstance(value, (int, float)) and not isinstance(value, bool):
            return {tag: "constant", "value": value}
        if not isinstance(value, Mapping):
            return value  # pydantic names the type error
        if tag not in value:
            if default is None:
                raise PydanticCustomError("missing_kind", "missing {tag}, known: {known}", {"tag": tag, "known": ", ".join(known)})
            return {tag: default, **value}
        if value[tag] not in known:
            raise PydanticCustomError(
                "unknown_kind",
                "unknown {tag} {value}, known: {known}",
                {"tag": tag, "value": value[tag], "known": ", ".join(known)},
            )
        return value

    return BeforeValidator(check)


# ---------------------------------------------------------------------------
# distributions


class ConstantDist(StrictModel):
    dist: Literal["constant"] = "constant"
    value: float = Field(ge=0)


class UniformDist(StrictModel):
    dist: Literal["uniform"] = "uniform"
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @field_validator("high")
    @classmethod
    def _high_not_below_low(cls, high: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and high < low:
            raise PydanticCustomError("min_above_max", "high ({high}) is below low ({low})", {"high": high, "low": low})
        return high


class LognormalDist(StrictModel):
    """``exp(N(ln median, sigma))``, clipped to ``[min, max]`` when given."""

    dist: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, ge=0)

    @field_validator("max")
    @classmethod
    def _max_not_below_min(cls, high: float | None, info: ValidationInfo) -> float | None:
        low = info.data.get("min")
        if high is not None and low is not None and high < low:
            raise PydanticCustomError("min_above_max", "max ({high}) is below min ({low})", {"high": high, "low": low})
        return high


DIST_KINDS = ("constant", "uniform", "lognormal")
Distribution = Annotated[
    Union[ConstantDist, UniformDist, LognormalDist],
    Field(discriminator="dist"),
    _tag_checker("dist", DIST_KINDS, bare_number=True),
]


def dist_bounds(dist: ConstantDist | UniformDist | LognormalDist) -> tuple[float, float]:
    """Smallest and largest value a distribution can produce (inf when unbounded)."""
    if isinstance(dist, ConstantDist):
        return dist.value, dist.value
    if isinstance(dist, UniformDist):
        return dist.low, dist.high
    return (dist.min if dist.min is not None else 0.0), (dist.max if dist.max is not None else float("inf"))


# ---------------------------------------------------------------------------
# corpus


class StdlibCorpus(StrictModel):
    """The Python standard library's own source files: works offline anywhere."""

    kind: Literal["stdlib"] = "stdlib"
    max_bytes: PositiveInt = 12_000_000


class DirectoryCorpus(StrictModel):
    kind: Literal["directory"] = "directory"
    path: Path
    glob: str = "**/*"
    max_bytes: PositiveInt = 12_000_000


class FilesCorpus(StrictModel):
    kind: Literal["files"] = "files"
    paths: list[Path] = Field(min_length=1)
    max_bytes: PositiveInt = 12_000_000


CORPUS_KINDS = ("stdlib", "directory", "files")
CorpusConfig = Annotated[
    Union[StdlibCorpus, DirectoryCorpus, FilesCorpus],
    Field(discriminator="kind"),
    _tag_checker("kind", CORPUS_KINDS),
]


# ---------------------------------------------------------------------------
# token counting


class AutoTokenizer(StrictModel):
    """The simulator's tokenizer when the target is the simulator, else the target's /tokenize."""

    kind: Literal["auto"] = "auto"


class TargetTokenizer(StrictModel):
    kind: Literal["target"] = "target"


class LocalTokenizer(StrictModel):
    """A ``tokenizers`` tokenizer.json; chat framing from the simulator's template."""

    kind: Literal["local"] = "local"
    path: Path


class EstimateTokenizer(StrictModel):
    kind: Literal["estimate"] = "estimate"
    chars_per_token: float = Field(default=4.0, gt=0)


TOKENIZER_KINDS = ("auto", "target", "local", "estimate")
TokenizerConfig = Annotated[
    Union[AutoTokenizer, TargetTokenizer, LocalTokenizer, EstimateTokenizer],
    Field(discriminator="kind"),
    _tag_checker("kind", TOKENIZER_KINDS),
]


class ServiceAssumptions(StrictModel):
    """What the plan assumes about the target's speed, to count requests over a duration.

    Only the request count depends on these; token counts and hit ratios do not.
    """

    prefill_tokens_per_s: float = Field(default=8000.0, gt=0)
    decode_tokens_per_s: float = Field(default=25.0, gt=0)

    def time_s(self, turn: Any) -> float:
        """Seconds a planned turn keeps its slot: the uncached prefill, then the decode."""
        uncached = turn.prompt_tokens - turn.cached_tokens
        return uncached / self.prefill_tokens_per_s + turn.output_tokens / self.decode_tokens_per_s


# ---------------------------------------------------------------------------
# workload kinds


def _uniform(low: float, high: float) -> UniformDist:
    return UniformDist(low=low, high=high)


class SyntheticAgenticConfig(StrictModel):
    """Closed-loop agent sessions: a shared prefix, a per-session repository, tool turns.

    A session starts at ``start_context_tokens`` (the shared prefix plus the
    repository it reads) and appends an assistant tool call and a tool result
    each turn. When the next turn would pass ``max_context_tokens`` the session
    ends and the slot starts a new one (docs/workloads.md says why).
    """

    kind: Literal["synthetic_agentic"] = "synthetic_agentic"
    min_context_tokens: PositiveInt = 190_000
    max_context_tokens: PositiveInt = 230_000
    start_context_tokens: Distribution = _uniform(190_000, 196_000)
    shared_prefix_tokens: int = Field(default=12_000, ge=0)
    tool_call_tokens: Distribution = _uniform(20, 80)
    tool_result_tokens: Distribution = LognormalDist(median=1800, sigma=0.6, min=64, max=8000)
    output_tokens: Distribution = LognormalDist(median=96, sigma=0.5, min=8, max=1024)
    think_time_s: Distribution = LognormalDist(median=1.5, sigma=0.5, min=0, max=20)
    at_max: Literal["new_session"] = "new_session"
    max_sessions: PositiveInt | None = None
    corpus: CorpusConfig = StdlibCorpus()
    tokenizer: TokenizerConfig = AutoTokenizer()
    context_chunk_tokens: PositiveInt = 4000
    context_chunks: PositiveInt = 256
    tool_result_pool: PositiveInt = 192
    ignore_eos: bool = True
    # What the requests say about their tools. "none" (the default) sends the
    # tool schemas, which the chat template still renders into the prompt, and
    # tool_choice "none": every vLLM accepts it. "auto" asks the server to parse
    # tool calls, which vLLM refuses with HTTP 400 unless it runs with
    # --enable-auto-tool-choice and --tool-call-parser (the seed box does not);
    # "omit" leaves tool_choice out, which vLLM reads as "auto" when tools are
    # present. "no_tools" sends no tool schemas at all (smaller prompts).
    tool_choice: Literal["none", "auto", "omit", "no_tools"] = "none"
    service: ServiceAssumptions = ServiceAssumptions()

    @field_validator("max_context_tokens")
    @classmethod
    def _max_not_below_min(cls, high: int, info: ValidationInfo) -> int:
        low = info.data.get("min_context_tokens")
        if low is not None and high < low:
            raise PydanticCustomError(
                "min_above_max", "max_context_tokens ({high}) is below min_context_tokens ({low})", {"high": high, "low": low}
            )
        return high

    @field_validator("start_context_tokens")
    @classmethod
    def _start_inside_context(cls, dist: Any, info: ValidationInfo) -> Any:
        low, high = info.data.get("min_context_tokens"), info.data.get("max_context_tokens")
        if low is None or high is None:
            return dist
        smallest, largest = dist_bounds(dist)
        if smallest < low or largest > high:
            raise PydanticCustomError(
                "outside_context",
                "must stay inside [min_context_tokens, max_context_tokens] = [{low}, {high}]; "
                "a lognormal needs min and max",
                {"low": low, "high": high},
            )
        return dist

    @field_validator("shared_prefix_tokens")
    @classmethod
    def _prefix_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min_context_tokens")
        if low is not None and value >= low:
            raise PydanticCustomError("too_large", "must be below min_context_tokens ({low})", {"low": low})
        return value


class ReplayJsonlConfig(StrictModel):
    """OpenAI chat or completion requests, one JSON object a line.

    A line is either the request itself (``messages`` or ``prompt``, with
    optional ``session_id`` and ``timestamp`` keys beside) or a wrapper
    ``{"session_id": ..., "timestamp": ..., "body": {request}}``.
    """

    kind: Literal["replay_jsonl"] = "replay_jsonl"
    path: Path
    replay: Literal["timestamps", "closed_loop"] = "closed_loop"
    time_scale: float = Field(default=1.0, gt=0)
    timestamp_unit: Literal["s", "ms"] = "s"
    default_max_tokens: PositiveInt = 256
    max_tokens_override: PositiveInt | None = None
    think_time_s: Distribution = ConstantDist(value=0)
    limit: PositiveInt | None = None
    tokenizer: TokenizerConfig = AutoTokenizer()
    count_tokens: bool = True
    service: ServiceAssumptions = ServiceAssumptions()


class MooncakeTraceConfig(StrictModel):
    """The Mooncake trace: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Each hash id becomes a deterministic ``block_tokens``-token text block, so
    requests that share an id share exactly that text; requests go to
    ``/v1/completions``.
    """

    kind: Literal["mooncake_trace"] = "mooncake_trace"
    path: Path
    replay: Literal["timestamps", "closed_loop"] = "timestamps"
    time_scale: float = Field(default=1.0, gt=0)
    block_tokens: PositiveInt = 512
    limit: PositiveInt | None = None
    max_tokens_override: PositiveInt | None = None
    ignore_eos: bool = True
    corpus: CorpusConfig = StdlibCorpus(max_bytes=4_000_000)
    tokenizer: TokenizerConfig = AutoTokenizer()
    service: ServiceAssumptions = ServiceAssumptions()


WORKLOAD_KINDS = ("synthetic_agentic", "replay_jsonl", "mooncake_trace")


def _workload_value(value: Any, info: ValidationInfo) -> Any:
    """A path string becomes the file's section; anything else is checked for its kind."""
    if isinstance(value, (str, Path)):
        base_dir = Path((info.context or {}).get("base_dir", "."))
        path = resolve_path(value, base_dir)
        if not path.is_file():
            raise PydanticCustomError("no_such_file", "no such workload or trace file: {path}", {"path": str(path)})
        return load_workload_file(path)
    return value


WorkloadConfig = Annotated[
    Union[SyntheticAgenticConfig, ReplayJsonlConfig, MooncakeTraceConfig],
    Field(discriminator="kind"),
    _tag_checker("kind", WORKLOAD_KINDS, default="synthetic_agentic"),
    BeforeValidator(_workload_value),
]
"""The ``workload:`` section: one of the kinds, or a path to a workload or trace file."""

WorkloadSection = Union[SyntheticAgenticConfig, ReplayJsonlConfig, MooncakeTraceConfig]


class _WorkloadFile(StrictModel):
    workload: WorkloadConfig


# ---------------------------------------------------------------------------
# loading


def resolve_path(value: str | Path, base_dir: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (Path(base_dir) / path)


def field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's location as a dotted path, without the tag names of tagged unions."""
    tags = set(WORKLOAD_KINDS) | set(DIST_KINDS) | set(CORPUS_KINDS) | set(TOKENIZER_KINDS)
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in tags or "function-" in str(item) or "[" in str(item):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _unknown_key_error(exc: ValidationError, data: Mapping[str, Any], path: Path | str, *,
                       nested: bool) -> WorkloadError | None:
    """An unknown key as the run config says it (soak.configkeys): the known key
    it likely misspells and its line; of several, the first in the file. A
    misspelt key is also a missing or defaulted one, so it comes before any
    other error. None when no key is unknown."""
    from soak.configbase import data_path
    from soak.configkeys import key_lines, unknown_key_message

    unknown = [e for e in exc.errors(include_url=False) if e["type"] == "extra_forbidden"]
    if not unknown:
        return None
    # the keys as the file holds them: under ``workload:``, or the section at its root
    keys = [data_path(tuple(e["loc"]), {"workload": dict(data)})[0 if nested else 1:] for e in unknown]
    lines = key_lines(path, keys) if Path(path).is_file() else [None] * len(keys)
    line, first, where = min(zip(lines, unknown, keys), key=lambda row: row[0] if row[0] is not None else 1 << 62)
    field = "".join(f"[{k}]" if isinstance(k, int) else ("." if i else "") + str(k) for i, k in enumerate(where))
    return WorkloadError(unknown_key_message(_WorkloadFile, tuple(first["loc"])), path=path, field=field, line=line)


def _error_from_validation(exc: ValidationError, path: Path | str, *, nested: bool,
                           data: Mapping[str, Any] | None = None) -> WorkloadError:
    """The first error as one line; ``nested``: the section sits under ``workload:`` in its file."""
    if data is not None:
        unknown = _unknown_key_error(exc, data, path, nested=nested)
        if unknown is not None:
            return unknown
    first = exc.errors(include_url=False)[0]
    field = field_path(tuple(first["loc"]))  # starts with "workload"
    if not nested:
        field = field.removeprefix("workload").lstrip(".")
    if first["type"] in ("unknown_kind", "missing_kind"):
        tag = first.get("ctx", {}).get("tag", "kind")
        field = f"{field}.{tag}" if field else tag
    message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    return WorkloadError(message, path=path, field=field or None)


def _sniff_trace_kind(path: Path) -> str:
    from soak.workload.jsonl import iter_json_objects

    for _, row in iter_json_objects(path, limit=1, noun="line"):
        return "mooncake_trace" if "hash_ids" in row else "replay_jsonl"
    raise WorkloadError("the trace file is empty", path=path, line=1)


def load_workload_file(path: str | Path) -> WorkloadSection:
    """A workload YAML file (a section with ``kind``, or a run config with a
    ``workload:`` key) or a trace file (``.jsonl``: Mooncake rows or requests)."""
    path = Path(path)
    if path.suffix in (".jsonl", ".ndjson"):
        kind = _sniff_trace_kind(path)
        return validate_workload_section({"kind": kind, "path": str(path.resolve())}, path=path, base_dir=path.parent)
    from soak.configbase import read_yaml

    data = read_yaml(path, error=WorkloadError)
    if isinstance(data, dict) and "workload" in data and "kind" not in data:
        data, prefix = data["workload"], "workload"
    else:
        prefix = ""
    if isinstance(data, (str, Path)):
        return load_workload_file(resolve_path(data, path.parent))
    if not isinstance(data, dict):
        raise WorkloadError("expected a mapping with a kind", path=path, field=prefix or None)
    return validate_workload_section(data, path=path, base_dir=path.parent, prefix=prefix)


def validate_workload_section(
    data: Mapping[str, Any], *, path: str | Path, base_dir: Path, prefix: str = ""
) -> WorkloadSection:
    """Validate one section; relative paths inside it resolve against ``base_dir``."""
    try:
        section = _WorkloadFile.model_validate({"workload": dict(data)}, context={"base_dir": base_dir}).workload
    except ValidationError as exc:
        raise _error_from_validation(exc, path, nested=bool(prefix), data=data) from exc
    return absolutize(section, base_dir)


def absolutize(section: WorkloadSection, base_dir: Path) -> WorkloadSection:
    """The same section with every relative file path resolved against ``base_dir``."""
    updates: dict[str, Any] = {}
    if isinstance(section, (ReplayJsonlConfig, MooncakeTraceConfig)):
        updates["path"] = resolve_path(section.path, base_dir)
    corpus = getattr(section, "corpus", None)
    if isinstance(corpus, DirectoryCorpus):
        updates["corpus"] = corpus.model_copy(update={"path": resolve_path(corpus.path, base_dir)})
    elif isinstance(corpus, FilesCorpus):
        updates["corpus"] = corpus.model_copy(update={"paths": [resolve_path(p, base_dir) for p in corpus.paths]})
    tokenizer = getattr(section, "tokenizer", None)
    if isinstance(tokenizer, LocalTokenizer):
        updates["tokenizer"] = tokenizer.model_copy(update={"path": resolve_path(tokenizer.path, base_dir)})
    return section.model_copy(update=updates) if updates else section


def load_workload_section(value: Any, base_dir: str | Path, *, path: str | Path | None = None) -> WorkloadSection:
    """The run config's ``workload:`` value, resolved: an inline section, or a
    path (relative to ``base_dir``, the run config's directory) to a workload
    or trace file. Raises ``WorkloadError`` naming the file and field or line."""
    base_dir = Path(base_dir)
    if value is None:
        value = {}
    if isinstance(value, (str, Path)):
        return load_workload_file(resolve_path(value, base_dir))
    if isinstance(value, (SyntheticAgenticConfig, ReplayJsonlConfig, MooncakeTraceConfig)):
        return absolutize(value, base_dir)
    if not isinstance(value, Mapping):
        raise WorkloadError("expected a mapping with a kind, or a path to a workload file", path=path, field="workload")
    return validate_workload_section(value, path=path or base_dir, base_dir=base_dir, prefix="workload")
