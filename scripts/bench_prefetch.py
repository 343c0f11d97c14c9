#!/usr/bin/env python
"""Per-step data wait with and without ``--dp-schedule-prefetch`` on the demo model.

Trains the CPU demo's dp-schedule run (2-layer GPT, hidden 64, DP=2 on gloo, GSM8K lengths
scaled down, token cap 160; ``scripts/demo.py``) twice through
``scripts/pretrain_gpt_dpsched.py --cpu-dry-run``: with ``--dp-schedule-prefetch on`` and
``off``. Each step record holds ``data_wait_s``: the seconds the training thread waited for
the step's plan and micro-batches (``StepFeed.step_wait_seconds``). Prints, per run, the
median, mean and largest wait per step and the median step time (the first step, planned on
the training thread in both runs, left out), and whether the two runs' losses are
bit-identical. Exit 0 when both runs trained; the figures vary with the machine's load.

    .venv/bin/python scripts/bench_prefetch.py [--steps 20] [--global-batch-size 32]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

from demo import launch, model_flags, run_flags, write_corpus  # noqa: E402

from megatron_dpsched.data import load_lengths, scale_lengths  # noqa: E402
from megatron_dpsched.megatron.step_recorder import load_step_records  # noqa: E402


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "out" / "bench_prefetch"), help="output folder")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--scale", type=float, default=4.0, help="divide the GSM8K token counts by this")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=160)
    options = parser.parse_args(argv)
    options.baseline_micro_batch_size = 1  # what demo.run_flags reads; the baseline is not run here
    if options.steps < 2 or options.global_batch_size < 2 or options.global_batch_size % 2:
        parser.error("--steps must be >= 2 and --global-batch-size an even number >= 2")
    return options


def figures(records: list[dict]) -> dict[str, float]:
    """Per step (the slowest rank), the first step left out: data wait and step time."""
    by_step: dict[int, list[dict]] = {}
    for record in records:
        by_step.setdefault(record["step"], []).append(record)
    steps = [by_step[s] for s in sorted(by_step)][1:]
    waits = [max(r["data_wait_s"] for r in step) for step in steps]
    times = [max(r["step_time_s"] for r in step) for step in steps]
    return {"median_wait": statistics.median(waits), "mean_wait": statistics.fmean(waits), "max_wait": max(waits),
            "median_step": statistics.median(times), "total_wait": sum(waits), "steps": len(steps)}


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lengths = scale_lengths(load_lengths("gsm8k_train", limit=options.steps * options.global_batch_size), options.scale)
    seq_length = 16 * math.ceil(max(lengths) / 16)
    data = write_corpus(out / "corpus.jsonl", lengths)
    print(f"demo model (2-layer GPT, hidden 64, DP=2 on CPU/gloo), {options.steps} steps of "
          f"{options.global_batch_size} samples, token cap {options.max_tokens_per_gpu}; {data}", flush=True)
    results, losses = {}, {}
    for port, mode in enumerate(("on", "off"), start=29300 + os.getpid() % 500):
        flags = [*model_flags(seq_length, options, data), *run_flags("dp-schedule", options),
                 "--dp-schedule-prefetch", mode]
        launch(f"prefetch-{mode}", flags, out, port)
        records = load_step_records(out / f"prefetch-{mode}")
        results[mode] = figures(records)
        losses[mode] = sorted((r["step"], r["rank"], r["loss"]) for r in records)
    print(f"\nper-step data wait of the training thread (slowest rank; {results['on']['steps']} steps, "
          f"step 0 left out)")
    print(f"{'':22}{'median':>10}{'mean':>10}{'max':>10}{'sum':>10}{'median step':>14}")
    for mode, f in results.items():
        print(f"prefetch {mode:<13}{f['median_wait'] * 1e3:>8.2f}ms{f['mean_wait'] * 1e3:>8.2f}ms"
              f"{f['max_wait'] * 1e3:>8.2f}ms{f['total_wait'] * 1e3:>8.1f}ms{f['median_step'] * 1e3:>12.1f}ms")
    same = losses["on"] == losses["off"]
    print(f"losses of the two runs {'bit-identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
