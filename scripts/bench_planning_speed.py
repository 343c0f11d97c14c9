"""Time the default planner on 1,000,000 samples, one length distribution per case.

Each case runs in its own Python process (``--case NAME``), so its figures are its own: the wall time of
:func:`megatron_dpsched.build_dp_schedule` (lengths generated and modules imported beforehand), its CPU time
(``time.process_time``: what the targets are checked on, as the wall time of a shared machine depends on its
load), the process's peak resident memory (``ru_maxrss``, interpreter and lengths included) and what planning
added to it. Cases
(cap 8192, DP 1,024, one step, PP 1, unless named):

- ``short``: MT-Bench answer lengths (shipped), the case the earlier planning figures measured;
- ``uniform``: every length in 1-8191 equally likely; ``near_cap``: 4096-8192; ``past_cap``: uniform with 1%
  of the samples 2-8 times the cap; ``padded_rows``: uniform with ``padded_rows`` (``pad_multiple=8``);
  ``balance_none``: uniform with ``balance="none"``;
- ``pp4_vpp2``: uniform at PP 4 x VPP 2 with a step-time model (step 7), one step on DP 1,024;
- ``pp4_vpp2_steps``: uniform at PP 4 x VPP 2 with the step-time model on DP 512, 512 samples a step
  (1,954 steps); ``steps``: uniform at PP 1 on DP 1,024, 8,192 samples a step (123 steps).

It prints one row per case and checks the targets (<= 1.5 s at PP 1, <= 3 s with the step-time model,
<= 300 MiB peak); it exits 0 after reporting (``--check``: 1 on a miss)::

    .venv/bin/python scripts/bench_planning_speed.py                     # every case (a few minutes on 2 shared cores)
    .venv/bin/python scripts/bench_planning_speed.py --cases uniform --samples 100000
    .venv/bin/python scripts/bench_planning_speed.py --markdown docs/bench_schedule.md   # also the docs section
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import SHIPPED

CAP = 8192
CASES = ("short", "uniform", "near_cap", "past_cap", "padded_rows", "balance_none", "steps", "pp4_vpp2",
         "pp4_vpp2_steps")
SECONDS_PP1, SECONDS_STEP_TIME, MEBIBYTES = 1.5, 3.0, 300.0
SECTION = "## Planning speed"
"""The heading of this script's section of the docs page (everything from it on is replaced)."""


def lengths_of(case: str, count: int, rng: random.Random) -> list[int]:
    """The case's ``count`` lengths."""
    if case == "short":
        pool = [int(word) for word in (SHIPPED / "mt_bench_answers.txt").read_text().split()]
        return [rng.choice(pool) for _ in range(count)]
    if case == "near_cap":
        return [rng.randint(CAP // 2, CAP) for _ in range(count)]
    lengths = [rng.randint(1, CAP - 1) for _ in range(count)]
    if case == "past_cap":
        for index in rng.sample(range(count), count // 100):
            lengths[index] = rng.randint(2 * CAP, 8 * CAP)
    return lengths


def keywords(case: str, count: int) -> dict[str, Any]:
    """The case's :func:`build_dp_schedule` arguments besides the lengths."""
    from megatron_dpsched.core import StepTimeModel

    dp, per_step = 1024, count
    extra: dict[str, Any] = {}
    if case == "padded_rows":
        extra = {"padded_rows": True, "pad_multiple": 8}
    elif case == "balance_none":
        extra = {"balance": "none"}
    elif case == "steps":
        per_step = 8192
    elif case.startswith("pp4_vpp2"):
        flops = 1e12  # a GPT of width 4096 at 1 TFLOP/s; the fixed cost of a micro-batch: 2,048 tokens' worth
        extra = {"pp_size": 4, "vpp_size": 2, "step_time_model": StepTimeModel(
            seconds_per_token=24576 / flops, seconds_per_token_pair=1 / flops,
            seconds_per_microbatch=(24576 * 2048 + 2048**2) / flops)}
        if case == "pp4_vpp2_steps":
            dp = per_step = 512
    return {"dp_size": dp, "global_batch_size": per_step, "max_tokens_per_gpu": CAP, **extra}


def run_case(case: str, count: int) -> dict[str, Any]:
    """Plan one case in this process; its figures."""
    from megatron_dpsched import build_dp_schedule

    lengths = lengths_of(case, count, random.Random(f"speed-{case}"))
    kwargs = keywords(case, count)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start, cpu_start = time.perf_counter(), time.process_time()
    schedule = build_dp_schedule(lengths, **kwargs)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": case, "samples": count, "dp": kwargs["dp_size"], "steps": len(schedule.num_microbatches),
            "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mib": peak, "added_mib": peak - before,
            "step_time": "step_time_model" in kwargs}


def measure(case: str, count: int) -> dict[str, Any]:
    """Run one case in a fresh interpreter."""
    done = subprocess.run([sys.executable, __file__, "--case", case, "--samples", str(count)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | samples | dp | steps | plan time (s) | CPU time (s) | target (s) | peak RSS (MiB) | "
             "added by planning (MiB) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['samples']:,} | {r['dp']} | {r['steps']:,} | {r['seconds']:.2f} | "
                     f"{r['cpu_seconds']:.2f} | {target(r):.1f} | {r['peak_mib']:.0f} | {r['added_mib']:.0f} |")
    return "\n".join(lines)


def target(row: dict[str, Any]) -> float:
    return SECONDS_STEP_TIME if row["step_time"] else SECONDS_PP1


def misses(rows: list[dict[str, Any]]) -> list[str]:
    out = [f"{r['case']}: {r['cpu_seconds']:.2f} s > {target(r)} s" for r in rows if r["cpu_seconds"] > target(r)]
    return out + [f"{r['case']}: {r['peak_mib']:.0f} MiB > {MEBIBYTES:.0f} MiB" for r in rows
                  if r["peak_mib"] > MEBIBYTES]


def write_section(path: Path, text: str) -> None:
    """Replace (or add) this script's section at the end of ``path``."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    head = old.split(SECTION)[0].rstrip()
    path.write_text((head + "\n\n" if head else "") + text + "\n", encoding="utf-8")


def section(rows: list[dict[str, Any]], command: str) -> str:
    return (f"{SECTION}\n\nThe default planner on {rows[0]['samples']:,} samples per length distribution, each case in "
            f"its own "
            f"process (cases: the docstring of `scripts/bench_planning_speed.py`). Measured on 2 CPU cores shared "
            f"with other jobs: the wall time depends on their load, so the targets ({SECONDS_PP1} s at PP 1, "
            f"{SECONDS_STEP_TIME} s with the step-time model, {MEBIBYTES:.0f} MiB) are checked on CPU time. The same "
            f"command with `PYTHONPATH` at another checkout times that checkout's planner.\n\n```\n$ {command}\n```"
            f"\n\n{table(rows)}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process
    parser.add_argument("--markdown", type=Path, help="also write the table as this page's last section")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed (default: exit 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, *, log: Callable[[str], None] = print) -> int:
    args = parse_args(argv)
    if args.case:
        log(json.dumps(run_case(args.case, args.samples)))
        return 0
    rows = []
    for case in args.cases:
        rows.append(measure(case, args.samples))
        log(table(rows[-1:]).splitlines()[-1])
    log(table(rows))
    if args.markdown:
        write_section(args.markdown, section(rows, "python scripts/bench_planning_speed.py "
                                                   f"--markdown {args.markdown}"))
    found = misses(rows)
    log("targets: all met" if not found else "targets missed:\n  " + "\n  ".join(found))
    return 1 if found and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
