"""How long ``megatron-dpsched plan`` takes to plan and report a large input (the what-if tool's speed).

Per input size and layout: a length file of that many samples (seeded log-normal lengths, median e^6.5 = 665
tokens, clipped to 1-32000: a long tail, some samples past the cap), then ``megatron-dpsched plan FILE ...``
run as a user runs it (a fresh process, the table printed to a pipe that is discarded). Printed per run: the
wall time, the CPU time (user + sys of that process: what the run costs on a shared machine) and the target
of the size (1,000,000 samples in 10 s, 5,000,000 in 60 s, wall time: on a shared machine, compare the CPU
time), once per ``--jobs`` value (planning processes). ``--phases`` also times, in this process, the parts of a
``--jobs 1`` run (reading the input, dp-schedule's planner, the baselines, the simulated comparison, the
report) in CPU seconds::

    .venv/bin/python scripts/bench_whatif_speed.py                          # 1M and 5M samples, both layouts
    .venv/bin/python scripts/bench_whatif_speed.py --sizes 1000000 --layouts pp4 --phases

Layouts: ``pp4`` (DP 64, global batch 1024, PP 4, cap 16384: many steps) and ``dp1024`` (DP 1024, global
batch 262144, PP 1, cap 8192: few, large steps). Exit status 0; with ``--check``, 1 when a run's CPU time
misses its size's target.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {
    "pp4": ["--dp-size", "64", "--global-batch-size", "1024", "--pp-size", "4", "--max-tokens-per-gpu", "16384"],
    "dp1024": ["--dp-size", "1024", "--global-batch-size", "262144", "--max-tokens-per-gpu", "8192"],
}
TARGETS = {1_000_000: 10.0, 5_000_000: 60.0}
"""Samples -> seconds the what-if tool may take (issue 28); sizes between take the next larger size's."""
PHASES = {"load_sample_lengths": "read input", "plan_ours": "dp-schedule planner (core)",
          "plan_baselines": "baselines", "strategy_rows": "simulated comparison", "table_lines": "report"}


def target(samples: int) -> float | None:
    """The target of ``samples`` (the smallest listed size at least as large), ``None`` above them all."""
    return next((TARGETS[size] for size in sorted(TARGETS) if samples <= size), None)


def write_lengths(path: Path, samples: int, *, seed: int = 0) -> None:
    """``samples`` log-normal lengths, one per line."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.5, 1.0, samples).astype(np.int64), 1, 32000)
    path.write_text("\n".join(map(str, lengths.tolist())) + "\n")


def run_plan(path: Path, layout: str, *, jobs: int) -> tuple[float, float]:
    """``megatron-dpsched plan --jobs JOBS`` on ``path`` in a fresh process: (wall seconds, CPU seconds of it and
    its workers)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "megatron_dpsched.cli", "plan", str(path), *LAYOUTS[layout],
                           "--jobs", str(jobs)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench_whatif_speed: plan failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def phase_times(path: Path, layout: str) -> dict[str, float]:
    """CPU seconds of each part of one ``plan --jobs 1`` run in this process (the command's functions, timed)."""
    from megatron_dpsched import cli

    spent = dict.fromkeys(PHASES.values(), 0.0)
    originals = {name: getattr(cli, name) for name in PHASES}

    def timed(name: str, function: Callable) -> Callable:
        def run(*args: object, **kwargs: object) -> object:
            start = time.process_time()
            result = function(*args, **kwargs)
            if name == "table_lines":
                result = list(result)  # the report is a generator: build it here
            spent[PHASES[name]] += time.process_time() - start
            return result
        return run

    try:
        for name, function in originals.items():
            setattr(cli, name, timed(name, function))
        start = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(["plan", str(path), *LAYOUTS[layout], "--jobs", "1"])
        spent["whole run"] = time.process_time() - start
    finally:
        for name, function in originals.items():
            setattr(cli, name, function)
    return spent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=sorted(TARGETS), help="samples per input")
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, min(8, os.cpu_count() or 1)],
                        help="plan --jobs values to time (default: 1 and the command's default)")
    parser.add_argument("--phases", action="store_true", help="also time the parts of each run (in-process)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a run's wall time misses its target")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missed = 0
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'samples':>9s} {'layout':>7s} {'jobs':>4s} {'wall s':>8s} {'CPU s':>8s} {'target s':>8s}  met (wall)")
    with tempfile.TemporaryDirectory() as folder:
        for samples in args.sizes:
            path = Path(folder) / f"lengths_{samples}.txt"
            write_lengths(path, samples)
            for layout in args.layouts:
                for jobs in sorted(set(args.jobs)):
                    wall, cpu = run_plan(path, layout, jobs=jobs)
                    goal = target(samples)
                    met = "-" if goal is None else "yes" if wall <= goal else "NO"
                    missed += met == "NO"
                    print(f"{samples:9d} {layout:>7s} {jobs:4d} {wall:8.1f} {cpu:8.1f} {goal or 0:8.0f}  {met}",
                          flush=True)
                if args.phases:
                    parts = phase_times(path, layout)
                    print("    CPU s: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in parts.items()),
                          flush=True)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
