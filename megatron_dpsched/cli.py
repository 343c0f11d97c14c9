"""Command line: plan an input and compare the plan with Megatron's micro-batches, or check a saved plan.

    megatron-dpsched plan LENGTHS.txt --dp-size 8 --global-batch-size 256 --max-tokens-per-gpu 16384 \\
        [--pp-size 4 --vpp-size 2 --hidden-size 4096 --num-layers 32 ...] [--plot-dir out] [--json] [-o plan.json]
    megatron-dpsched check plan.json
    megatron-dpsched calibrate STATS_DIR -o cost_model.json [--warmup-steps 2] [--robust] [--json]

Every bad input ends in one line ``megatron-dpsched: error: ...`` and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from megatron_dpsched.core import DPSchedule, ScheduleConfig, ScheduleInvariantError, StepTimeModel
from megatron_dpsched.core.cost import CostModelFile
from megatron_dpsched.core.padding import pad_multiple_for
from megatron_dpsched.whatif.analysis import (
    BASELINE_NAMES,
    OURS,
    PlanWarning,
    Simulation,
    WhatIf,
    compare,
    plan_baselines,
    plan_ours,
    plan_warnings,
)
from megatron_dpsched.whatif.inputs import load_sample_lengths, read_lengths
from megatron_dpsched.whatif.model import simulation_from_flags
from megatron_dpsched.whatif.progress import Progress
from megatron_dpsched.whatif.report import header_lines, report_json, table_lines

__all__ = ["build_parser", "load_plan", "main", "read_lengths"]

PROG = "megatron-dpsched"


def load_plan(path: str) -> DPSchedule:
    """A plan written by ``megatron-dpsched plan -o`` (or ``json.dump(schedule.to_dict())``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file; a plan is the JSON file that 'megatron-dpsched plan -o' "
                         "writes") from None
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error.msg} at line {error.lineno} column {error.colno}); "
                         "a plan is the JSON file that 'megatron-dpsched plan -o' writes") from None
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply to be a plan") from None
    return DPSchedule.from_dict(data)


