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
import gc
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from megatron_dpsched.baselines.megatron_schedulers import StepPlan, dp_balanced_step_plan, hybrid_cp_step_plan
from megatron_dpsched.core import DPSchedule, ScheduleConfig, ScheduleInvariantError, StepTimeModel
from megatron_dpsched.core.cost import CostModelFile
from megatron_dpsched.core.padding import pad_multiple_for
from megatron_dpsched.core.validation import MAX_TOKENS, ArgumentError
from megatron_dpsched.options import (
    BY_NAME,
    GIVEN,
    NOMINAL_FLOPS_PER_GPU,
    PLAN_PREFIX,
    Setting,
    add_options,
    add_plan_options,
    check_setting,
    config_flags,
    plan_options,
    resolve_collate_format,
)
from megatron_dpsched.whatif.analysis import (
    BASELINE_NAMES,
    OURS,
    PARALLEL_SAMPLES,
    PlanWarning,
    Simulation,
    StepComparison,
    StrategyRows,
    WhatIf,
    baseline_micro_batch_size,
    check_baseline_micro_batch_size,
    plan_baselines,
    plan_megatron_schedulers,
    plan_ours,
    plan_warnings,
    step_comparisons,
    strategy_rows,
)
from megatron_dpsched.whatif.inputs import load_sample_lengths, read_lengths
from megatron_dpsched.whatif.model import simulation_from_flags
from megatron_dpsched.whatif.progress import Progress
from megatron_dpsched.whatif.report import header_lines, report_json, table_lines
from megatron_dpsched.whatif.sweep import parse_caps, run_sweep

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
    """Errors as one line, ``megatron-dpsched: error: ...``, exit status 2; no abbreviated flags (a renamed
    flag's old name, e.g. ``--microbatch-overhead`` in seconds, must not pass as a prefix of another)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


MAX_PARALLEL = 2**20
"""The largest parallel size (``--dp-size``, ``--pp-size``, ``--cp-size`` ...) the what-if tool takes: more
ranks in one dimension than any cluster has."""


def _number(kind: Callable[[str], float], *, minimum: float, strict: bool,
            maximum: float = math.inf) -> Callable[[str], float]:
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
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:.0f}, got {text!r}")
        return value
    parse.__name__ = kind.__name__
    return parse


POSITIVE = _number(int, minimum=1, strict=False)
PARALLEL = _number(int, minimum=1, strict=False, maximum=MAX_PARALLEL)
GREATER_THAN_ZERO = _number(float, minimum=0.0, strict=True)


def _caps(text: str) -> tuple[int, ...]:
    """``--max-tokens-per-gpu``: one cap, or several separated by commas (a sweep); each in the option's range."""
    option = BY_NAME["max_tokens_per_gpu"]
    if "," not in text:
        return (option.parse(text),)
    try:
        return tuple(option.parse(str(cap)) for cap in parse_caps(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_layout(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("layout")
    group.add_argument("--dp-size", type=PARALLEL, required=True, help="data-parallel ranks")
    group.add_argument("--global-batch-size", type=POSITIVE, required=True, help="samples per optimizer step")
    batching = group.add_mutually_exclusive_group(required=True)
    (caps,) = add_options(batching, prefix=PLAN_PREFIX, options=[BY_NAME["max_tokens_per_gpu"]],
                          unset_defaults=False)
    caps.type = _caps  # the option's; several caps, comma-separated, compare them (a sweep)
    caps.help += " Several caps (4096,8192,16384) compare the caps and recommend one."
    batching.add_argument("--micro-batch-size", type=POSITIVE,
                          help="static batching: samples per micro-batch (no baselines to compare with)")
    group.add_argument("--baseline-micro-batch-size", type=POSITIVE, metavar="N",
                       help="Megatron fixed's micro-batch size, which every speedup over it is measured against "
                            "(default: the largest Megatron accepts whose padded micro-batch of the longest "
                            "sample fits the cap and that leaves each rank at least --pp-size micro-batches per "
                            "step)")
    group.add_argument("--pp-size", type=PARALLEL, default=1, help="pipeline-parallel stages (default 1)")
    group.add_argument("--vpp-size", type=PARALLEL, default=1,
                       help="virtual pipeline stages (model chunks) per pipeline rank; > 1: interleaved schedule")
    group.add_argument("--microbatch-group-size-per-vp-stage", "--microbatch-group-size-per-virtual-pipeline-stage",
                       dest="group_size", type=PARALLEL, metavar="G",
                       help="interleaved schedule's group size (default: --pp-size, as in Megatron)")
    group.add_argument("--cp-size", type=PARALLEL, default=1,
                       help="context-parallel ranks sharing each micro-batch (default 1)")
    group.add_argument("--tp-size", type=PARALLEL, default=1,
                       help="tensor-parallel ranks: split every micro-batch's FLOPs in the step-time simulation")


def _add_planning(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group(
        "planning", "dp-schedule's options: training's --dp-schedule-<name> options, with the same defaults and "
                    "values (docs/options.md); Megatron fixed's micro-batches are always padded rows")
    add_plan_options(group, skip=("max_tokens_per_gpu",))
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


def _add_simulation(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group("step-time simulation")
    group.add_argument("--flops-per-gpu", type=GREATER_THAN_ZERO, metavar="FLOPS",
                       help=f"FLOP/s one GPU achieves on this model (default {NOMINAL_FLOPS_PER_GPU:g}, the figure "
                            "training's step-time objective assumes)")


def _add_megatron_schedulers(plan: argparse.ArgumentParser) -> None:
    group = plan.add_argument_group(
        "Megatron's own schedulers", "also compare with Megatron's schedulers, run from their own code (needs torch "
        "and --max-tokens-per-gpu)")
    group.add_argument("--megatron-lm-src", metavar="DIR",
                       help="a Megatron-LM checkout: compare with its DpBalancedScheduler "
                            "(megatron/core/datasets/data_schedule.py)")
    group.add_argument("--megatron-hybrid-cp", action="store_true",
                       help="compare with hybrid context parallel's BalancedCPScheduler from the installed "
                            "megatron-core (PP 1 only, as Megatron requires)")


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
    group.add_argument("--jobs", type=POSITIVE, default=min(8, os.cpu_count() or 1), metavar="N",
                       help=f"processes that plan steps at once from {PARALLEL_SAMPLES:,} samples on (the same "
                            "plan, sooner; default: this machine's cores, at most 8)")


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
    for add in (_add_layout, _add_planning, _add_model, _add_simulation, _add_megatron_schedulers, _add_output):
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
    calibrate.add_argument("--accept-poor-fit", action="store_true",
                           help="write a fit whose R^2 <= 0 or whose standard errors exceed their coefficients, "
                                "with a warning (refused by default)")


_LAYOUT_FLAGS = {"dp_size": "--dp-size", "global_batch_size": "--global-batch-size",
                 "micro_batch_size": "--micro-batch-size", "cp_size": "--cp-size", "pp_size": "--pp-size",
                 "vpp_size": "--vpp-size", "microbatch_group_size_per_vp_stage": "--microbatch-group-size-per-vp-stage"}
"""Planner arguments set by the layout flags."""
ARGUMENT_FLAGS = {**config_flags(prefix=PLAN_PREFIX), **_LAYOUT_FLAGS}
"""Planner argument (``ArgumentError.argument``) -> the flag of this tool that sets it: a mirrored option
(``--<stem>``, from the option fields' metadata) or a layout flag."""


def _flag_error(error: ArgumentError) -> ValueError:
    """The planner's error about one of its arguments, headed by the flag that set it."""
    flag = ARGUMENT_FLAGS.get(error.argument)
    return ValueError(f"{flag}: {error}" if flag else str(error))


def _check_options(args: argparse.Namespace) -> None:
    """Refuse a given option that would not act (training's rule, :func:`~megatron_dpsched.options.check_setting`;
    the step-time options always act here, the tool times every step) and a token cap ``--max-tokens-per-gpu x
    --cp-size`` over :data:`~megatron_dpsched.core.validation.MAX_TOKENS`."""
    check_setting(Setting(options=plan_options(args), given=getattr(args, GIVEN, frozenset()), pp_size=args.pp_size,
                          prefix=PLAN_PREFIX, pp_flag="--pp-size", times_every_step=True))
    if args.max_tokens_per_gpu is not None and args.max_tokens_per_gpu * args.cp_size > MAX_TOKENS:
        raise ValueError(f"--cp-size {args.cp_size}: the token cap --max-tokens-per-gpu x --cp-size = "
                         f"{args.max_tokens_per_gpu * args.cp_size} is over {MAX_TOKENS}")


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on the run, resolved by training's rules (:mod:`megatron_dpsched.options`)."""
    args.collate_format = resolve_collate_format(args.collate_format)
    args.objective = plan_options(args).resolve_objective(pp_size=args.pp_size, has_model=True)
    return args


def _timing(args: argparse.Namespace, simulation: Simulation) -> StepTimeModel:
    """The simulation's step-time model; figures out of range name ``--flops-per-gpu`` (``--microbatch-overhead-ms``
    is range-checked when parsed, a cost-model file when read)."""
    try:
        return simulation.timing(cp_size=args.cp_size)
    except ValueError as error:
        raise ValueError(f"--flops-per-gpu {simulation.flops_per_gpu or 0:g}: {error}") from None


def _step_time_model(args: argparse.Namespace, timing: StepTimeModel) -> StepTimeModel | None:
    """The simulation's step-time model when dp-schedule plans for the step time (``--objective``, resolved by
    training's rule), as training builds it."""
    return None if args.objective == "micro-batches" else timing


def _check_finite(steps: Sequence[StepComparison], args: argparse.Namespace) -> None:
    """Refuse simulated step times that would print as ``inf`` or make speedups ``nan`` (0 s), naming the flag
    whose figure put them there."""
    times = [row.seconds for step in steps for row in step.strategies.values()]
    totals = [sum(step.strategies[name].seconds for step in steps) for name in steps[0].strategies] if steps else []
    bad = [seconds for seconds in (*times, *totals) if not (math.isfinite(seconds) and seconds > 0)]
    if bad:
        raise ValueError(f"{_timing_flag(args)}: a simulated step takes {bad[0]:g} seconds with these figures "
                         "(the model, --microbatch-overhead-ms); give figures that time every step in a finite, "
                         "positive number of seconds")


def _timing_flag(args: argparse.Namespace) -> str:
    """The flag whose figure sets the simulated times: ``--cost-model FILE`` or ``--flops-per-gpu F``."""
    if args.cost_model:
        return f"--cost-model {args.cost_model}"
    return f"--flops-per-gpu {args.flops_per_gpu or NOMINAL_FLOPS_PER_GPU:g}"


def _planned_sizes(args: argparse.Namespace) -> dict[str, object]:
    """What the cap bounds, as in training (``--cap-counts``): each sample rounded up to the layout's multiple,
    and with ``bshd`` rows x the longest row."""
    return plan_options(args).planned_padding(pad_multiple=_pad_multiple(args), collate_format=args.collate_format)


def _pad_multiple(args: argparse.Namespace) -> int:
    """The layout's sequence multiple (Megatron's rule; the what-if tool has no sequence-parallel flag)."""
    return pad_multiple_for(tensor_parallel_size=args.tp_size, context_parallel_size=args.cp_size,
                            sequence_parallel=False)


def _config(args: argparse.Namespace, *, step_time_model: StepTimeModel | None = None) -> ScheduleConfig:
    try:
        config = ScheduleConfig(
            dp_size=args.dp_size, global_batch_size=args.global_batch_size,
            max_tokens_per_gpu=args.max_tokens_per_gpu, micro_batch_size=args.micro_batch_size,
            cp_size=args.cp_size, pp_size=args.pp_size, vpp_size=args.vpp_size,
            microbatch_group_size_per_vp_stage=args.group_size, balance=args.balance,
            drop_last=args.drop_last, balance_growth=args.balance_growth, step_time_model=step_time_model,
            microbatch_order=args.microbatch_order, **_planned_sizes(args),
        )
    except ArgumentError as error:
        raise _flag_error(error) from None
    if args.global_batch_size > args.dp_size and args.global_batch_size % args.dp_size:  # smaller: the planner says
        raise ValueError(f"--global-batch-size {args.global_batch_size} must be a multiple of --dp-size "
                         f"{args.dp_size}: Megatron refuses any other global batch")
    return config


def _check_baseline(args: argparse.Namespace, config: ScheduleConfig) -> None:
    """``--baseline-micro-batch-size``: with a token cap (the baselines' batching), a size Megatron accepts."""
    size = args.baseline_micro_batch_size
    if size is None:
        return
    if args.micro_batch_size is not None:
        raise ValueError(f"--baseline-micro-batch-size {size} sizes Megatron fixed, which static batching "
                         "(--micro-batch-size) does not compare with; give --max-tokens-per-gpu instead")
    check_baseline_micro_batch_size(size, config=config)


def _megatron_scheduler_plans(args: argparse.Namespace) -> dict[str, StepPlan]:
    """The step plans of the Megatron schedulers asked for, loaded from their code (a one-line error if not)."""
    asked = {"--megatron-lm-src": args.megatron_lm_src, "--megatron-hybrid-cp": args.megatron_hybrid_cp}
    if any(asked.values()) and not args.max_tokens_per_gpu:
        flags = ", ".join(flag for flag, value in asked.items() if value)
        raise ValueError(f"{flags} needs --max-tokens-per-gpu: Megatron's schedulers pack under a token cap")
    plans = {}
    if args.megatron_lm_src:
        plans["megatron_dp_balanced"] = dp_balanced_step_plan(args.megatron_lm_src)
    if args.megatron_hybrid_cp:
        plans["megatron_hybrid_cp"] = hybrid_cp_step_plan()
    return plans


@dataclasses.dataclass(kw_only=True)
class _Baselines:
    """The baselines' plans and simulated figures, made while dp-schedule's plan is made (``plan_ours``'s
    ``meanwhile``, with several processes) or after it. An error is kept until dp-schedule's plan (``planned``) or
    its figures (``simulated``) are made, so that errors come in the order of a one-process run."""

    config: ScheduleConfig
    """dp-schedule's config, which the baselines plan with."""
    simulation: Simulation
    """How every strategy is timed."""
    micro_batch_size: int | None
    """Megatron fixed's micro-batch size (``None``: no token cap, no baselines)."""
    shown: bool
    """Whether the progress bar is drawn."""
    schedules: dict[str, DPSchedule] | None = None
    """The baselines' plans, once made."""
    rows: StrategyRows | None = None
    """The baselines' figures in every step, once simulated."""
    error: tuple[str, ValueError] | None = None
    """``("plan" | "simulate", error)``: the error kept until dp-schedule's plan or figures are made."""

    def __call__(self, lengths: tuple[int, ...], costs: tuple[float, ...]) -> None:
        """Plan and simulate every baseline, keeping an error."""
        self.plan(lengths, costs)
        if self.error is None:
            try:
                self.rows = strategy_rows(self.schedules, simulation=self.simulation)
            except ValueError as error:
                self.error = ("simulate", error)

    def plan(self, lengths: tuple[int, ...], costs: tuple[float, ...]) -> None:
        """Every baseline's plan of the samples (costs: dp-schedule's), keeping an error."""
        try:
            with Progress("baselines", len(BASELINE_NAMES) if self.config.token_cap else 0,
                          enabled=self.shown) as bar:
                self.schedules = plan_baselines(lengths, costs=costs, config=self.config,
                                                micro_batch_size=self.micro_batch_size, tick=bar.update)
        except ValueError as error:
            self.error = ("plan", error)

    def planned(self, ours: DPSchedule) -> dict[str, DPSchedule]:
        """The baselines' plans (planned now if not yet), or the planning error raised."""
        if self.schedules is None and self.error is None:
            self.plan(ours.lengths, ours.costs)
        if self.error is not None and self.error[0] == "plan":
            raise self.error[1]
        assert self.schedules is not None, "planned or raised"
        return self.schedules

    def simulated(self, *, tick: Callable[[int], None]) -> StrategyRows:
        """The baselines' figures (simulated now if not yet), or the simulation's error raised."""
        if self.error is not None:
            raise self.error[1]
        assert self.schedules is not None, "planned first"
        if self.rows is None:
            self.rows = strategy_rows(self.schedules, simulation=self.simulation, tick=tick)
        else:
            tick(len(self.rows))
        return self.rows


def _what_if(args: argparse.Namespace) -> tuple[WhatIf, str, str]:
    _check_options(args)
    megatron_plans = _megatron_scheduler_plans(args)
    lengths, kind = load_sample_lengths(args.input)
    args = _resolve(args)
    simulation, model_source = simulation_from_flags(args)
    config = _config(args, step_time_model=_step_time_model(args, _timing(args, simulation)))
    _check_baseline(args, config)
    fixed_size = None if config.token_cap is None else (
        args.baseline_micro_batch_size or baseline_micro_batch_size(lengths, config=config))
    shown = args.progress or sys.stderr.isatty()
    baselines = _Baselines(config=config, simulation=simulation, micro_batch_size=fixed_size, shown=shown)
    jobs = args.jobs if len(lengths) >= PARALLEL_SAMPLES else 1
    gbs = config.global_batch_size
    steps = len(lengths) // gbs if config.drop_last else -(-len(lengths) // gbs)
    try:
        with Progress("planning", steps, enabled=shown) as bar:
            ours = plan_ours(lengths, config=config, cost_model=simulation.cost_model,
                             tick=bar.update if shown else None, jobs=jobs,
                             meanwhile=baselines if jobs > 1 else None)  # the baselines beside the workers
        schedules = {OURS: ours, **baselines.planned(ours)}
        megatron, refusals = plan_megatron_schedulers(ours, megatron_plans)
        schedules.update(megatron)
    except ArgumentError as error:
        raise _flag_error(error) from None
    try:
        with Progress("simulating", len(schedules), enabled=shown) as bar:
            rows = strategy_rows({OURS: ours}, simulation=simulation, tick=bar.update)
            rows.update(baselines.simulated(tick=bar.update))
            rows.update(strategy_rows(megatron, simulation=simulation, tick=bar.update))
    except ValueError as error:  # times out of range: a forward time of inf
        raise ValueError(f"{_timing_flag(args)}: {error}") from None
    compared = step_comparisons(ours, rows)
    _check_finite(compared, args)
    report = WhatIf(config=config, simulation=simulation, schedules=schedules, steps=compared,
                    warnings=(*plan_warnings(schedules[OURS]), *refusals),
                    fixed_micro_batch_size=fixed_size,
                    fixed_size_given=args.baseline_micro_batch_size is not None)
    return report, f"{args.input} ({kind})", model_source


def _warn(warnings: Sequence[PlanWarning]) -> None:
    for warning in warnings:
        print(f"{PROG}: warning: {warning.message}", file=sys.stderr)


def _run_plan(args: argparse.Namespace) -> int:
    """The what-if report (or a cap sweep's) with the cyclic garbage collector off: a plan of millions of samples
    is millions of small lists and tuples in no cycle, which every collection walks again to free nothing (the
    planner pauses it too); restored after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _plan_and_report(args)
    finally:
        if enabled:
            gc.enable()


def _plan_and_report(args: argparse.Namespace) -> int:
    caps = args.max_tokens_per_gpu or (None,)
    if len(caps) > 1 and (args.megatron_lm_src or args.megatron_hybrid_cp):
        raise ValueError("Megatron's schedulers (--megatron-lm-src, --megatron-hybrid-cp) are compared at one cap: "
                         "give --max-tokens-per-gpu one cap, not a sweep")
    if len(caps) > 1:
        return run_sweep(args, caps=caps, what_if=_what_if, warn=_warn)
    args.max_tokens_per_gpu = caps[0]
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
    from megatron_dpsched.calibration import fit, fit_problems, load_records, samples_from_records

    records, places = load_records(args.stats)
    samples = samples_from_records(records, warmup_steps=args.warmup_steps, lengths=args.lengths, time=args.time,
                                   places=places)
    result = fit(samples, backward_factor=args.backward_factor, robust=args.robust)
    problems = fit_problems(result.report)
    if problems and not args.accept_poor_fit:
        raise ValueError(f"{args.stats}: the fit is too poor to write: {'; '.join(problems)}. The step times are "
                         "mostly noise to this model (other work on the machine, too few or too similar steps): "
                         "record a longer, quieter run, or pass --accept-poor-fit to write it anyway")
    for problem in problems:
        print(f"{PROG}: warning: poor fit, written as --accept-poor-fit asks: {problem}", file=sys.stderr)
    report = {**result.report, "lengths": args.lengths, "time": args.time, "warmup_steps": args.warmup_steps,
              "poor_fit": problems}
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
