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
from megatron_dpsched.megatron.step_recorder import load_plans, load_step_records  # noqa: E402

VOCAB = 128
DP = 2
RUNS = ("dp-schedule", "baseline")
COMPARISONS = {"baseline": RUNS, "objectives": ("step-time", "micro-batches"),
               "calibrated": ("dp-schedule", "calibrated")}
"""``--compare``: the two runs. ``objectives``: both with ``--dp-schedule``, the pipeline-aware step-time plan
against the fewest micro-batches; ``calibrated``: ``--dp-schedule``, then ``megatron-dpsched calibrate`` on its
step records, then ``--dp-schedule`` with the fitted ``--dp-schedule-cost-model``."""
TIMED = ("forward_backward_s", "compute_cpu_s", "step_time_s")
"""Per-step figures that ``--repeat`` takes the fastest of."""
WARMUP_STEPS = 2
"""Steps left out of the mean step times (and of the calibration)."""


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
    add_layout_options(parser)
    options = parser.parse_args(argv)
    for flag in ("steps", "global_batch_size", "max_tokens_per_gpu", "baseline_micro_batch_size", "dp", "pp",
                 "hidden_size", "num_layers", "repeat"):
        if getattr(options, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1")
    if options.global_batch_size % (options.dp * options.baseline_micro_batch_size):
        raise ValueError("--global-batch-size must be a multiple of --dp x --baseline-micro-batch-size")
    if options.num_layers % options.pp:
        raise ValueError(f"--num-layers {options.num_layers} must be a multiple of --pp {options.pp}")
    return options


def add_layout_options(parser: argparse.ArgumentParser) -> None:
    """Parallel layout, model size, the dp-schedule run's objective and cost model, and what to compare."""
    parser.add_argument("--dp", type=int, default=DP, help="data-parallel ranks (processes = --dp x --pp)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (--pipeline-model-parallel-size)")
    parser.add_argument("--hidden-size", type=int, default=64, help="model width (heads of 16)")
    parser.add_argument("--num-layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--objective", choices=("step-time", "micro-batches"), default=None,
                        help="--dp-schedule-objective of the dp-schedule run (default: the plugin's)")
    parser.add_argument("--cost-model", default=None, metavar="FILE",
                        help="--dp-schedule-cost-model of the dp-schedule run (from 'megatron-dpsched calibrate')")
    parser.add_argument("--repeat", type=int, default=1,
                        help="train the compared runs this many times in turn (A B A B ...) and compare each step's "
                             "fastest repeat: other processes on a shared machine only add time (default 1)")
    parser.add_argument("--compare", choices=tuple(COMPARISONS), default="baseline",
                        help="baseline: dp-schedule vs Megatron's fixed micro-batches (default); objectives: "
                             "--dp-schedule-objective step-time vs micro-batches; calibrated: dp-schedule, "
                             "calibrate on its records, dp-schedule with the fitted cost model")


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
    """A tiny fp32 GPT, Megatron's local implementation, CPU dry run on gloo, plus :func:`training_flags`
    (``options`` without the demo's layout options, as the GPU check's: 2 layers of 64, PP=1)."""
    layers, hidden = getattr(options, "num_layers", 2), getattr(options, "hidden_size", 64)
    return [
        "--cpu-dry-run", "--use-cpu-initialization", "--distributed-backend", "gloo", "--transformer-impl", "local",
        "--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(max(1, hidden // 16)),
        "--ffn-hidden-size", str(4 * hidden), "--pipeline-model-parallel-size", str(getattr(options, "pp", 1)),
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


def run_flags(run: str, options: Namespace, out: Path | None = None) -> list[str]:
    """The run's batching flags: ``baseline`` is Megatron's fixed micro-batches, every other run ``--dp-schedule``
    (``step-time`` / ``micro-batches``: that objective; ``calibrated``: the cost model fitted in ``out``)."""
    if run == "baseline":
        return ["--micro-batch-size", str(options.baseline_micro_batch_size)]
    flags = ["--micro-batch-size", "1", "--dp-schedule",
             "--dp-schedule-max-tokens-per-gpu", str(options.max_tokens_per_gpu), "--dp-schedule-verify", "strict"]
    objective = run if run in ("step-time", "micro-batches") else getattr(options, "objective", None)
    if objective is not None:
        flags += ["--dp-schedule-objective", objective]
    given = getattr(options, "cost_model", None)
    cost_model = str(out / "cost_model.json") if run == "calibrated" and out is not None else given
    if cost_model is not None:
        flags += ["--dp-schedule-cost-model", cost_model]
    return flags


def calibrate(stats: Path, target: Path) -> dict[str, Any]:
    """``megatron-dpsched calibrate`` on a run's records (CPU seconds of the training thread: this machine's
    cores are shared, so wall time also counts other processes' turns); writes ``target``, returns the report."""
    from megatron_dpsched.calibration import fit, read_records, samples_from_records

    samples = samples_from_records(read_records(stats), warmup_steps=WARMUP_STEPS, time="compute-cpu")
    result = fit(samples, robust=True)
    result.to_file().save(target)
    return dict(result.report)


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
    """Each step's per-DP-rank measurements (first pipeline / tensor rank, rank order); the loss (last pipeline
    stage) and the step times (slowest rank) from every rank."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        steps.setdefault(record["step"], []).append(record)
    order = lambda r: (r["dp_rank"], r["pp_rank"], r["tp_rank"])  # noqa: E731
    return [summarize(sorted(steps[s], key=order)) for s in sorted(steps)]


def summarize(every: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = [r for r in every if r["pp_rank"] == 0 and r["tp_rank"] == 0]
    tokens = [r["tokens"] for r in ranks]
    padded = [r["padded_tokens"] for r in ranks]
    losses = [r["loss"] for r in every if r["loss"] is not None]
    return {
        "forward_backward_s": max(r["forward_backward_s"] for r in every),
        "compute_cpu_s": [r["compute_cpu_s"] for r in ranks],
        "micro_batches": [r["micro_batches"] for r in ranks],
        "samples": sum(r["samples"] for r in ranks),
        "tokens": tokens,
        "padded_tokens": padded,
        "imbalance": max(tokens) / (sum(tokens) / len(tokens)) - 1.0,
        "padding": 1.0 - sum(tokens) / sum(padded),
        "step_time_s": max(r["step_time_s"] for r in every),
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
    later = steps[WARMUP_STEPS:] or steps
    return {
        "train_time_s": sum(s["step_time_s"] for s in steps),
        "mean_step_time_s": sum(s["step_time_s"] for s in later) / len(later),
        "mean_forward_backward_s": sum(s["forward_backward_s"] for s in later) / len(later),
        "mean_compute_cpu_s": sum(max(s["compute_cpu_s"]) for s in later) / len(later),
        "padding": 1.0 - tokens / sum(sum(s["padded_tokens"]) for s in steps),
        "micro_batches": sum(s["micro_batches"][0] for s in steps),
        "mean_imbalance": sum(s["imbalance"] for s in steps) / len(steps),
        "tokens": tokens,
    }


def max_relative_loss_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b, strict=True))


def print_comparison(
    results: dict[str, list[dict[str, Any]]], wall: dict[str, float], loss_diff: float, *, repeats: int = 1
) -> None:
    first, second = results
    ours, other = (totals(results[run]) for run in results)
    speedup = other["train_time_s"] / ours["train_time_s"]

    def pair(key: str, unit: str = " s", digits: int = 3) -> str:
        return f"{ours[key]:.{digits}f}{unit} vs {other[key]:.{digits}f}{unit} ({other[key] / ours[key]:.2f}x)"

    later = f"mean over steps {WARMUP_STEPS}.., slowest rank" + (f", fastest of {repeats}" if repeats > 1 else "")
    rows = (
        ("train_step time, sum over steps", f"{ours['train_time_s']:.2f} s vs {other['train_time_s']:.2f} s "
                                            f"({speedup:.2f}x)"),
        (f"forward-backward wall, {later}", pair("mean_forward_backward_s")),
        (f"compute CPU s, {later}", pair("mean_compute_cpu_s")),
        ("padding share of micro-batches", f"{ours['padding']:.1%} vs {other['padding']:.1%}"),
        ("micro-batches per rank, total", f"{ours['micro_batches']} vs {other['micro_batches']}"),
        ("mean token imbalance across DP", f"{ours['mean_imbalance']:.1%} vs {other['mean_imbalance']:.1%}"),
        ("loss tokens trained", f"{ours['tokens']} vs {other['tokens']}"),
        ("job wall time incl. start-up", f"{wall[first]:.1f} s vs {wall[second]:.1f} s"),
        ("max relative loss difference", f"{loss_diff:.2e}"),
    )
    width = max(len(label) for label, _ in rows)
    print(f"\ncomparison ({first} vs {second}, same samples per step, per-token loss; CPU measurements; "
          f"Nx = {second} / {first})")
    for label, value in rows:
        print(f"  {label:<{width}}: {value}")


def plot_step(results: dict[str, list[dict[str, Any]]], step: int, path: Path) -> Path:
    """Per-rank loss tokens and padding of one step, both runs side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, run in zip(axes, results, strict=True):
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


def train_runs(options: Namespace, out: Path, *, seq_length: int, data: Path) -> tuple[dict, dict, dict]:
    """The runs of ``--compare``, ``--repeat`` times in turn (A B A B ...; calibrating after the first run for
    ``calibrated``): per-step results of every repeat (``<run>``, ``<run>-2``, ...), job wall times and the
    calibration report (empty unless ``calibrated``)."""
    results, wall, calibration = {}, {}, {}
    nproc = options.dp * options.pp
    order = [(run, k) for k in range(options.repeat) for run in COMPARISONS[options.compare]]
    for port, (run, k) in enumerate(order, start=29400 + os.getpid() % 500):
        if run == "calibrated" and k == 0:
            calibration = calibrate(out / "dp-schedule", out / "cost_model.json")
            print_calibration(calibration, out / "cost_model.json")
        name = run if k == 0 else f"{run}-{k + 1}"
        flags = model_flags(seq_length, options, data) + run_flags(run, options, out)
        shown = " ".join(run_flags(run, options, out))
        print(f"running {name}: torchrun --nproc-per-node {nproc} scripts/pretrain_gpt_dpsched.py ... {shown}",
              flush=True)
        wall[name] = launch(name, flags, out, port, nproc=nproc)
        results[name] = per_step(load_step_records(out / name))
        print_steps(name, results[name])
    return results, wall, calibration


def fastest_of_repeats(results: dict[str, list[dict[str, Any]]], runs: tuple[str, ...]) -> dict[str, list]:
    """Per run, its steps with every :data:`TIMED` figure the smallest over its repeats: other processes on a
    shared machine only ever add time, so the fastest repeat is the closest to the plan's own time."""
    merged = {}
    for run in runs:
        repeats = [steps for name, steps in results.items() if name == run or name.startswith(f"{run}-")]
        merged[run] = [{**steps[0], **{key: _smallest([s[key] for s in steps]) for key in TIMED}}
                       for steps in zip(*repeats, strict=True)]
    return merged


def _smallest(values: list[Any]) -> Any:
    """The smallest value, per rank for per-rank lists (one rank's repeats are compared with each other)."""
    if isinstance(values[0], list):
        return [min(column) for column in zip(*values, strict=True)]
    return min(values)


def run_to_run_noise(results: dict[str, list[dict[str, Any]]], runs: tuple[str, ...]) -> dict[str, float] | None:
    """With ``--repeat`` 2 or more: per run, how much the mean slowest-rank compute CPU seconds of the same plans
    differ between its first two repeats (relative to the first); printed, ``None`` with one repeat."""
    if f"{runs[0]}-2" not in results:
        return None
    noise = {}
    for run in runs:
        once, again = totals(results[run]), totals(results[f"{run}-2"])
        noise[run] = abs(again["mean_compute_cpu_s"] - once["mean_compute_cpu_s"]) / once["mean_compute_cpu_s"]
    shown = ", ".join(f"{run} {value:.1%}" for run, value in noise.items())
    print(f"\nrun-to-run (same plans, first two repeats): mean compute CPU seconds differ by {shown}")
    return noise


def print_calibration(report: dict[str, Any], path: Path) -> None:
    ranks = ", ".join(f"rank {r} {e['max']:.1%}" for r, e in report["rank_relative_errors"].items())
    fitted = ", ".join(f"{name} {value:.3g}" for name, value in json.loads(path.read_text())["step_time_model"].items())
    steps = f"{report['steps'][0]}..{report['steps'][-1]}"
    print(f"\ncalibrated on the dp-schedule run's steps {steps} ({report['n_rows']} {report['rows']} rows, CPU "
          f"seconds of each rank's forward-backward, Huber): {fitted}; each rank's step "
          f"time predicted with relative error mean {report['mean_relative_error']:.1%}, max per rank: {ranks}; "
          f"R^2 {report['r_squared']:.3f}; wrote {path}")


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
    print(f"model: {options.num_layers}-layer GPT, hidden {options.hidden_size}, vocab {VOCAB}, fp32; "
          f"DP={options.dp} PP={options.pp} on CPU/gloo; global batch {options.global_batch_size}, "
          f"{options.steps} steps; baseline pads to --seq-length {seq_length}")
    results, wall, calibration = train_runs(options, out, seq_length=seq_length, data=data)
    first, second = COMPARISONS[options.compare]
    noise = run_to_run_noise(results, (first, second))
    checks = {run: plan_check(out / run) for run in results if not run.startswith("baseline")}
    for run, check in checks.items():
        print(f"\n{run} micro-batches per step {check['counts']}; every rank's micro-batches (sample ids) "
              f"{'match' if check['match'] else 'DO NOT MATCH'} the plan the loader gives for the same steps")
    loss_diff = max(max_relative_loss_difference(results[first], steps) for steps in results.values())
    every, results = results, fastest_of_repeats(results, (first, second))
    print_comparison(results, wall, loss_diff, repeats=options.repeat)
    candidates = range(1, len(results[second])) if len(results[second]) > 1 else range(1)
    step = max(candidates, key=lambda s: results[second][s]["imbalance"])  # step 0 includes warm-up
    png = plot_step(results, step, Path(options.plot) if options.plot else out / "demo_load.png")
    print(f"\nper-rank load of step {step} (largest {second} imbalance after step 0): {png}")
    summary = {"compare": options.compare, "repeat": options.repeat, "results": results, "runs": every, "wall_s": wall,
               "totals": {run: totals(steps) for run, steps in results.items()},
               "plan_matches": all(c["match"] for c in checks.values()),
               "micro_batch_counts": checks[first]["counts"], "max_relative_loss_difference": loss_diff,
               "calibration": calibration, "run_to_run_noise": noise, "png": str(png), "lengths": lengths}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
