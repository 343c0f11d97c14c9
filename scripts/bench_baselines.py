"""Simulated step time of this project's plan against the peer baselines.

For each length file found (``megatron_dpsched/data/*.txt`` and ``--lengths-dir``, by default
``../shared/data/lengths``), DP 8 and 64, token cap 4096 and 16384, PP 1 and PP 4 x VPP 2, it
draws ``--steps`` steps of ``--samples-per-rank`` samples per rank, plans them with every
baseline of :mod:`megatron_dpsched.baselines` and with ``build_dp_schedule(balance="cost")``
(the project), and replays every step with :func:`~megatron_dpsched.core.steptime.simulate_step`:
a :class:`StepTimeModel` from the cost model of a 7B dense GPT (Llama-2-7B shape) at
``--tflops`` plus ``--microbatch-overhead`` seconds per micro-batch. Per method it prints the
summed step time, its ratio to the project's (> 1: the project is faster), micro-batches per
rank per step, micro-batches over the cap, and the worst step (baseline / project step time;
< 1: the project loses that step). A baseline step with a micro-batch of several samples over the cap
(:func:`~megatron_dpsched.baselines.breaks_cap`; verl's plans can have one) is cap-breaking: it counts in the
summed step times and is reported apart (how many, and how many of those are faster than the project's),
never as a win: the worst step, the steps lost and ``--check`` look at the other steps::

    .venv/bin/python scripts/bench_baselines.py                      # report, exit 0
    .venv/bin/python scripts/bench_baselines.py --check              # exit 1 if the project is > 0.5% slower on a step
    .venv/bin/python scripts/bench_baselines.py --markdown out.md    # also write the tables as markdown
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_common import DEFAULT_LENGTHS_DIR, length_files  # noqa: E402

from megatron_dpsched import CostModel, DPSchedule, ScheduleConfig, build_dp_schedule  # noqa: E402
from megatron_dpsched.baselines import BASELINES, build_baseline_schedule, step_cap_violations  # noqa: E402
from megatron_dpsched.cli import read_lengths  # noqa: E402
from megatron_dpsched.core.cost import sample_costs  # noqa: E402
from megatron_dpsched.core.steptime import StepTimeModel, simulate_step  # noqa: E402

GPT_7B = CostModel(
    hidden_size=4096, num_layers=32, num_attention_heads=32, ffn_hidden_size=11008, vocab_size=32000, swiglu=True,
)
PROJECTS = ("dpsched", "dpsched+steptime")
"""The planner with ``balance="cost"``, and with the step-time objective (``step_time_model``)."""
DPS, CAPS, LAYOUTS = (8, 64), (4096, 16384), ((1, 1), (4, 2))
TOLERANCE = 0.005


@dataclass(frozen=True, kw_only=True)
class Row:
    """One method on one setting."""

    setting: tuple[str, int, int, str]
    method: str
    step_seconds: tuple[float, ...]
    microbatches: float
    step_violations: tuple[int, ...]
    """Micro-batches of several samples over the cap, per step (a project plan: none)."""

    @property
    def violations(self) -> int:
        return sum(self.step_violations)


def step_times(schedule: DPSchedule, model: StepTimeModel) -> tuple[float, ...]:
    """Simulated forward-backward seconds of every step (the slowest rank's makespan)."""
    lengths, layout = schedule.lengths, schedule.config.layout
    times = []
    for step in range(schedule.num_steps):
        ranks = [
            [model.forward_time([lengths[i] for i in mb]) for mb in schedule.rank_step_micro_batches(rank, step)]
            for rank in range(schedule.dp_size)
        ]
        times.append(simulate_step(ranks, layout=layout, model=model).seconds)
    return tuple(times)


def plans(lengths: list[int], *, config: ScheduleConfig, model: StepTimeModel) -> dict[str, DPSchedule]:
    """The project's plans and every baseline's, on the same steps and costs."""
    options = dict(
        dp_size=config.dp_size, global_batch_size=config.global_batch_size,
        max_tokens_per_gpu=config.max_tokens_per_gpu, pp_size=config.pp_size, vpp_size=config.vpp_size,
        balance="cost", cost_model=GPT_7B,
    )
    out = {PROJECTS[0]: build_dp_schedule(lengths, **options),
           PROJECTS[1]: build_dp_schedule(lengths, step_time_model=model, **options)}
    costs = sample_costs(lengths, GPT_7B)
    out.update({name: build_baseline_schedule(name, lengths, config=config, costs=costs) for name in BASELINES})
    return out


def run_setting(lengths: list[int], *, setting: tuple, config: ScheduleConfig, model: StepTimeModel) -> list[Row]:
    rows = []
    for method, schedule in plans(lengths, config=config, model=model).items():
        rows.append(Row(
            setting=setting, method=method, step_seconds=step_times(schedule, model),
            microbatches=sum(schedule.num_microbatches) / schedule.num_steps,
            step_violations=step_cap_violations(schedule),
        ))
    return rows


def run_all(files: dict[str, Path], args: argparse.Namespace) -> list[Row]:
    model = StepTimeModel.from_cost_model(
        GPT_7B, flops_per_second=args.tflops * 1e12, seconds_per_microbatch=args.microbatch_overhead,
    )
    rows: list[Row] = []
    for name, path in files.items():
        pool = read_lengths(str(path))
        for dp in args.dp:
            for cap in CAPS:
                rng = random.Random(f"{name}-{dp}-{cap}")
                gbs = args.samples_per_rank * dp
                lengths = [rng.choice(pool) for _ in range(gbs * args.steps)]
                for pp, vpp in LAYOUTS:
                    config = ScheduleConfig(dp_size=dp, global_batch_size=gbs, max_tokens_per_gpu=cap,
                                            pp_size=pp, vpp_size=vpp)
                    setting = (name, dp, cap, f"pp{pp}" + (f"xvpp{vpp}" if vpp > 1 else ""))
                    rows += run_setting(lengths, setting=setting, config=config, model=model)
                    print(f"  planned {setting}", file=sys.stderr, flush=True)
    return rows


def worst_step(row: Row, project: Row) -> float:
    """The smallest baseline / project step time over the steps where the baseline keeps the cap (< 1: the
    project loses that step; ``inf`` when every step breaks it)."""
    return min((theirs / ours for theirs, ours, over in zip(row.step_seconds, project.step_seconds,
                                                            row.step_violations, strict=True) if not over),
               default=math.inf)


def cap_breaking_wins(rows: list[Row], reference: str, tolerance: float = TOLERANCE) -> tuple[int, int]:
    """Baseline steps that break the cap, and how many of those run more than ``tolerance`` faster than
    ``reference``'s (reported, never counted as wins)."""
    projects = {row.setting: row for row in rows if row.method == reference}
    steps = [(theirs, ours) for row in rows if row.method not in PROJECTS
             for theirs, ours, over in zip(row.step_seconds, projects[row.setting].step_seconds, row.step_violations,
                                           strict=True) if over]
    return len(steps), sum(1 for theirs, ours in steps if ours > theirs * (1 + tolerance))


def fmt(ratio: float) -> str:
    """A ratio with three decimals, ``-`` for none (every step broke the cap)."""
    return "-" if math.isinf(ratio) else f"{ratio:.3f}"


def table(rows: list[Row], reference: str) -> list[str]:
    """Markdown lines: one row per method and setting, ratios to the ``reference`` plan."""
    lines = [
        f"| lengths | dp | cap | layout | method | step time sum (s) | / {reference} | micro-batches/rank/step | "
        f"over cap | worst capped step (method / {reference}) |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    projects = {row.setting: row for row in rows if row.method == reference}
    for row in rows:
        ours = projects[row.setting]
        total, base = sum(row.step_seconds), sum(ours.step_seconds)
        name, dp, cap, layout = row.setting
        lines.append(
            f"| {name} | {dp} | {cap} | {layout} | {row.method} | {total:.3f} | {total / base:.3f} | "
            f"{row.microbatches:.2f} | {row.violations} | {fmt(worst_step(row, ours))} |"
        )
    return lines


def losses(rows: list[Row], reference: str, tolerance: float = TOLERANCE) -> list[str]:
    """Every (setting, baseline) where ``reference`` is slower on some step by more than ``tolerance``."""
    projects = {row.setting: row for row in rows if row.method == reference}
    out = []
    for row in rows:
        if row.method in PROJECTS:
            continue
        worst = worst_step(row, projects[row.setting])
        if worst < 1 / (1 + tolerance):
            out.append(f"{row.setting} {row.method}: {reference} step {1 / worst:.4f}x the baseline's")
    return out


def summary(rows: list[Row]) -> str:
    """Per layout and baseline: its summed step time over each project plan's (min / median / max over the
    settings) and its worst step within the cap; above 1 the project is faster."""
    lines = ["| layout | baseline | / dpsched: total min / median / max | worst capped step | "
             "/ dpsched+steptime: total min / median / max | worst capped step | over cap |",
             "|---|---|---|---:|---|---:|---:|"]
    projects = {(row.setting, row.method): row for row in rows if row.method in PROJECTS}
    for layout in dict.fromkeys(row.setting[3] for row in rows):
        for method in dict.fromkeys(row.method for row in rows if row.method not in PROJECTS):
            mine = [row for row in rows if row.method == method and row.setting[3] == layout]
            cells = []
            for project in PROJECTS:
                pairs = [(row, projects[row.setting, project]) for row in mine]
                totals = sorted(sum(r.step_seconds) / sum(p.step_seconds) for r, p in pairs)
                worst = min(worst_step(r, p) for r, p in pairs)
                cells += [f"{totals[0]:.3f} / {totals[len(totals) // 2]:.3f} / {totals[-1]:.3f}", fmt(worst)]
            lines.append(f"| {layout} | {method} | " + " | ".join(cells) + f" | {sum(r.violations for r in mine)} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths-dir", type=Path, default=DEFAULT_LENGTHS_DIR)
    parser.add_argument("--samples-per-rank", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dp", type=int, nargs="+", default=list(DPS))
    parser.add_argument("--tflops", type=float, default=400.0, help="achieved TFLOP/s per GPU (default 400)")
    parser.add_argument("--microbatch-overhead", type=float, default=0.002,
                        help="fixed forward seconds per micro-batch (default 0.002)")
    parser.add_argument("--reference", choices=PROJECTS, default=PROJECTS[0],
                        help="the project plan the ratios, the loss list and --check compare with")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if the reference plan is > {TOLERANCE * 100:.1f}%% slower than a baseline "
                             "on any step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = length_files(args.lengths_dir)
    print("length files: " + (", ".join(f"{name} ({path})" for name, path in files.items()) or "none found"))
    if not files:
        return 1
    rows = run_all(files, args)
    lines = table(rows, args.reference)
    print("\n".join(lines))
    for reference in PROJECTS:
        missed = losses(rows, reference)
        print(f"\n{reference} > {TOLERANCE:.1%} slower than a baseline on some step: {len(missed)} of "
              f"{sum(1 for r in rows if r.method not in PROJECTS)} (setting, baseline) pairs")
        for line in missed:
            print(f"  {line}")
        breaking, faster = cap_breaking_wins(rows, reference)
        print(f"cap-breaking baseline steps (never counted as wins): {breaking}, of which {faster} faster than "
              f"{reference} by > {TOLERANCE:.1%}")
    missed = losses(rows, args.reference)
    text = summary(rows)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n\n" + text + "\n", encoding="utf-8")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
