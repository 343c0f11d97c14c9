"""Benchmark the planner against the micro-batching users run today.

For each length distribution (the files shipped in the package, those of ``--lengths-dir`` where it
exists (see :mod:`bench_common`), plus a synthetic heavy tail), DP size and token cap, it
plans ``--steps`` steps of ``--samples-per-rank`` samples per rank with:

- ``dpsched``: :func:`megatron_dpsched.build_dp_schedule` (balance by tokens, or by
  FLOPs for the ``+flops`` rows; ``+growth`` lets it run up to 25% more micro-batches
  than a global packing when that balances ranks: ``balance_growth=0.25``);
- ``megatron_fixed``, ``per_rank_first_fit``, ``global_first_fit``: see
  :mod:`megatron_dpsched.baselines`.

and prints, per setting: micro-batches per rank summed over steps and their
ratio to the summed aligned lower bound, token fill, DP imbalance (busiest
rank / mean) and that imbalance over its own lower bound, and planning wall
time. It then reports the targets it misses; it exits 0 after reporting (``--check``: 1 on a miss)::

    .venv/bin/python scripts/bench_schedule.py    # full table (a few minutes on one core)
    .venv/bin/python scripts/bench_schedule.py --quick      # dp 8 and 64 only
    .venv/bin/python scripts/bench_schedule.py --markdown docs/bench_schedule.md   # also write the docs page
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench_common import DEFAULT_LENGTHS_DIR, length_files
from bench_planning_speed import SECTION

from megatron_dpsched import CostModel, DPSchedule, ScheduleConfig, build_dp_schedule
from megatron_dpsched.baselines import BASELINES, build_baseline_schedule
from megatron_dpsched.cli import read_lengths

DATASETS = ("alpaca_eval_outputs", "mt_bench_answers", "gsm8k_train")  # those found are used, in this order
LLAMA3_8B = CostModel(
    hidden_size=4096, num_layers=32, num_attention_heads=32, num_query_groups=8,
    ffn_hidden_size=14336, vocab_size=128256, swiglu=True,
)


@dataclass(frozen=True, kw_only=True)
class Row:
    """One method on one setting."""

    dataset: str
    dp: int
    cap: int
    method: str
    microbatches: int
    lower_bound: int
    fill: float
    imbalance: float
    relative_imbalance: float
    token_imbalance: float
    capacity_bound: float
    seconds: float
    per_step: tuple[int, ...]


def heavy_tail(count: int, rng: random.Random) -> list[int]:
    """Synthetic RL-rollout-like lengths: log-normal body (median 700) with a Pareto tail, max 32k."""
    out = []
    for _ in range(count):
        if rng.random() < 0.1:
            length = 2000 * rng.paretovariate(1.2)
        else:
            length = rng.lognormvariate(math.log(700), 0.9)
        out.append(max(16, min(32768, int(length))))
    return out


def load_pool(name: str, files: dict[str, Path]) -> list[int]:
    if name == "synthetic_heavy_tail":
        return heavy_tail(20000, random.Random(1234))
    return read_lengths(str(files[name]))


def measure(method: str, lengths: list[int], *, dataset: str, dp: int, cap: int, gbs: int) -> Row:
    cost_model = LLAMA3_8B if method.endswith("+flops") else None
    start = time.perf_counter()
    if method.startswith("dpsched"):
        schedule = build_dp_schedule(
            lengths, dp_size=dp, global_batch_size=gbs, max_tokens_per_gpu=cap,
            balance="cost" if cost_model else "tokens", cost_model=cost_model,
            balance_growth=0.25 if "growth" in method else 0.0,
        )
    else:
        config = ScheduleConfig(dp_size=dp, global_batch_size=gbs, max_tokens_per_gpu=cap)
        schedule = build_baseline_schedule(method, lengths, config=config)
    seconds = time.perf_counter() - start
    return summarize(schedule, method=method, dataset=dataset, seconds=seconds)


def summarize(schedule: DPSchedule, *, method: str, dataset: str, seconds: float) -> Row:
    stats = schedule.stats()
    return Row(
        dataset=dataset, dp=schedule.dp_size, cap=schedule.config.max_tokens_per_gpu, method=method,
        microbatches=sum(s.num_microbatches for s in stats),
        lower_bound=sum(s.lower_bound for s in stats),
        fill=sum(s.token_fill for s in stats) / len(stats),
        imbalance=max(s.imbalance for s in stats),
        relative_imbalance=max(s.relative_imbalance for s in stats),
        token_imbalance=max(s.token_imbalance for s in stats),
        capacity_bound=max(s.capacity_bound for s in stats),
        seconds=seconds,
        per_step=tuple(s.num_microbatches for s in stats),
    )


def run_setting(pool: list[int], *, dataset: str, dp: int, cap: int, args: argparse.Namespace) -> list[Row]:
    rng = random.Random(f"{dataset}-{dp}-{cap}")
    gbs = args.samples_per_rank * dp
    lengths = [rng.choice(pool) for _ in range(gbs * args.steps)]
    methods = ["dpsched", "dpsched+flops", "dpsched+growth", *BASELINES]
    return [measure(m, lengths, dataset=dataset, dp=dp, cap=cap, gbs=gbs) for m in methods]


def check_targets(rows: list[Row], samples_per_rank: int) -> list[str]:
    """The issue's targets, per setting; returns the misses."""
    misses = []
    by_setting: dict[tuple, dict[str, Row]] = {}
    for row in rows:
        by_setting.setdefault((row.dataset, row.dp, row.cap), {})[row.method] = row
    for key, methods in by_setting.items():
        for name in ("dpsched", "dpsched+flops", "dpsched+growth"):
            ours = methods[name]
            if samples_per_rank >= 16 and ours.relative_imbalance > 1.02:
                misses.append(f"{key} {name}: relative imbalance {ours.relative_imbalance:.4f} > 1.02 "
                              f"(no plan at these counts beats a token imbalance of {ours.capacity_bound:.3f}; "
                              f"this plan: {ours.token_imbalance:.3f})")
            if name.endswith("growth"):  # spends micro-batches on balance by design
                continue
            if ours.microbatches > 1.02 * ours.lower_bound:
                misses.append(f"{key} {name}: {ours.microbatches} micro-batches > 1.02 x {ours.lower_bound}")
            theirs = methods["global_first_fit"].per_step
            if any(a > b for a, b in zip(ours.per_step, theirs)):
                misses.append(f"{key} {name}: more micro-batches than global_first_fit in some step")
    return misses


