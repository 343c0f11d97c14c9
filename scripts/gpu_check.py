#!/usr/bin/env python
"""GPU check: the GPT entry point trained on one GPU with ``--dp-schedule`` and with Megatron's fixed micro-batches.

Run it as ``bash scripts/gpu_check.sh`` (which picks the interpreter). Both runs are real Megatron jobs
(``torchrun --nproc-per-node 1 scripts/pretrain_gpt_dpsched.py``) of an 8-layer GPT (hidden 1024, bf16)
on the same JSONL corpus, the same seed and the same global batches; sample lengths are the first GSM8K
training samples' token counts (shipped in ``megatron_dpsched/data``) scaled so that the longest fits
``--seq-length``; token ids are synthetic. The ``--dp-schedule`` run packs ``thd`` micro-batches where
Transformer Engine imports (``--transformer-impl transformer_engine``), else padded ``bshd`` ones with
Megatron's local implementation; the baseline pads every sample to ``--seq-length``.

Prints tokens/s (real, non-padding tokens per second of ``train_step``), the median step time, the
peak GPU memory (``torch.cuda.max_memory_allocated``) and the largest relative per-step loss difference
between the runs, and writes ``<out>/summary.json``. ``--cpu`` runs the same flow as a CPU dry run
(gloo, 2 processes, a tiny fp32 GPT). ``--wheels DIR`` first installs megatron-core and
megatron-dpsched from DIR (``pip --no-index``, torch pinned to the installed version) unless importable.

Exit status: 0 when both runs trained and agree; 2 for a bad option or no CUDA device, before anything
is trained; 1 when a run fails or the runs disagree, with a one-line reason as the last line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
LENGTHS_FILE = REPO / "megatron_dpsched" / "data" / "gsm8k_train.txt"
DEFAULTS = {  # per device: --seq-length, --global-batch-size; learning rate
    "gpu": {"seq_length": 4096, "global_batch_size": 32, "lr": 3e-4},
    "cpu": {"seq_length": 128, "global_batch_size": 8, "lr": 3e-3},
}
GPU_MODEL = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
             "--ffn-hidden-size", "4096", "--bf16"]
PACKAGES = {"megatron-core": "megatron.core", "megatron-dpsched": "megatron_dpsched"}


class CheckFailed(RuntimeError):
    """A run failed or the runs disagree (exit 1)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message, code=2)


def fail(reason: str, *, code: int) -> NoReturn:
    print(f"gpu_check: error: {reason}", file=sys.stderr)
    sys.exit(code)


# --- options ----------------------------------------------------------------------------------