class _Parser(argparse.ArgumentParser):
    """Errors as one line, ``megatron-dpsched: error: ...``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _number(kind: Callable[[str], float], *, minimum: float, strict: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__ == 'int' and 'an integer' or 'a number'}, "
                                             f"got {text!r}") from None
        if value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if value != value or value < minimum or (strict and value == minimum):
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
        return value
    parse.__name__ = kind.__name__
    return parse


POSITIVE = _number(int, minimum=1, strict=False)
NON_NEGATIVE = _number(float, minimum=0.0, strict=False)
GREATER_THAN_ZERO = _number(float, minimum=0.0, strict=True)


def _add_layout(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("layout")
    group.add_argument("--dp-size", type=POSITIVE, required=True, help="data-parallel ranks")
    group.add_argument("--global-batch-size", type=POSITIVE, required=True, help="samples per optimizer step")
    batching = group.add_mutually_exclusive_group(required=True)
    batching.add_argument("--max-tokens-per-gpu", type=POSITIVE, metavar="CAP",
                          help="token cap of one micro-batch on one GPU (x CP per DP rank): dynamic batching")
    batching.add_argument("--micro-batch-size", type=POSITIVE,
                          help="static batching: samples per micro-batch (no baselines to compare with)")
    group.add_argument("--pp-size", type=POSITIVE, default=1, help="pipeline-parallel stages (default 1)")
    group.add_argument("--vpp-size", type=POSITIVE, default=1,
                       help="virtual pipeline stages (model chunks) per pipeline rank; > 1: interleaved schedule")
    group.add_argument("--microbatch-group-size-per-vp-stage", "--microbatch-group-size-per-virtual-pipeline-stage",
                       dest="group_size", type=POSITIVE, metavar="G",
                       help="interleaved schedule's group size (default: --pp-size, as in Megatron)")
    group.add_argument("--cp-size", type=POSITIVE, default=1,
                       help="context-parallel ranks sharing each micro-batch (default 1)")
    group.add_argument("--tp-size", type=POSITIVE, default=1,
                       help="tensor-parallel ranks: split every micro-batch's FLOPs in the step-time simulation")


def _add_planning(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("planning")
    group.add_argument("--balance", choices=("cost", "tokens", "none"), default="cost",
                       help="balance DP ranks by the model's FLOPs (cost, default), by tokens, or not at all")
    group.add_argument("--balance-growth", type=NON_NEGATIVE, default=0.0, metavar="F",
                       help="share (0 to 10) of extra micro-batches a step may spend to balance ranks (default 0)")
    group.add_argument("--drop-last", action="store_true",
                       help="drop a trailing partial step (its samples are listed in a warning)")


def _add_model(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group(
        "model", "what a sample costs, for --balance cost and the step times: a model shape's FLOPs (Megatron's "
        "flag names, or --model-shape; without either, the Llama-3-8B shape) at --flops-per-gpu, or the measured "
        "costs of --cost-model")
    for flag, what in (("--hidden-size", "model width"), ("--num-layers", "transformer layers"),
                       ("--num-attention-heads", "attention heads"),
                       ("--num-query-groups", "key/value heads (grouped-query attention)"),
                       ("--ffn-hidden-size", "MLP width (default 4 x --hidden-size)"),
                       ("--vocab-size", "vocabulary size of the output layer (default 0: left out)")):
        group.add_argument(flag, type=POSITIVE, help=what)
    group.add_argument("--swiglu", action="store_true", help="gated MLP (three weight matrices)")
    group.add_argument("--model-shape", metavar="FILE",
                       help="JSON object of CostModel fields instead of the flags above, e.g. "
                            '{"hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32}')
    group.add_argument("--cost-model", metavar="FILE",
                       help="the cost-model file 'megatron-dpsched calibrate' writes (as --dp-schedule-cost-model "
                            "in training): balance its measured per-sample cost and simulate with its step-time "
                            "model, instead of a model shape, --flops-per-gpu and --microbatch-overhead")


def _add_simulation(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("step-time simulation")
    group.add_argument("--flops-per-gpu", type=GREATER_THAN_ZERO, metavar="FLOPS",
                       help="FLOP/s one GPU achieves on this model (default 4e14)")
    group.add_argument("--microbatch-overhead", type=NON_NEGATIVE, metavar="SECONDS",
                       help="fixed forward time of every micro-batch, in seconds (default 0)")
    group.add_argument("--objective", choices=("step-time", "micro-batches"), default=None,
                       help="what dp-schedule's plan minimises: the simulated step time (default with --pp-size > 1 "
                            "and a token cap, as --dp-schedule-objective in Megatron) or the micro-batch count")
    group.add_argument("--collate-format", choices=("thd", "bshd"), default="thd",
                       help="micro-batches of dp-schedule and per-rank packing: packed (thd, default) or "
                            "padded to their longest sample (bshd); Megatron fixed is always padded")


def _add_output(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("output")
    group.add_argument("-o", "--output", metavar="PLAN.json", help="write dp-schedule's plan as JSON here")
    group.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    group.add_argument("--plot-dir", metavar="DIR",
                       help="write rank_load.png, microbatch_sizes.png and timeline.png here (needs matplotlib)")
    group.add_argument("--plot-step", type=_number(int, minimum=0, strict=False), metavar="N",
                       help="the step the load and timeline plots show (default: dp-schedule's slowest)")
    group.add_argument("--progress", action="store_true",
                       help="show a progress bar on stderr even when it is not a terminal")


def build_parser() -> argparse.ArgumentParser:
    """The ``megatron-dpsched`` parser (``plan``, ``check`` and ``calibrate``)."""
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{plan,check,calibrate}")
    plan = commands.add_parser(
        "plan", help="plan an input and compare with Megatron's fixed micro-batches and per-rank packing",
        description="Plan every step of an input with --dp-schedule's planner, Megatron's fixed micro-batches "
                    "and per-rank packing; print per step and in total the micro-batches, token fill, "
                    "imbalance, padding, simulated step time and dp-schedule's speedup. Token fill: the real "
                    "tokens that fit the cap / (micro-batches x DP x cap), 100% = every micro-batch full.")
    plan.add_argument("input", metavar="INPUT",
                      help="a length file (token counts separated by whitespace or newlines), a JSONL corpus "
                           '(*.jsonl, {"tokens": [ids]} per line) or an indexed dataset PREFIX (.bin/.idx)')
    for add in (_add_layout, _add_planning, _add_model, _add_simulation, _add_output):
        add(plan)
    check = commands.add_parser("check", help="check the invariants of a JSON plan and print its figures",
                                description="Check a plan written by 'megatron-dpsched plan -o'.")
    check.add_argument("plan", metavar="PLAN.json", help="the plan to check")
    _add_calibrate(commands)
    return parser


def _add_calibrate(commands: argparse._SubParsersAction) -> None:
    calibrate = commands.add_parser(
        "calibrate", help="fit the step-time model to measured step records and write a cost-model file",
        description="Fit seconds per token, per unit of sum(length^2) and per micro-batch (non-negative least "
                    "squares on the relative error) to the per-rank, per-step records of a PP=1 run's "
                    "--step-stats-dir, and write the cost-model file that --dp-schedule-cost-model loads.")
    calibrate.add_argument("stats", metavar="STATS", help="a --step-stats-dir folder (rank*.jsonl) or one JSONL file")
    calibrate.add_argument("-o", "--output", metavar="FILE", help="write the cost-model file here (JSON)")
    calibrate.add_argument("--warmup-steps", type=_number(int, minimum=0, strict=False), default=2, metavar="K",
                           help="leave out the first K steps of every rank (default 2)")
    calibrate.add_argument("--backward-factor", type=GREATER_THAN_ZERO, default=2.0, metavar="F",
                           help="backward time / forward time, fixed (default 2)")
    calibrate.add_argument("--robust", action="store_true",
                           help="Huber weights (iteratively reweighted): outlier steps weigh less")
    calibrate.add_argument("--lengths", choices=("real", "padded"), default="real",
                           help="fit on the samples' real lengths (what the planner sees, default) or on what the "
                                "micro-batch tensors hold, padding included")
    calibrate.add_argument("--time", choices=("compute", "forward-backward", "compute-cpu"), default="compute",
                           help="fit the rank's own forward-backward work (default; without the gradient "
                                "reduction, which waits for the slowest rank), the whole forward_backward_func, or "
                                "the rank's work in CPU seconds of its training thread (CPU runs on shared cores)")
    calibrate.add_argument("--json", action="store_true", help="print the cost-model file instead of the report")


FLAG_NAMES = ("dp_size", "global_batch_size", "max_tokens_per_gpu", "micro_batch_size", "cp_size", "pp_size",
              "vpp_size", "microbatch_group_size_per_vp_stage", "balance_growth")


def _as_flags(message: str) -> str:
    """The planner names its arguments; the command line user knows flags."""
    message = message.replace("step_time_model", "--objective step-time")
    for field, flag in (("flops_per_second", "--flops-per-gpu"), ("seconds_per_token", "--flops-per-gpu"),
                        ("seconds_per_microbatch", "--microbatch-overhead")):
        message = message.replace(field, flag)
    return re.sub(r"\b(" + "|".join(FLAG_NAMES) + r")\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


def _step_time_model(args: argparse.Namespace, simulation: Simulation) -> StepTimeModel | None:
    """The simulation's step-time model when dp-schedule plans for the step time (``--objective``)."""
    objective = args.objective or ("step-time" if args.pp_size > 1 and args.max_tokens_per_gpu else "micro-batches")
    if objective == "micro-batches":
        return None
    try:
        return simulation.timing(cp_size=args.cp_size)
    except ValueError as error:
        raise ValueError(_as_flags(str(error)) + f" (from --flops-per-gpu {simulation.flops_per_gpu:g})") from None


