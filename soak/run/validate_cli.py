"""``soak validate CONFIG``: check the config and its workload, print the plan, run nothing.

Exit 0 when the config is good (the plan is printed), 2 with one line naming
the file and the field when it is not. ``soak validate --explain KEY`` prints one
key's entry of the config reference (docs/config-reference.md) and needs no config;
an unknown key is one line naming the close matches, exit 2. Token counts come from the counter the
workload would use when that needs no server (the simulator's tokenizer, a
local tokenizer, or an estimate, labelled as such).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, nargs="?", default=None,
                        help="the run config (YAML); not needed with --explain")
    parser.add_argument("--duration", metavar="DURATION", default=None, help="as for soak run")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--explain", metavar="KEY", default=None,
                        help="print a config key's type, default, unit, description and example "
                             "(target.model, oracle.tie_margin, workload.synthetic_agentic.max_context_tokens; "
                             "the kind may be left out, as the YAML does: workload.max_context_tokens)")


def main(args: argparse.Namespace) -> int:
    if args.explain is not None:
        return explain(args.explain)
    if args.config is None:
        from soak.errors import ArgumentError

        raise ArgumentError("give a CONFIG to validate, or --explain KEY")
    return validate(args.config, duration=args.duration, as_json=args.json)


def explain(key: str) -> int:
    """Print the reference entry (or entries: one per kind that has the key) for ``key``."""
    from soak.configref import close_matches, entries, explain_text, find
    from soak.errors import ArgumentError
    from soak.printable import printable

    found = entries()
    matched = find(key, found)
    if not matched:
        near = close_matches(key, found)
        hint = f"; did you mean {', '.join(near)}?" if near else "; docs/config-reference.md lists every key"
        raise ArgumentError(printable(f"--explain: no config key {key!r}{hint}"))
    print("\n\n".join(explain_text(e) for e in matched))
    return 0


def validate(config_path: Path, *, duration: str | None, as_json: bool) -> int:
    import asyncio
    import json

    from soak.config import load_run_config
    from soak.durations import duration_flag
    from soak.records import TargetKind
    from soak.run.wiring import workload_factory
    from soak.target.config import target_layout

    config = load_run_config(config_path, duration=duration_flag(duration))
    layout = target_layout(config.target)
    workload = workload_factory(config, config_path=Path(config_path), block_size=layout.block_size)(None)
    from soak.run.proving import resolve_plan

    proof_plan = resolve_plan(config.prove, config_path=config_path)  # a broken build without history: exit 2

    async def plan():
        from soak.workload import make_counter

        counter = make_counter(
            config.workload.tokenizer,
            target_is_simulator=layout.kind is TargetKind.SIMULATOR,
            base_url=None,
            config_path=config_path,
        )
        await workload.calibrate(counter)
        return workload.plan(duration_s=config.duration, concurrency=config.load.concurrency,
                             block_size=layout.block_size)

    planned = asyncio.run(plan())
    if as_json:
        print(json.dumps(planned.to_json(), indent=2))
    else:
        print(f"{config_path}: ok ({config.target.kind} target, load {config.load.mode}, "
              f"concurrency {config.load.concurrency}, duration {config.duration:g}s)")
        print(planned.describe())
        if proof_plan is not None:
            from soak.prove.sprt import decide

            print(f"prove: {decide(proof_plan, exposure_s=0.0, hangs=0).sentence}")
    return 0