def parse_options(argv: list[str] | None = None) -> Namespace:
    parser = _Parser(prog="scripts/gpu_check.sh [--python PY]", allow_abbrev=False,
                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU dry run instead (gloo, 2 processes, tiny GPT)")
    parser.add_argument("--wheels", metavar="DIR", help="install megatron-core and megatron-dpsched from DIR first")
    parser.add_argument("--out", default=str(REPO / "out" / "gpu_check"), help="output folder")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of tokens/s and step time")
    parser.add_argument("--seq-length", type=int, help="longest sample; the baseline pads to it (GPU 4096, CPU 128)")
    parser.add_argument("--global-batch-size", type=int, help="samples per step (GPU 32, CPU 8)")
    parser.add_argument("--max-tokens-per-gpu", type=int,
                        help="--dp-schedule-max-tokens-per-gpu of the dp-schedule run (default: --seq-length, "
                             "the positions of one baseline micro-batch of one sample)")
    parser.add_argument("--baseline-micro-batch-size", type=int, default=1,
                        help="--micro-batch-size of the run without --dp-schedule")
    parser.add_argument("--transformer-impl", choices=("auto", "transformer_engine", "local"), default="auto",
                        help="auto: transformer_engine (thd) where Transformer Engine imports, else local (bshd)")
    parser.add_argument("--loss-rtol", type=float, default=0.05,
                        help="largest accepted relative per-step loss difference between the runs")
    options = parser.parse_args(argv)
    for name, value in DEFAULTS["cpu" if options.cpu else "gpu"].items():
        if getattr(options, name, None) is None:
            setattr(options, name, value)
    if options.max_tokens_per_gpu is None:
        options.max_tokens_per_gpu = options.seq_length
    check_options(options)
    return options


def check_options(options: Namespace) -> None:
    """``ValueError`` naming the option for anything the runs could not do."""
    for flag in ("steps", "seq_length", "global_batch_size", "max_tokens_per_gpu", "baseline_micro_batch_size"):
        if getattr(options, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1; got {getattr(options, flag)}")
    if not 0 <= options.warmup_steps < options.steps:
        raise ValueError(f"--warmup-steps must be in 0..--steps - 1 ({options.steps - 1}); got {options.warmup_steps}")
    if options.seq_length < 8:
        raise ValueError(f"--seq-length must be >= 8; got {options.seq_length}")
    nproc = 2 if options.cpu else 1
    if options.global_batch_size % (nproc * options.baseline_micro_batch_size):
        raise ValueError(f"--global-batch-size must be a multiple of {nproc} x --baseline-micro-batch-size")
    available = len(LENGTHS_FILE.read_text().split())
    if options.steps * options.global_batch_size > available:
        raise ValueError(f"--steps x --global-batch-size must be at most {available} (the shipped GSM8K lengths)")
    if not 0 < options.loss_rtol < math.inf:
        raise ValueError(f"--loss-rtol must be > 0 and finite; got {options.loss_rtol}")
    if options.wheels is not None and not Path(options.wheels).is_dir():
        raise ValueError(f"--wheels {options.wheels}: no such folder")
    if options.cpu and options.transformer_impl == "transformer_engine":
        raise ValueError("--transformer-impl transformer_engine needs a GPU; --cpu runs the local implementation")


def check_device(cpu: bool) -> str:
    """What the runs train on; ``ValueError`` without torch, without a CUDA device, or ``--cpu`` on a GPU machine."""
    try:
        import torch
    except ImportError as error:
        raise ValueError(f"no torch in {sys.executable} ({error}); --python picks another interpreter") from None
    available = torch.cuda.is_available()
    if cpu and available:
        raise ValueError("--cpu is a CPU dry run and refuses to start where CUDA is available; drop --cpu")
    if cpu:
        return "CPU dry run (gloo, 2 processes)"
    if not available:
        raise ValueError(f"no CUDA device: torch.cuda.is_available() is False in {sys.executable} "
                         f"(torch {torch.__version__}, CUDA {torch.version.cuda}); --cpu runs the CPU dry run")
    return torch.cuda.get_device_name(0)


# --- set-up -----------------------------------------------------------------------------------


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def install_wheels(folder: Path, out: Path) -> None:
    """``pip install --no-index --find-links folder`` of the packages not yet importable; torch stays as it is."""
    missing = [name for name, module in PACKAGES.items() if not _importable(module)]
    if not missing:
        print(f"--wheels {folder}: megatron-core and megatron-dpsched are already importable; nothing installed")
        return
    pin = out / "torch-constraint.txt"
    pin.write_text(f"torch=={importlib.metadata.version('torch')}\n")
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(folder), "--constraint",
           str(pin), *missing]
    print(f"installing {' '.join(missing)} from {folder} (no network; torch pinned)", flush=True)
    if subprocess.run(cmd).returncode:
        raise CheckFailed(f"pip could not install {' '.join(missing)} from --wheels {folder}: it needs their "
                          "wheels and those of their dependencies (torch excepted)")
    importlib.invalidate_caches()


def transformer_engine_imports() -> bool:
    """Whether ``import transformer_engine.pytorch`` works here (in a child process, which may fail safely)."""
    probe = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], capture_output=True)
    return probe.returncode == 0


