#!/usr/bin/env python
"""CPU demo: the same tiny GPT trained by Megatron twice, with ``--dp-schedule`` and without.

Both runs are real Megatron jobs (``torchrun --nproc-per-node 2``, gloo, CPU, through
``scripts/pretrain_gpt_dpsched.py --cpu-dry-run``) on one JSONL corpus whose sample lengths
are the first GSM8K training samples' token counts (shipped in ``megatron_dpsched/data``),
scaled down so that the demo runs in minutes on two cores. Token ids are synthetic
(arithmetic sequences, so the loss can fall); only the lengths are real.

Prints, per step and run, what the ranks measured while training (micro-batches per rank,
loss tokens per rank, imbalance, padding share, step time, loss, LR), then a comparison and
the largest relative loss difference between the runs; writes a PNG of one step's
per-rank load. Usage: ``bash scripts/demo.sh`` (or ``python scripts/demo.py --help``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import warnings
from argparse import Namespace
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron_dpsched.data import load_lengths, scale_lengths, write_token_indexed, write_token_jsonl  # noqa: E402
from megatron_dpsched.demo.stats import load_plans, load_step_records  # noqa: E402

VOCAB = 128
DP = 2
RUNS = ("dp-schedule", "baseline")


def parse_options(argv: list[str] | None = None) -> Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "out" / "demo"), help="output folder (git-ignored out/)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--scale", type=float, default=4.0,
                        help="divide the GSM8K token counts by this (so the CPU demo stays small)")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=160,
                        help="--dp-schedule-max-tokens-per-gpu of the dp-schedule run")
    parser.add_argument("--baseline-micro-batch-size", type=int, default=1,
                        help="--micro-batch-size of the run without --dp-schedule")
    parser.add_argument("--plot", default=None, help="PNG path (default: <out>/demo_load.png)")
    parser.add_argument("--data-format", choices=("jsonl", "indexed"), default="jsonl",
                        help="write the corpus as JSONL or as a Megatron indexed dataset (.bin/.idx)")
    options = parser.parse_args(argv)
    for flag in ("steps", "global_batch_size", "max_tokens_per_gpu", "baseline_micro_batch_size"):
        if getattr(options, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
    if options.global_batch_size % (DP * options.baseline_micro_batch_size):
        raise ValueError("--global-batch-size must be a multiple of 2 x --baseline-micro-batch-size")
    return options


# --- corpus and runs --------------------------------------------------------------------------


def write_corpus(path: Path, lengths: list[int], data_format: str = "jsonl") -> Path:
    """One arithmetic token sequence (mod VOCAB) of ``n + 1`` ids per sample length ``n``."""
    rng = random.Random(0)
    rows = []
    for n in lengths:
        start, stride = rng.randrange(VOCAB), rng.randrange(1, 8)
        rows.append([(start + stride * i) % VOCAB for i in range(n + 1)])
    if data_format == "indexed":
        return write_token_indexed(path.with_suffix(""), rows)
    return write_token_jsonl(path, rows)


def model_flags(seq_length: int, options: Namespace, data: Path) -> list[str]:
    """A tiny fp32 GPT, Megatron's local implementation, CPU dry run on gloo, plus :func:`training_flags`."""
    return [
        "--cpu-dry-run", "--use-cpu-initialization", "--distributed-backend", "gloo", "--transformer-impl", "local",
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "256",
        *training_flags(seq_length, options, data),
    ]


def training_flags(seq_length: int, options: Namespace, data: Path, *, lr: float = 3e-3) -> list[str]:
    """Data, batch, Adam with warm-up and cosine decay to ``lr / 10``, no dropout, fixed seed, no fused kernels
    (they need extra CUDA extensions), no evaluation: what the CPU demo and the GPU check share."""
    return [
        "--data-path", str(data), "--split", "100,0,0",  # the whole corpus trains
        "--seq-length", str(seq_length), "--max-position-embeddings", str(seq_length),
        "--global-batch-size", str(options.global_batch_size), "--train-iters", str(options.steps),
        "--lr", f"{lr:g}", "--min-lr", f"{lr / 10:g}", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--seed", "1234",
        "--position-embedding-type", "learned_absolute", "--untie-embeddings-and-output-weights",
        "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
        "--log-interval", "1", "--eval-iters", "0",
    ]


