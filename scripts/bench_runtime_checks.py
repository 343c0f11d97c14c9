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
  this machine, median over 200 steps, next to an empty ``barrier`` for scale;
* the content digest folded into every step's fingerprint: per 4k-token sample (hashing only, and
  reading + hashing a JSONL row), and per step of the demo (``scripts/demo.py``'s corpus and global
  batch: every rank digests every sample of the step), next to planning the step without it;
* the job agreement at start-up: the job identity of the demo's arguments (data checksums
  included; a 1 GiB file without a fresh index is read whole and checksummed) and its exchange (one all-reduce of
  2 x 7 integers) on the gloo processes.
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
DEMO_GLOBAL_BATCH, DEMO_SCALE, DEMO_STEPS, DEMO_DP, DEMO_CAP = 32, 4.0, 10, 2, 160
"""``scripts/demo.py``'s defaults: global batch, length scale, steps, data-parallel ranks, token cap."""


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

    from megatron_dpsched.megatron.job_checks import agree_on_job
    from megatron_dpsched.runtime.job_identity import FIELDS, JobIdentity

    identity = JobIdentity(fields=tuple((name, f"{name} of the job") for name in FIELDS))
    step = StepBatches(step=0, micro_batches=((),), num_samples=1, fingerprint=12345)
    timings = {"agree": [], "barrier": [], "job": []}
    for index in range(AGREEMENT_STEPS + 20):
        for name, call in (("agree", lambda: agree_on_step(_Feed(), step)), ("barrier", dist.barrier),
                           ("job", lambda: agree_on_job(identity))):
            dist.barrier()
            start = time.perf_counter()
            call()
            if index >= 20:
                timings[name].append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(" ".join(str(statistics.median(timings[name])) for name in ("agree", "barrier", "job")))
    dist.destroy_process_group()


def agreement_seconds(world_size: int) -> tuple[float, float, float]:
    """Median seconds of the step agreement all-reduce, of a barrier and of the job agreement's exchange, on
    ``world_size`` gloo processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        init_file, out = os.path.join(folder, "init"), os.path.join(folder, "out")
        mp.start_processes(_agreement_worker, args=(world_size, init_file, out), nprocs=world_size,
                           start_method="spawn", join=True)
        agree, barrier, job = (float(x) for x in Path(out).read_text().split())
    return agree, barrier, job


def content_figures(repeats: int, folder: Path) -> dict[str, float]:
    """Seconds of the content digest: per 4k-token sample, and per step of the demo's corpus and batch."""
    import torch

    from megatron_dpsched.core import ScheduleConfig
    from megatron_dpsched.data import load_lengths, open_corpus, scale_lengths, write_token_jsonl
    from megatron_dpsched.megatron.feeds import ScheduledDatasetLoader, sample_digest

    row = [(7 * i) % 50000 for i in range(4097)]
    sample = {"tokens": torch.tensor(row[:-1]), "labels": torch.tensor(row[1:])}
    long_corpus = open_corpus(write_token_jsonl(folder / "4k.jsonl", [row] * 64))
    lengths = scale_lengths(load_lengths("gsm8k_train", limit=DEMO_STEPS * DEMO_GLOBAL_BATCH), DEMO_SCALE)
    demo = open_corpus(write_token_jsonl(folder / "demo.jsonl", [[i % 128 for i in range(n + 1)] for n in lengths]))
    config = ScheduleConfig(dp_size=DEMO_DP, global_batch_size=DEMO_GLOBAL_BATCH, max_tokens_per_gpu=DEMO_CAP,
                            padded_rows=True)
    feed = ScheduledDatasetLoader(demo, lengths=demo.lengths, rank=0, vocab_size=VOCAB, config=config)
    step_ids = list(range(DEMO_GLOBAL_BATCH))
    calls = 64
    return {
        "hash_4k": best_of(repeats, lambda: [sample_digest(sample) for _ in range(calls)]) / calls,
        "read_4k": best_of(repeats, lambda: [long_corpus[i] for i in range(calls)]) / calls,
        "read_hash_4k": best_of(repeats, lambda: [sample_digest(long_corpus[i]) for i in range(calls)]) / calls,
        "stored_4k": best_of(repeats, lambda: [long_corpus.sample_digest(i) for i in range(calls)]) / calls,
        "demo_step_digest": best_of(repeats, lambda: feed.content_digest(step_ids)),
        "demo_step_plan": best_of(repeats, lambda: feed.plan_step_at(0)),
    }


def identity_figures(repeats: int, folder: Path) -> dict[str, float]:
    """Seconds to compute the job identity of the demo's arguments, and to checksum a 1 GiB file."""
    from megatron.training.arguments import parse_args

    from megatron_dpsched.megatron import add_dp_schedule_args
    from megatron_dpsched.megatron.job_checks import identity_from_args
    from megatron_dpsched.runtime.job_identity import file_checksum

    saved_argv = sys.argv
    sys.argv = ["bench", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                "--seq-length", "512", "--max-position-embeddings", "512", "--micro-batch-size", "1",
                "--global-batch-size", str(DEMO_GLOBAL_BATCH), "--vocab-size", "128", "--data-path",
                str(folder / "demo.jsonl"), "--split", "100,0,0", "--dp-schedule",
                "--dp-schedule-max-tokens-per-gpu", str(DEMO_CAP)]
    try:
        args = parse_args(add_dp_schedule_args)
    finally:
        sys.argv = saved_argv
    args.data_parallel_size = DEMO_DP
    large = folder / "large.bin"
    with open(large, "wb") as out:
        out.truncate(1 << 30)  # sparse on disk; without a fresh index every byte is read and hashed
    return {"identity": best_of(repeats, lambda: identity_from_args(args)),
            "checksum_1g": best_of(1, lambda: file_checksum(large))}


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
    jobs = {}
    for world_size in options.world_sizes:
        agree, barrier, jobs[world_size] = agreement_seconds(world_size)
        print(f"  {world_size} processes: all-reduce of 2 integers {agree * 1e6:8.1f} us"
              f"   (an empty barrier: {barrier * 1e6:8.1f} us)")
    with tempfile.TemporaryDirectory() as folder:
        content = content_figures(options.repeats, Path(folder))
        job = identity_figures(options.repeats, Path(folder))
    print(f"content digest in every step's fingerprint (best of {options.repeats}):")
    print(f"  per 4k-token sample, any dataset: hashing the tensors {content['hash_4k'] * 1e6:8.1f} us; "
          f"reading + hashing a JSONL row {content['read_hash_4k'] * 1e6:8.1f} us "
          f"(reading alone: {content['read_4k'] * 1e6:.1f} us)")
    print(f"  per 4k-token sample, a JSONL corpus (its stored line, what the feed digests): "
          f"{content['stored_4k'] * 1e6:8.1f} us")
    print(f"  per step of the demo ({DEMO_GLOBAL_BATCH} samples, every rank): "
          f"{content['demo_step_digest'] * 1e3:8.2f} ms   (planning the step, digest included: "
          f"{content['demo_step_plan'] * 1e3:.2f} ms)")
    print("job agreement at start-up, once:")
    print(f"  job identity of the demo's arguments  {job['identity'] * 1e3:8.2f} ms   "
          f"(a 1 GiB data file without a fresh index, read whole: {job['checksum_1g']:.2f} s)")
    for world_size, seconds in jobs.items():
        print(f"  exchange on {world_size} processes (all-reduce of {2 * 7} integers) {seconds * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
