"""Runs the multi-process launches once per session and hands their per-rank results to tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# One launch per world size: process start-up (imports) dominates, so scenarios share a launch.
LAUNCHES: dict[str, tuple[int, tuple[str, ...]]] = {
    "world2": (2, ("bad_layout", "dp2", "dp2_precomputed", "dp2_precomputed_resumed", "dp2_prefetch", "pp2",
                   "pp2_vpp2", "dp2_partial_step", "dp2_static",
                   "pp2_vpp2_static", "dp_mismatch", "lying_shorter", "lying_longer", "lying_shipped_plan",
                   "dp2_ranks_reordered", "dp2_ranks_larger", "pp2_ranks_reordered", "nan_loss")),
    "world4": (4, ("dp2_pp2",)),
    "agree2": (2, ("dp2_ranks_content",)),
    "world1": (1, ("reference",)),
    "layouts2": (2, ("thd_dp2", "bshd_dp2_rope", "thd_pp2", "thd_pp2_vpp2", "thd_tp2_sp", "tp2", "tp2_sp",
                     "cp2_bshd", "cp2_thd", "dp2_distributed_optimizer", "dp2_bf16")),
    "layouts4": (4, ("dp2_tp2", "dp2_cp2_thd")),
    "references": (1, ("reference_rope", "reference_adam", "reference_bf16")),
    "moe2": (2, ("moe_dp2_alltoall", "moe_dp2_allgather", "moe_pp2_alltoall", "moe_dp2_ep2")),
    "moe_own_path2": (2, ("moe_aux_dp2_own_path", "moe_aux_pp2_own_path", "mtp_dp2_own_path")),
    "moe_references": (1, ("moe_reference",)),
}
LAUNCH_TIMEOUT_S = 600


class LaunchResults:
    """Starts each launch on first use and loads ``<scenario>.rank<r>.pt``."""

    def __init__(self, root: Path, *, launches: dict[str, tuple[int, tuple[str, ...]]] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.root = root
        self.launches = LAUNCHES if launches is None else launches
        self.env = None if env is None else {**os.environ, **env}
        self._logs: dict[str, str] = {}

    def _launch(self, launch: str) -> Path:
        out = self.root / launch
        if launch in self._logs:
            return out
        out.mkdir(parents=True, exist_ok=True)
        world_size, scenarios = self.launches[launch]
        cmd = [sys.executable, str(HERE / "launcher.py"), "--world-size", str(world_size),
               "--out", str(out), *scenarios]
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                                  env=self.env)
            self._logs[launch] = (proc.stdout + proc.stderr)[-4000:]
        except subprocess.TimeoutExpired as error:
            self._logs[launch] = f"launch timed out after {LAUNCH_TIMEOUT_S}s: {error}"
        return out

    def get(self, scenario: str) -> list[dict[str, Any]]:
        """Per-rank results of ``scenario``; fails the test with the rank's traceback otherwise."""
        import torch

        launch = next(name for name, (_, names) in self.launches.items() if scenario in names)
        world_size = self.launches[launch][0]
        out = self._launch(launch)
        results, errors = [], []
        for rank in range(world_size):
            path = out / f"{scenario}.rank{rank}.pt"
            if not path.exists():
                errors.append(f"rank {rank}: no result (an earlier scenario of '{launch}' failed?)")
                continue
            saved = torch.load(path, weights_only=False)
            if not saved["ok"]:
                errors.append(f"rank {rank} raised:\n{saved['error']}")
            results.append(saved.get("result"))
        if errors:
            pytest.fail(f"scenario '{scenario}' failed:\n" + "\n".join(errors)
                        + f"\n--- launch log tail ---\n{self._logs[launch]}", pytrace=False)
        return results


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> LaunchResults:
    return LaunchResults(tmp_path_factory.mktemp("dp_schedule_launches"))