def run_flags(run: str, options: Namespace) -> list[str]:
    if run == "dp-schedule":
        return ["--micro-batch-size", "1", "--dp-schedule",
                "--dp-schedule-max-tokens-per-gpu", str(options.max_tokens_per_gpu), "--dp-schedule-verify", "strict"]
    return ["--micro-batch-size", str(options.baseline_micro_batch_size)]


def launch(run: str, flags: list[str], out: Path, port: int, *, nproc: int = DP) -> float:
    """``torchrun --nproc-per-node nproc`` of the entry point; returns the wall time (log in <out>/<run>.log)."""
    stats = out / run
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           str(REPO / "scripts" / "pretrain_gpt_dpsched.py"), *flags, "--step-stats-dir", str(stats)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    log = out / f"{run}.log"
    start = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.run(cmd, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=900)
    if proc.returncode:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"the {run} run failed (exit {proc.returncode}); log {log}:\n{tail}")
    return time.perf_counter() - start


# --- measurements -----------------------------------------------------------------------------


def per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each step's per-DP-rank measurements (first pipeline / tensor rank), rank order."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if record["pp_rank"] == 0 and record["tp_rank"] == 0:
            steps.setdefault(record["step"], []).append(record)
    return [summarize(sorted(steps[s], key=lambda r: r["dp_rank"])) for s in sorted(steps)]


def summarize(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [r["tokens"] for r in ranks]
    padded = [r["padded_tokens"] for r in ranks]
    losses = [r["loss"] for r in ranks if r["loss"] is not None]
    return {
        "micro_batches": [r["micro_batches"] for r in ranks],
        "samples": sum(r["samples"] for r in ranks),
        "tokens": tokens,
        "padded_tokens": padded,
        "imbalance": max(tokens) / (sum(tokens) / len(tokens)) - 1.0,
        "padding": 1.0 - sum(tokens) / sum(padded),
        "step_time_s": max(r["step_time_s"] for r in ranks),
        "loss": losses[0] if losses else None,
        "lr": ranks[0]["lr"],
    }


def plan_check(out: Path) -> dict[str, Any]:
    """The dp-schedule run's trained micro-batches (sample ids per rank and step) against its plan."""
    records = [r for r in load_step_records(out) if r["pp_rank"] == 0 and r["tp_rank"] == 0]
    plans = load_plans(out)
    trained = {(r["dp_rank"], r["step"]): r["micro_batch_ids"] for r in records}
    planned = {(r["dp_rank"], r["step"]): plans[r["rank"]][r["step"]] for r in records if r["rank"] in plans}
    counts = [len(trained[0, s]) for s in sorted(s for d, s in trained if d == 0)]
    return {"match": bool(planned) and trained == planned, "counts": counts}


# --- report -----------------------------------------------------------------------------------


def print_steps(run: str, steps: list[dict[str, Any]]) -> None:
    print(f"\n[{run}] per step (measured by each rank during Megatron's train_step)")
    print(f"{'step':>4}  {'micro-batches/rank':>18}  {'loss tokens/rank':>16}  {'imbal':>6}  "
          f"{'padding':>7}  {'time s':>6}  {'loss':>8}  {'lr (used)':>9}")
    for i, s in enumerate(steps):
        mbs = "/".join(map(str, s["micro_batches"]))
        tokens = "/".join(map(str, s["tokens"]))
        print(f"{i:>4}  {mbs:>18}  {tokens:>16}  {s['imbalance']:>6.1%}  {s['padding']:>7.1%}  "
              f"{s['step_time_s']:>6.3f}  {s['loss']:>8.5f}  {s['lr']:>9.2e}")


def totals(steps: list[dict[str, Any]]) -> dict[str, float]:
    tokens = sum(sum(s["tokens"]) for s in steps)
    return {
        "train_time_s": sum(s["step_time_s"] for s in steps),
        "padding": 1.0 - tokens / sum(sum(s["padded_tokens"]) for s in steps),
        "micro_batches": sum(s["micro_batches"][0] for s in steps),
        "mean_imbalance": sum(s["imbalance"] for s in steps) / len(steps),
        "tokens": tokens,
    }


def max_relative_loss_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b, strict=True))


