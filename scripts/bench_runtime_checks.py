#!/usr/bin/env python
"""What the run-time trust checks cost: plan check, step fingerprint, length check, cross-rank agreement.

    .venv/bin/python scripts/bench_runtime_checks.py [--samples 65536] [--dp-size 512] [--repeats 3]

Prints, best of ``--repeats`` on this machine:

* ``DPSchedule.check()`` of one step of ``--samples`` samples on ``--dp-size`` ranks (what a
  shipped plan costs once, when its feed is built; ``--dp-schedule-verify check`` pays it per step);
* ``DPSchedule.step_fingerprint`` of that step (every scheduled step, on every rank);
* the per-sample check at collate time (the sample contract: dtypes, shapes, token ids and labels in the
  padded vocabulary, the planned length; every sample, always on), next to what loading and collating a
  sample costs (packed thd, rank 0's micro-batches of the step, the collated-size check included);
* the cross-rank agreement (one two-integer all-reduce per step) on 2 and 4 gloo processes on
  this machine, median over 200 steps, next to an empty ``barrier`` for scale.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("PYTHONWARNINGS", "ignore")  # Megatron's import-time warnings, here and in the workers
warnings.filterwarnings("ignore")

from megatron_dpsched import build_dp_schedule  # noqa: E402

AGREEMENT_STEPS = 200
VOCAB = 50304
"""The padded vocabulary the sample check bounds token ids by (GPT-2's, padded to a multiple of 128)."""


def best_of(repeats: int, run: Callable[[], object]) -> float:
    """Fastest of ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def plan_figures(samples: int, dp_size: int, repeats: int) -> dict[str, float]:
    """Seconds for check(), the fingerprint and the length check of one planned step."""
    import torch

    from megatron_dpsched.megatron.collate import CollateConfig
    from megatron_dpsched.megatron.feeds import ScheduledDataIterator

    rng = random.Random(0)
    lengths = [rng.randint(1, 8000) for _ in range(samples)]
    plan = build_dp_schedule(lengths, dp_size=dp_size, global_batch_size=samples, max_tokens_per_gpu=16384,
                             balance="tokens")
    generator = torch.Generator().manual_seed(0)
    tokens = {n: torch.randint(0, VOCAB, (n,), generator=generator) for n in set(lengths)}
    data = [{"tokens": tokens[n], "labels": tokens[n]} for n in lengths]
    feed = ScheduledDataIterator(plan, rank=0, samples=data, collate=CollateConfig(format="thd"), vocab_size=VOCAB)
    feed.begin_step()

    def check_lengths() -> None:
        for sample_id, sample in enumerate(data):
            feed._check_length(sample_id, sample)

    def collate_rank_zero() -> None:
        for index in range(feed.current.num_microbatches):
            feed._cache.clear()
            feed.micro_batch(index)

    rank_zero_samples = sum(len(mb) for mb in feed.current.micro_batches)
    return {
        "collate_per_sample": best_of(repeats, collate_rank_zero) / rank_zero_samples,
        "check": best_of(repeats, plan.check),
        "fingerprint": best_of(repeats, lambda: plan.step_fingerprint(0)),
        "length_check_per_sample": best_of(repeats, check_lengths) / samples,
    }


def _agreement_worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from megatron_dpsched.megatron.agreement import agree_on_step
    from megatron_dpsched.megatron.feeds import StepBatches

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))

    class _Feed:
        name = "bench"

    step = StepBatches(step=0, micro_batches=((),), num_samples=1, fingerprint=12345)
    timings = {"agree": [], "barrier": []}
    for index in range(AGREEMENT_STEPS + 20):
        for name, call in (("agree", lambda: agree_on_step(_Feed(), step)), ("barrier", dist.barrier)):
            dist.barrier()
            start = time.perf_counter()
            call()
            if index >= 20:
                timings[name].append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(f"{statistics.median(timings['agree'])} {statistics.median(timings['barrier'])}")
    dist.destroy_process_group()


def agreement_seconds(world_size: int) -> tuple[float, float]:
    """Median seconds per step of the agreement all-reduce and of a barrier, on ``world_size`` gloo processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        init_file, out = os.path.join(folder, "init"), os.path.join(folder, "out")
        mp.start_processes(_agreement_worker, args=(world_size, init_file, out), nprocs=world_size,
                           start_method="spawn", join=True)
        agree, barrier = (float(x) for x in Path(out).read_text().split())
    return agree, barrier


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=65536, help="samples in the planned step")
    parser.add_argument("--dp-size", type=int, default=512, help="data-parallel ranks of the planned step")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4],
                        help="gloo process counts for the agreement timing")
    options = parser.parse_args(argv)
    figures = plan_figures(options.samples, options.dp_size, options.repeats)
    print(f"one step of {options.samples} samples on {options.dp_size} ranks (best of {options.repeats}):")
    print(f"  DPSchedule.check()                 {figures['check'] * 1e3:8.1f} ms")
    print(f"  DPSchedule.step_fingerprint        {figures['fingerprint'] * 1e3:8.1f} ms")
    print(f"  sample check, per sample           {figures['length_check_per_sample'] * 1e6:8.2f} us"
          f"   (loading + collating, sample check included: {figures['collate_per_sample'] * 1e6:.1f} us)")
    print(f"cross-rank agreement per step (gloo, this machine, median of {AGREEMENT_STEPS} steps):")
    for world_size in options.world_sizes:
        agree, barrier = agreement_seconds(world_size)
        print(f"  {world_size} processes: all-reduce of 2 integers {agree * 1e6:8.1f} us"
              f"   (an empty barrier: {barrier * 1e6:8.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