def model_setup(options: Namespace, data: Path) -> dict[str, Any]:
    """Processes, implementation, layout and the flags both runs share."""
    from demo import model_flags, training_flags

    if options.cpu:
        return {"nproc": 2, "impl": "local", "layout": "bshd", "flags": model_flags(options.seq_length, options, data)}
    impl = options.transformer_impl
    if impl == "auto":
        impl = "transformer_engine" if transformer_engine_imports() else "local"
    flags = [*GPU_MODEL, "--transformer-impl", impl,
             *training_flags(options.seq_length, options, data, lr=options.lr)]
    return {"nproc": 1, "impl": impl, "layout": "thd" if impl == "transformer_engine" else "bshd", "flags": flags}


def corpus_lengths(options: Namespace) -> tuple[list[int], list[int]]:
    """The first GSM8K lengths of the run, and the same scaled so that the longest is ``--seq-length``."""
    from megatron_dpsched.data import load_lengths, scale_lengths

    raw = load_lengths("gsm8k_train", limit=options.steps * options.global_batch_size)
    scaled = scale_lengths(raw, max(raw) / options.seq_length)
    return raw, [min(n, options.seq_length) for n in scaled]


# --- runs and figures -------------------------------------------------------------------------


def measure(directory: Path, options: Namespace) -> dict[str, Any]:
    """One run's figures from its step records; the first ``--warmup-steps`` are left out of the timings."""
    from demo import per_step, totals

    from megatron_dpsched.megatron.step_recorder import load_step_records

    records = load_step_records(directory)
    steps = per_step(records)
    if len(steps) != options.steps:
        raise CheckFailed(f"{directory.name} run recorded {len(steps)} steps, not --steps {options.steps}")
    timed = totals(steps[options.warmup_steps:])
    peaks = [r["peak_memory_bytes"] for r in records if r.get("peak_memory_bytes") is not None]
    return {
        "tokens_per_s": timed["tokens"] / timed["train_time_s"],
        "median_step_time_s": statistics.median(s["step_time_s"] for s in steps[options.warmup_steps:]),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "padding": timed["padding"],
        "micro_batches_per_step": [s["micro_batches"][0] for s in steps],
        "loss_tokens_per_step": [sum(s["tokens"]) for s in steps],
        "losses": [s["loss"] for s in steps],
    }


def train_both(options: Namespace, setup: dict[str, Any], out: Path) -> dict[str, dict[str, Any]]:
    """The dp-schedule run, then the baseline, on the same corpus and seed."""
    from demo import RUNS, launch, run_flags

    runs = {}
    for port, run in enumerate(RUNS, start=29400 + os.getpid() % 500):
        extra = run_flags(run, options)
        if run == "dp-schedule":
            extra += ["--dp-schedule-collate-format", setup["layout"]]
        print(f"running {run}: torchrun --nproc-per-node {setup['nproc']} scripts/pretrain_gpt_dpsched.py ... "
              f"{' '.join(extra)} (log {out / run}.log)", flush=True)
        wall = launch(run, setup["flags"] + extra, out, port, nproc=setup["nproc"])
        runs[run] = {**measure(out / run, options), "wall_s": wall}
    return runs


def failures(summary: dict[str, Any], loss_rtol: float) -> list[str]:
    """What makes the check fail, one phrase each."""
    runs = summary["runs"]
    found = []
    for run, figures in runs.items():
        values = [figures["tokens_per_s"], figures["median_step_time_s"], *figures["losses"]]
        if not all(isinstance(v, float) and math.isfinite(v) for v in values):
            found.append(f"the {run} run has a missing or non-finite loss or timing")
    if runs["dp-schedule"]["loss_tokens_per_step"] != runs["baseline"]["loss_tokens_per_step"]:
        found.append("the two runs trained different loss tokens per step")
    if not summary["plan_matches"]:
        found.append("the dp-schedule run's micro-batches differ from its plan")
    diff = summary["max_relative_loss_difference"]
    if diff is None:
        found.append("the per-step losses cannot be compared (a missing or zero loss)")
    elif not diff <= loss_rtol:
        found.append(f"max relative loss difference {diff:.3g} exceeds --loss-rtol {loss_rtol:g}")
    return found