def print_comparison(results: dict[str, list[dict[str, Any]]], wall: dict[str, float], loss_diff: float) -> None:
    sched, base = (totals(results[run]) for run in RUNS)
    speedup = base["train_time_s"] / sched["train_time_s"]
    rows = (
        ("train_step time, sum over steps", f"{sched['train_time_s']:.2f} s vs {base['train_time_s']:.2f} s "
                                            f"({speedup:.2f}x)"),
        ("padding share of micro-batches", f"{sched['padding']:.1%} vs {base['padding']:.1%}"),
        ("micro-batches per rank, total", f"{sched['micro_batches']} vs {base['micro_batches']}"),
        ("mean token imbalance across DP", f"{sched['mean_imbalance']:.1%} vs {base['mean_imbalance']:.1%}"),
        ("loss tokens trained", f"{sched['tokens']} vs {base['tokens']}"),
        ("job wall time incl. start-up", f"{wall['dp-schedule']:.1f} s vs {wall['baseline']:.1f} s"),
        ("max relative loss difference", f"{loss_diff:.2e}"),
    )
    print("\ncomparison (dp-schedule vs baseline, same samples per step, per-token loss)")
    for label, value in rows:
        print(f"  {label:<32}: {value}")


def plot_step(results: dict[str, list[dict[str, Any]]], step: int, path: Path) -> Path:
    """Per-rank loss tokens and padding of one step, both runs side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, run in zip(axes, RUNS, strict=True):
        s = results[run][step]
        ranks = [f"rank {r}\n{m} micro-batches" for r, m in enumerate(s["micro_batches"])]
        pad = [p - t for p, t in zip(s["padded_tokens"], s["tokens"], strict=True)]
        ax.bar(ranks, s["tokens"], label="loss tokens", color="tab:blue")
        ax.bar(ranks, pad, bottom=s["tokens"], label="padding", color="tab:gray", alpha=0.6)
        ax.set_title(f"{run}: step {step}, {s['step_time_s'] * 1e3:.0f} ms")
    axes[0].set_ylabel("token positions per rank")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    options = parse_options(argv)
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    raw = load_lengths("gsm8k_train", limit=options.steps * options.global_batch_size)
    lengths = scale_lengths(raw, options.scale)
    seq_length = 16 * math.ceil(max(lengths) / 16)
    data = write_corpus(out / "corpus.jsonl", lengths, options.data_format)
    print(f"corpus: {len(lengths)} samples, lengths = first GSM8K train samples' cl100k token counts "
          f"({min(raw)}-{max(raw)}) scaled down by {options.scale:g} to {min(lengths)}-{max(lengths)} "
          f"so the demo fits 2 CPU cores; token ids are synthetic. {data}")
    print(f"model: 2-layer GPT, hidden 64, vocab {VOCAB}, fp32; DP=2 on CPU/gloo; global batch "
          f"{options.global_batch_size}, {options.steps} steps; baseline pads to --seq-length {seq_length}")
    results, wall = {}, {}
    for port, run in enumerate(RUNS, start=29400 + os.getpid() % 500):
        flags = model_flags(seq_length, options, data) + run_flags(run, options)
        shown = " ".join(run_flags(run, options))
        print(f"running {run}: torchrun --nproc-per-node 2 scripts/pretrain_gpt_dpsched.py ... {shown}", flush=True)
        wall[run] = launch(run, flags, out, port)
        results[run] = per_step(load_step_records(out / run))
        print_steps(run, results[run])
    check = plan_check(out / "dp-schedule")
    print(f"\ndp-schedule micro-batches per step {check['counts']}; every rank's micro-batches (sample ids) "
          f"{'match' if check['match'] else 'DO NOT MATCH'} the plan the loader gives for the same steps")
    loss_diff = max_relative_loss_difference(results["dp-schedule"], results["baseline"])
    print_comparison(results, wall, loss_diff)
    candidates = range(1, len(results["baseline"])) if len(results["baseline"]) > 1 else range(1)
    step = max(candidates, key=lambda s: results["baseline"][s]["imbalance"])  # step 0 includes warm-up
    png = plot_step(results, step, Path(options.plot) if options.plot else out / "demo_load.png")
    print(f"\nper-rank load of step {step} (largest baseline imbalance after step 0): {png}")
    summary = {"results": results, "wall_s": wall, "plan_matches": check["match"],
               "micro_batch_counts": check["counts"], "max_relative_loss_difference": loss_diff,
               "png": str(png), "lengths": lengths}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
