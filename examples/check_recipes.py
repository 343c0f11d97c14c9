#!/usr/bin/env python
"""Check every launch recipe's flags on a machine without GPUs (no training).

For each recipe and layout: runs the shell script with ``DRY=1`` (it prints its torchrun
command), then passes the entry point's arguments through Megatron's ``parse_args`` +
``validate_args`` and the entry point's ``adjust_args`` (which runs the ``--dp-schedule``
validation) with the recipe's world size. ``torch.cuda`` device queries answer as an
H100 here, since ``validate_args`` asks for the device capability. Exit status 1 on any failure.

One line per recipe (``OK`` or ``FAIL``); ``-v`` / ``--verbose`` also prints what Megatron printed
while parsing and validating (its argument table, some 800 lines per recipe).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPES = (
    *(("gpt_1node_8gpu.sh", layout, 8, {}) for layout in ("dp8", "tp2", "tp2_pp2", "cp2")),
    *(("gpt_multinode.sh", layout, 32, {"NNODES": "4", "RDZV_HOST": "node0"})
      for layout in ("tp2_pp4", "tp8", "tp4_cp2")),
)


def recipe_argv(script: str, layout: str, env: dict[str, str], data: str) -> list[str]:
    """The entry point's arguments in the recipe's torchrun command."""
    out = subprocess.run(["bash", str(HERE / script), layout], env={**os.environ, "DRY": "1", "DATA": data, **env},
                         capture_output=True, text=True, check=True).stdout
    argv = shlex.split(out)
    start = next(i for i, a in enumerate(argv) if a.endswith("pretrain_gpt_dpsched.py"))
    return argv[start + 1:]


def check(argv: list[str], world_size: int) -> str:
    import pretrain_gpt_dpsched as entry
    from megatron.training.arguments import parse_args, validate_args

    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    sys.argv = ["pretrain_gpt_dpsched.py", *argv]
    args = parse_args(entry.extra_args_provider)
    validate_args(args)
    entry.adjust_args(args)
    return (f"TP{args.tensor_model_parallel_size} PP{args.pipeline_model_parallel_size} "
            f"VPP{args.virtual_pipeline_model_parallel_size or 1} CP{args.context_parallel_size} "
            f"DP{args.data_parallel_size}")


def quietly(verbose: bool) -> contextlib.AbstractContextManager:
    """Megatron's own printing (stdout and stderr) while a recipe is checked: shown only when verbose."""
    if verbose:
        return contextlib.nullcontext()
    sink = io.StringIO()
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(sink))
    stack.enter_context(contextlib.redirect_stderr(sink))
    return stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="also print what Megatron prints")
    verbose = parser.parse_args(argv).verbose
    warnings.filterwarnings("ignore")
    if not verbose:  # "No CUDA runtime is found", logged once when megatron imports torch's extension builder
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    import torch

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        major=9, minor=0, name="H100", total_memory=80 << 30, multi_processor_count=132)
    sys.path.insert(0, str(HERE.parent / "scripts"))
    failed = 0
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as data:
        data.write('{"tokens": [1, 2, 3]}\n')
        data.flush()
        for script, layout, world, env in RECIPES:
            try:
                with quietly(verbose):
                    summary = check(recipe_argv(script, layout, env, data.name), world)
                print(f"OK   {script} {layout}: {summary}", flush=True)
            except BaseException as error:  # noqa: BLE001 - reported
                failed += 1
                print(f"FAIL {script} {layout}: {type(error).__name__}: {error}"
                      + ("" if verbose else " (-v prints Megatron's output)"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