def run_check(options: Namespace, device: str, out: Path) -> dict[str, Any]:
    """Corpus, both runs, the comparison; writes ``<out>/summary.json``."""
    from demo import plan_check, write_corpus

    raw, lengths = corpus_lengths(options)
    data = write_corpus(out / "corpus.jsonl", lengths)
    setup = model_setup(options, data)
    model = "2-layer GPT, hidden 64, fp32" if options.cpu else "8-layer GPT, hidden 1024, bf16"
    print(f"gpu check on {device}: {model}, --transformer-impl {setup['impl']}, dp-schedule layout "
          f"{setup['layout']}; {options.steps} steps of {options.global_batch_size} samples, lengths = first GSM8K "
          f"token counts ({min(raw)}-{max(raw)}) scaled to {min(lengths)}-{max(lengths)}; {data}", flush=True)
    runs = train_both(options, setup, out)
    steps = {run: [{"loss": loss} for loss in figures["losses"]] for run, figures in runs.items()}
    summary = {"device": device, "transformer_impl": setup["impl"], "collate_format": setup["layout"],
               "options": vars(options), "runs": runs, "plan_matches": plan_check(out / "dp-schedule")["match"],
               "max_relative_loss_difference": _loss_difference(steps)}
    summary["failures"] = failures(summary, options.loss_rtol)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _loss_difference(steps: dict[str, list[dict[str, Any]]]) -> float | None:
    from demo import max_relative_loss_difference

    try:
        return max_relative_loss_difference(steps["dp-schedule"], steps["baseline"])
    except (TypeError, ZeroDivisionError):  # a missing (None) or zero loss: reported by failures()
        return None


# --- report -----------------------------------------------------------------------------------


def print_table(summary: dict[str, Any]) -> None:
    sched, base = summary["runs"]["dp-schedule"], summary["runs"]["baseline"]

    def memory(figures: dict[str, Any]) -> str:
        peak = figures["peak_memory_bytes"]
        return "n/a (no CUDA)" if peak is None else f"{peak / 2**30:.2f} GiB"

    rows = (
        ("tokens/s (real tokens)", f"{sched['tokens_per_s']:,.0f}", f"{base['tokens_per_s']:,.0f}"),
        ("median step time", f"{sched['median_step_time_s']:.3f} s", f"{base['median_step_time_s']:.3f} s"),
        ("peak GPU memory", memory(sched), memory(base)),
        ("micro-batches per step", *(f"{statistics.mean(r['micro_batches_per_step']):.1f}" for r in (sched, base))),
        ("padding share", f"{sched['padding']:.1%}", f"{base['padding']:.1%}"),
        ("loss tokens trained", *(f"{sum(r['loss_tokens_per_step']):,}" for r in (sched, base))),
        ("job wall time", f"{sched['wall_s']:.1f} s", f"{base['wall_s']:.1f} s"),
    )
    print(f"\n{'':<26}{'dp-schedule':>16}  {'baseline':>16}")
    for label, ours, theirs in rows:
        print(f"{label:<26}{ours:>16}  {theirs:>16}")
    print(f"dp-schedule: {sched['tokens_per_s'] / base['tokens_per_s']:.2f}x the baseline's tokens/s")
    diff = summary["max_relative_loss_difference"]
    print(f"max relative per-step loss difference: {'n/a' if diff is None else f'{diff:.2e}'} "
          f"(--loss-rtol {summary['options']['loss_rtol']:g}); timings leave out the first "
          f"{summary['options']['warmup_steps']} steps")


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    try:
        options = parse_options(argv)
        device = check_device(options.cpu)
    except ValueError as error:
        fail(str(error), code=2)
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        if options.wheels is not None:
            install_wheels(Path(options.wheels).resolve(), out)
        summary = run_check(options, device, out)
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # demo.launch: a run failed (log tail follows)
        reason, _, detail = str(error).partition("\n")
        print(detail, file=sys.stderr)
        fail(reason, code=1)
    print_table(summary)
    print(f"summary: {out / 'summary.json'}; {time.perf_counter() - start:.0f} s in all")
    if summary["failures"]:
        fail("; ".join(summary["failures"]), code=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
