"""Spawn N gloo processes that run a list of scenarios and save per-rank results.

Usage (what the pytest fixture runs)::

    python tests/distributed/launcher.py --world-size 2 --out DIR dp2 pp2 pp2_vpp2

The scenarios are the ones declared with ``registry.scenario``. Each writes ``DIR/<scenario>.rank<r>.pt``
holding ``{"ok": True, "result": ...}`` or ``{"ok": False, "error": traceback}``. After a failure the
processes stop (peers could be stuck in a collective); later scenarios are then simply missing, and the
timeout on the gloo group turns a hang into an error.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _worker(rank: int, world_size: int, out: str, scenarios: list[str], init_file: str) -> None:
    sys.path[:0] = [str(REPO), str(HERE)]
    warnings.filterwarnings("ignore")
    import harness
    from registry import REGISTRY

    runs = [REGISTRY.get(name).run for name in scenarios]  # imports every scenarios*.py

    from megatron_dpsched.testing import cpu_shim

    harness.env_for_rank(rank, world_size)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    cpu_shim.install()
    torch.set_num_threads(1)
    for name, run in zip(scenarios, runs, strict=True):
        path = Path(out) / f"{name}.rank{rank}.pt"
        try:
            torch.save({"ok": True, "result": run()}, path)
        except BaseException:  # noqa: BLE001 - reported to pytest
            torch.save({"ok": False, "error": traceback.format_exc()}, path)
            os._exit(1)
        dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("scenarios", nargs="+")
    opts = parser.parse_args()
    init_file = os.path.join(opts.out, "gloo_init")
    mp.start_processes(_worker, args=(opts.world_size, opts.out, opts.scenarios, init_file),
                       nprocs=opts.world_size, start_method="spawn", join=True)


if __name__ == "__main__":
    main()