def _planned_sizes(args: argparse.Namespace) -> dict[str, object]:
    """What the cap bounds, as in training (``--dp-schedule-cap-counts padded``): each sample rounded up to
    ``2 x CP`` with context parallelism, and with ``bshd`` rows x the longest row."""
    if args.max_tokens_per_gpu is None:
        return {}
    return {"pad_multiple": _pad_multiple(args), "padded_rows": args.collate_format == "bshd"}


def _pad_multiple(args: argparse.Namespace) -> int:
    """The layout's sequence multiple (Megatron's rule; the what-if tool has no sequence-parallel flag)."""
    return pad_multiple_for(tensor_parallel_size=args.tp_size, context_parallel_size=args.cp_size,
                            sequence_parallel=False)


def _config(args: argparse.Namespace, *, step_time_model: StepTimeModel | None = None) -> ScheduleConfig:
    try:
        return ScheduleConfig(
            dp_size=args.dp_size, global_batch_size=args.global_batch_size,
            max_tokens_per_gpu=args.max_tokens_per_gpu, micro_batch_size=args.micro_batch_size,
            cp_size=args.cp_size, pp_size=args.pp_size, vpp_size=args.vpp_size,
            microbatch_group_size_per_vp_stage=args.group_size, balance=args.balance,
            drop_last=args.drop_last, balance_growth=args.balance_growth, step_time_model=step_time_model,
            **_planned_sizes(args),
        )
    except ValueError as error:
        raise ValueError(_as_flags(str(error))) from None


