"""``soak bisect BISECT.yaml --out DIR [--resume]``: which build broke it?

Runs segments (ordinary ``soak run`` directories, DIR/segment-NNN-build-K) one
after another through the local executor, keeps the posterior over the first bad
build, and writes DIR/bisect.json and DIR/bisect.html after every segment. One
line per segment, one ending line. A DIR that already holds segments is resumed
from them (``--resume`` says so explicitly and refuses a DIR with none).

Exit status (docs/bisect.md): 0 a build named at the stated posterior; 5 the
budget (time at risk or segment count) spent undecided; 2 bad input; 3 a
segment's target never became ready (or its server answered no request ok); 4 a harness fault (a segment's soak run
failed, or its directory cannot be read); 130 interrupted (Ctrl-C, SIGTERM: the
segment in flight is stopped, what it recorded kept, and a later run resumes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

EXIT_FOUND, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 5, 130
DEFAULT_SEGMENT_BOUND = 200  # segments at most when the budget names no count


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bisect", metavar="BISECT.yaml", type=Path, help="the builds, base run config, segment and stop")
    parser.add_argument("--out", metavar="DIR", type=Path, required=True,
                        help="the bisect's folder: a segment run directory each, bisect.json, bisect.html")
    parser.add_argument("--resume", action="store_true",
                        help="continue a killed bisect from DIR's segments (automatic when DIR holds some)")


def main(args: argparse.Namespace) -> int:
    return bisect(args.bisect, out=args.out, resume=args.resume)


BISECT_JSON_LIMIT = 64 << 20  # bytes: 1000 segments of 64 builds' posteriors is a few MB


def _check_out(out: Path, labels: list[str], *, resume: bool, expect: dict[str, Any] | None = None) -> None:
    """Refuse a --out that is not this bisect's. ``expect``: the bisect.json this
    bisect file makes (no segment yet): a folder whose file says another segment
    length, prior, rates or build config is refused by name, not resumed into
    evidence of two different questions."""
    from dataclasses import replace

    from soak.bisect.record import changed_settings
    from soak.bounds import LIMITS, Bound, BoundExceeded, read_json_file
    from soak.bisect.segments import parse_segment_dir
    from soak.errors import UsageError
    from soak.printable import printable

    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: not a directory")
    out.mkdir(parents=True, exist_ok=True)
    record = out / "bisect.json"
    segments = [c for c in out.iterdir() if c.is_dir() and parse_segment_dir(c) is not None]
    if resume and not segments:
        raise UsageError(f"{out}: no segments to resume (segment-NNN-build-K directories)")
    if record.is_file():
        try:
            # Bounded (bytes, nesting, finite numbers) and never waiting (a FIFO):
            # whatever is there is one line naming the file, not a traceback.
            try:
                had_doc = read_json_file(record, limits=replace(LIMITS, file_bytes=BISECT_JSON_LIMIT), devices=False)
            except BoundExceeded as exc:
                if exc.bound is not Bound.FILE_BYTES:
                    raise
                raise ValueError(f"over {BISECT_JSON_LIMIT >> 20} MiB") from exc
            had = [str(b["label"]) for b in had_doc["builds"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{out}/bisect.json: cannot be read ({printable(str(exc), limit=80)}); "
                             "give a new --out") from exc
        if had != labels:
            raise UsageError(f"{out}: a bisect of other builds ({printable(', '.join(had), limit=200)}); "
                             "give a new --out")
        changed = changed_settings(had_doc, expect) if expect is not None and isinstance(had_doc, dict) else []
        if changed:
            raise UsageError(printable(f"{out}: its segments were run under other settings "
                                       f"({'; '.join(changed)}): they would not mix with this bisect file's; give a new --out or restore the file",
                                       limit=400))
    elif any(c.name not in ("configs",) for c in out.iterdir()) and not segments:
        raise UsageError(f"{out}: not empty and holds no bisect; give a new or empty --out")


def _reports(out: Path, results) -> list[str | None]:
    return [f"{r.run_dir.name}/report.html" if (r.run_dir / "report.html").is_file() else None for r in results]


def write_outputs(out: Path, doc: dict[str, Any], results, *, title: str) -> None:
    from soak.bisect.page import render_html
    from soak.bisect.record import write_bisect_json
    from soak.fsio import write_atomic

    write_bisect_json(out / "bisect.json", doc)
    write_atomic(out / "bisect.html", render_html(doc, reports=_reports(out, results), title=title))


SLURM_JOBS = ".slurm-jobs"  # the Slurm executor's jobs in flight (soak.bisect.slurm)


def bisect(path: Path, *, out: Path, resume: bool = False, environ: dict[str, str] | None = None,
           say: Callable[[str], None] | None = None) -> int:
    import asyncio
    import signal

    from soak.bisect.spec import load_bisect
    from soak.bisect.conduct import conduct
    from soak.bisect.executor import Build
    from soak.bisect.local import LocalExecutor, config_digest, wait_for_orphan
    from soak.bisect.page import segment_line, sentence
    from soak.bisect.record import bisect_document
    from soak.bisect.segments import next_number, read_segments
    from soak.printable import printable

    say = say or (lambda line: print(line, flush=True))
    spec = load_bisect(path)
    config = spec.config
    builds = [Build(i, b.label) for i, b in enumerate(config.builds)]
    options = dict(model=spec.model, segment_s=config.segment, threshold=config.stop_at,
                   budget_s=config.budget.time_at_risk)
    digests = [config_digest(c) for c in spec.segment_configs]
    _check_out(out, spec.labels, resume=resume, expect=bisect_document(builds, (), digests=digests, **options))
    wait_for_orphan(out)
    if config.executor.kind == "slurm":
        from soak.bisect.slurm import bisect_job_name, cancel_leftover_jobs

        left = cancel_leftover_jobs(out / SLURM_JOBS, job_name=bisect_job_name(out), env=environ)
        if left:
            say(f"soak bisect: cancelled {len(left)} job(s) the killed bisect left in flight: {' '.join(left)}")
    done = read_segments(out, builds=len(config.builds), on_skip=lambda exc: _set_aside(exc, say))
    bound = config.budget.segments or DEFAULT_SEGMENT_BOUND
    if done:
        say(printable(f"soak bisect: resuming {out}: {len(done)} segments read back"))
    else:
        say(printable(f"soak bisect: {len(builds)} builds ({', '.join(spec.labels)}), segments of "
                      f"{config.segment:g}s at risk, stop at {config.stop_at:g}; writing {out}"))
    shown = [len(done)]
    doc: dict[str, Any] = {}

    def on_step(step, results) -> None:
        doc.clear()
        doc.update(bisect_document(builds, results, digests=digests, **options))
        write_outputs(out, doc, results, title=config.name)
        for number in range(shown[0], len(results)):
            say(segment_line(bisect_document(builds, results[:number + 1], digests=digests, **options), number))
        shown[0] = len(results)

    executor = LocalExecutor(root=out, segment_configs=spec.segment_configs, envs=spec.envs, seed=config.seed,
                             environ=environ)
    if config.executor.kind == "slurm":
        executor = _slurm_executor(config, local=executor, envs=executor.envs, environ=environ, out=out, say=say)

    async def run():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await conduct(builds, executor, root=out, done=done, on_step=on_step, max_segments=bound,
                                 first_number=next_number(out),
                                 **options)
        finally:
            await executor.aclose()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        outcome = asyncio.run(run())
    except (asyncio.CancelledError, KeyboardInterrupt):
        results = read_segments(out, builds=len(builds))  # the stopped segment too, as far as it recorded
        doc = bisect_document(builds, results, digests=digests, **options)
        write_outputs(out, doc, results, title=config.name)
        say(printable(f"soak bisect: interrupted; {sentence(doc)}; resume with: soak bisect {path} --out {out}"))
        return EXIT_INTERRUPTED
    if outcome.stopped_by == "segment bound":
        doc["stopped_by"] = "segment bound"
        write_outputs(out, doc, outcome.results, title=config.name)
    say(printable(f"soak bisect: {sentence(doc)}; {out / 'bisect.html'}"))
    return EXIT_FOUND if outcome.stopped_by == "found" else EXIT_UNDECIDED


def _slurm_executor(config, *, local, envs, environ, out: Path, say):
    """Segments as Slurm jobs: the same ``soak run`` command and segment config the
    local executor writes (``LocalExecutor.command``), submitted with sbatch."""
    from soak.bisect.slurm import SlurmExecutor, SlurmOptions, bisect_job_name

    spec = config.executor
    options = SlurmOptions(slots=spec.slots, cpus_per_segment=spec.cpus_per_segment,
                           gpus_per_segment=spec.gpus_per_segment, partition=spec.partition,
                           overhead_s=spec.overhead, poll_s=spec.poll, job_name=bisect_job_name(out),
                           comment=f"soak bisect {config.name}")
    from soak.printable import printable

    return SlurmExecutor(lambda build, segment_s, run_dir: local.command(build, segment_s=segment_s, run_dir=run_dir)[0],
                         options=options, env=environ, build_env=lambda build: envs[build.index],
                         log_dir=out / "configs", jobs_file=out / SLURM_JOBS,
                         on_event=lambda line: say(printable(f"soak bisect: slurm {line}")))


def _set_aside(exc, say: Callable[[str], None]) -> None:
    """An unreadable segment directory (the bisect died before its run wrote
    anything) is renamed out of the segment pattern: evidence of nothing, and its
    number free for the next segment, which would otherwise collide with it. The
    error may name a file inside the directory: the segment is the nearest folder
    up that is named like one."""
    from soak.bisect.segments import parse_segment_dir

    named = Path(exc.path) if getattr(exc, "path", None) else None
    # a file in the run directory or a folder of it (incidents/1/...): three steps up at most
    where = next((p for p in ([named, *named.parents][:4] if named else []) if parse_segment_dir(p)), None)
    if where is not None and where.is_dir():
        target = where.with_name(where.name + ".unreadable")
        if not target.exists():
            where.rename(target)
    print(f"soak bisect: skipped {exc}", file=sys.stderr)
