"""Command line: plan a length file and print per-step figures, or check a saved plan.

    megatron-dpsched plan LENGTHS.txt --dp-size 8 --global-batch-size 256 --max-tokens-per-gpu 16384 [-o plan.json]
    megatron-dpsched check plan.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from megatron_dpsched.core import DPSchedule, ScheduleInvariantError, build_dp_schedule


def read_lengths(path: str) -> list[int]:
    """One integer token count per line; blank lines are skipped."""
    with open(path, encoding="utf-8") as handle:
        lengths = []
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    lengths.append(int(line))
                except ValueError:
                    raise ValueError(f"{path}:{number}: not an integer token count: {line.strip()!r}") from None
    return lengths


def load_plan(path: str) -> DPSchedule:
    """A plan written by ``megatron-dpsched plan -o`` (or ``json.dump(schedule.to_dict())``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file; a plan is the JSON file that 'megatron-dpsched plan -o' "
                         "writes") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error.msg} at line {error.lineno} column {error.colno}); "
                         "a plan is the JSON file that 'megatron-dpsched plan -o' writes") from None
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply to be a plan") from None
    return DPSchedule.from_dict(data)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-dpsched", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="plan a file of token lengths (one per line)")
    plan.add_argument("lengths")
    plan.add_argument("--dp-size", type=int, required=True)
    plan.add_argument("--global-batch-size", type=int, required=True)
    batching = plan.add_mutually_exclusive_group(required=True)
    batching.add_argument("--max-tokens-per-gpu", type=int)
    batching.add_argument("--micro-batch-size", type=int)
    for flag in ("--cp-size", "--pp-size", "--vpp-size"):
        plan.add_argument(flag, type=int, default=1)
    plan.add_argument("--microbatch-group-size-per-vp-stage", type=int)
    plan.add_argument("--balance", choices=("cost", "tokens", "none"), default="cost",
                      help="cost (default): s + s^2/49152 per sample (tokens plus attention); tokens; none")
    plan.add_argument("--drop-last", action="store_true")
    plan.add_argument("-o", "--output", help="write the plan as JSON here")
    check = commands.add_parser("check", help="check the invariants of a JSON plan")
    check.add_argument("plan")
    return parser


def _plan(args: argparse.Namespace) -> DPSchedule:
    return build_dp_schedule(
        read_lengths(args.lengths),
        dp_size=args.dp_size,
        global_batch_size=args.global_batch_size,
        max_tokens_per_gpu=args.max_tokens_per_gpu,
        micro_batch_size=args.micro_batch_size,
        cp_size=args.cp_size,
        pp_size=args.pp_size,
        vpp_size=args.vpp_size,
        microbatch_group_size_per_vp_stage=args.microbatch_group_size_per_vp_stage,
        balance=args.balance,
        drop_last=args.drop_last,
    )


def print_stats(schedule: DPSchedule) -> None:
    """One line per step: samples, micro-batches vs the lower bound, fill, imbalance."""
    print("step  samples  micro-batches/rank  lower-bound  empty  token-fill  imbalance")
    for s in schedule.stats():
        print(f"{s.step:4d}  {s.num_samples:7d}  {s.num_microbatches:18d}  {s.lower_bound:11d}  "
              f"{s.empty_microbatches:5d}  {s.token_fill:10.3f}  {s.imbalance:9.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``megatron-dpsched`` command."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "plan":
            schedule = _plan(args)
            if args.output:
                with open(args.output, "w", encoding="utf-8") as handle:
                    json.dump(schedule.to_dict(), handle)
        else:
            schedule = load_plan(args.plan)
        schedule.check()
    except (ValueError, OSError, ScheduleInvariantError) as error:
        message = " ".join(str(error).split())  # one line, whatever the error says
        print(f"megatron-dpsched: error: {message}", file=sys.stderr)
        return 2
    print_stats(schedule)
    return 0


if __name__ == "__main__":
    sys.exit(main())