def _what_if(args: argparse.Namespace) -> tuple[WhatIf, str, str]:
    lengths, kind = load_sample_lengths(args.input)
    simulation, model_source = simulation_from_flags(args)
    config = _config(args, step_time_model=_step_time_model(args, simulation))
    shown = args.progress or sys.stderr.isatty()
    gbs = config.global_batch_size
    steps = len(lengths) // gbs if config.drop_last else -(-len(lengths) // gbs)
    try:
        with Progress("planning", steps, enabled=shown) as bar:
            ours = plan_ours(lengths, config=config, cost_model=simulation.cost_model, tick=bar.update)
        with Progress("baselines", len(BASELINE_NAMES) if config.token_cap else 0, enabled=shown) as bar:
            schedules = {OURS: ours, **plan_baselines(ours, tick=bar.update)}
        with Progress("simulating", schedules[OURS].num_steps, enabled=shown) as bar:
            compared = compare(schedules, simulation=simulation, tick=bar.update)
    except ValueError as error:
        raise ValueError(_as_flags(str(error))) from None
    report = WhatIf(config=config, simulation=simulation, schedules=schedules, steps=compared,
                    warnings=plan_warnings(schedules[OURS]))
    return report, f"{args.input} ({kind})", model_source


def _warn(warnings: Sequence[PlanWarning]) -> None:
    for warning in warnings:
        print(f"{PROG}: warning: {warning.message}", file=sys.stderr)