def timing_check(pool: list[int], *, repeats: int = 3) -> float:
    """Best-of planning time for 65,536 samples on 512 ranks (one step), cap 16384."""
    rng = random.Random(7)
    lengths = [rng.choice(pool) for _ in range(65536)]
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        build_dp_schedule(lengths, dp_size=512, global_batch_size=65536, max_tokens_per_gpu=16384)
        best = min(best, time.perf_counter() - start)
    return best


def markdown(rows: list[Row]) -> str:
    lines = [
        "| lengths | dp | cap | method | micro-batches/rank (sum) | / lower bound | token fill | imbalance | "
        "imbalance / bound | token imbalance | capacity bound | plan time (s) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.dataset} | {r.dp} | {r.cap} | {r.method} | {r.microbatches} | "
            f"{r.microbatches / r.lower_bound:.3f} | {r.fill:.3f} | {r.imbalance:.3f} | "
            f"{r.relative_imbalance:.3f} | {r.token_imbalance:.3f} | {r.capacity_bound:.3f} | {r.seconds:.3f} |"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """One line per setting: micro-batches / lower bound and imbalance / its bound, for every method."""
    methods = list(dict.fromkeys(r.method for r in rows))
    lines = [
        "| lengths | dp | cap | " + " | ".join(methods) + " |",
        "|---|---:|---:|" + "---:|" * len(methods),
    ]
    by_setting: dict[tuple, dict[str, Row]] = {}
    for row in rows:
        by_setting.setdefault((row.dataset, row.dp, row.cap), {})[row.method] = row
    for (dataset, dp, cap), cells in by_setting.items():
        text = [f"{cells[m].microbatches / cells[m].lower_bound:.2f} / {cells[m].relative_imbalance:.3f}"
                for m in methods]
        lines.append(f"| {dataset} | {dp} | {cap} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths-dir", type=Path, default=DEFAULT_LENGTHS_DIR,
                        help="more length files (*.txt) besides the shipped ones (default: ../shared/data/lengths)")
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--caps", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--samples-per-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="dp 8 and 64 only")
    parser.add_argument("--markdown", type=Path, help="also write the full table here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed (default: exit 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, *, log: Callable[[str], None] = print) -> int:
    args = parse_args(argv)
    if args.quick:
        args.dp = [d for d in args.dp if d <= 64]
    files = length_files(args.lengths_dir)
    datasets = [d for d in DATASETS if d in files]
    log(f"length files: {', '.join(str(files[d]) for d in datasets)} and a synthetic heavy tail")
    rows: list[Row] = []
    for dataset in [*datasets, "synthetic_heavy_tail"]:
        pool = load_pool(dataset, files)
        for dp in args.dp:
            for cap in args.caps:
                rows.extend(run_setting(pool, dataset=dataset, dp=dp, cap=cap, args=args))
    table = markdown(rows)
    log(table)
    log("\nmicro-batches / aligned lower bound  /  imbalance / its lower bound (1.00 / 1.000 is ideal):\n")
    log(summary(rows))
    if args.markdown:  # the page's planning-speed section (bench_planning_speed.py's) stays
        old = args.markdown.read_text(encoding="utf-8") if args.markdown.exists() else ""
        speed = old[old.index(SECTION):] if SECTION in old else ""
        args.markdown.write_text(table + "\n\n" + summary(rows) + "\n" + ("\n" + speed if speed else ""),
                                 encoding="utf-8")
    seconds = timing_check(load_pool(datasets[0], files))
    timing = f"planning 65,536 samples on 512 ranks (cap 16384), best of 3: {seconds:.3f} s (target < 0.5 s)"
    log("\n" + timing)
    misses = check_targets(rows, args.samples_per_rank) + ([] if seconds < 0.5 else ["planning time >= 0.5 s"])
    log("targets: all met" if not misses else "targets missed:\n  " + "\n  ".join(misses))
    return 1 if misses and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