def _run_plan(args: argparse.Namespace) -> int:
    report, source, model_source = _what_if(args)
    step = report.slowest_step if args.plot_step is None else args.plot_step
    if step >= len(report.steps):
        raise ValueError(f"--plot-step {step}: the plan has steps 0..{len(report.steps) - 1}")
    _warn(report.warnings)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(report.schedules[OURS].to_dict(), handle)
    plots = []
    if args.plot_dir:
        from megatron_dpsched.whatif.plots import write_plots

        plots = write_plots(report, args.plot_dir, step=step)
    if args.json:
        json.dump(report_json(report, source=source, model_source=model_source, plots=plots), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    header = header_lines(report, source=source, model_source=model_source)
    sys.stdout.writelines(line + "\n" for line in table_lines(report, header=header))
    for path in plots:
        print(f"wrote {path}")
    if report.warnings:
        print(f"{PROG}: {len(report.warnings)} warning(s), printed above the table", file=sys.stderr)
    return 0


def print_stats(schedule: DPSchedule) -> None:
    """One line per step of a checked plan: samples, micro-batches vs the lower bound, fill, imbalance."""
    print("token fill: real tokens that fit the cap / (micro-batches x DP x cap); imbalance: busiest DP rank's "
          "cost / the mean rank's - 1, in %")
    print("step  samples  micro-batches/rank  lower-bound  empty  token-fill%  imbalance%")
    for s in schedule.stats():
        print(f"{s.step:4d}  {s.num_samples:7d}  {s.num_microbatches:18d}  {s.lower_bound:11d}  "
              f"{s.empty_microbatches:5d}  {100 * s.token_fill:11.1f}  {100 * (s.imbalance - 1):10.2f}")


def _run_check(args: argparse.Namespace) -> int:
    schedule = load_plan(args.plan)
    schedule.check()
    print_stats(schedule)
    return 0


def _run_calibrate(args: argparse.Namespace) -> int:
    from megatron_dpsched.calibration import fit, read_records, samples_from_records

    samples = samples_from_records(read_records(args.stats), warmup_steps=args.warmup_steps,
                                   lengths=args.lengths, time=args.time)
    result = fit(samples, backward_factor=args.backward_factor, robust=args.robust)
    report = {**result.report, "lengths": args.lengths, "time": args.time, "warmup_steps": args.warmup_steps}
    cost_file = dataclasses.replace(result.to_file(), fit=report)
    if args.output:
        cost_file.save(args.output)
    if args.json:
        json.dump(cost_file.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for line in calibration_lines(cost_file):
        print(line)
    if args.output:
        print(f"wrote {args.output} (load it with --dp-schedule-cost-model {args.output} in training, or "
              f"megatron-dpsched plan ... --cost-model {args.output})")
    return 0


def calibration_lines(cost_file: CostModelFile) -> list[str]:
    """The fitted coefficients and the fit report as text."""
    report = cost_file.fit
    r_squared = "undefined (every step took the same time)" if report["r_squared"] is None \
        else f"{report['r_squared']:.4f}"
    lines = [
        f"fitted on {report['n']} step records (steps {report['steps'][0]}-{report['steps'][-1]}, {report['n_rows']} "
        f"{report['rows']} rows, {report['time']} time, {report['lengths']} lengths, backward factor "
        f"{cost_file.step_time.backward_factor:g}"
        f"{', Huber' if report['robust'] else ''})",
        *(f"  {label:<29}: {getattr(cost_file.step_time, name):.4g}{_plus_minus(report, name)}" for name, label in (
            ("seconds_per_token", "seconds per token"), ("seconds_per_token_pair", "seconds per sum(length^2)"),
            ("seconds_per_microbatch", "seconds per micro-batch"))),
        f"  R^2                          : {r_squared}",
        f"  relative error, mean / max   : {report['mean_relative_error']:.1%} / {report['max_relative_error']:.1%}",
    ]
    for rank, errors in report["rank_relative_errors"].items():
        lines.append(f"  rank {rank:>4} error, mean / max : {errors['mean']:.1%} / {errors['max']:.1%}")
    return lines


def _plus_minus(report: dict, name: str) -> str:
    error = report.get("standard_errors", {}).get(name)
    return "" if error is None else f" +- {error:.2g}"


def _fail(message: object) -> int:
    text = " ".join(str(message).split())  # one line, whatever the error says
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``megatron-dpsched`` command."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a bad option (2, one line printed)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        run = {"plan": _run_plan, "check": _run_check, "calibrate": _run_calibrate}[args.command]
        return run(args)
    except (ValueError, ScheduleInvariantError) as error:
        return _fail(error)
    except OSError as error:
        if isinstance(error, BrokenPipeError):
            return _closed_pipe()
        return _fail(f"{error.filename or ''}: {error.strerror or error}" if error.filename else error)
    except KeyboardInterrupt:
        return 130


def _closed_pipe() -> int:
    """The reader went away (``| head``): stop quietly, also at the interpreter's final flush."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
