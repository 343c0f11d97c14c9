"""The peers' own test files against the drop-ins, with only their import of the peer's module changed.

Skipped unless the peer's source is given:

* ``DPSCHED_SLIME_SRC``: a THUDM/slime checkout; runs its ``tests/test_dp_schedule.py`` with
  ``slime.utils.dp_schedule`` replaced by ``megatron_dpsched.compat.slime`` (pure Python, nothing else needed).
* ``DPSCHED_VERL_SRC``: a volcengine/verl checkout (b178a3c tested); runs its
  ``tests/utils/test_seqlen_balancing.py`` with ``verl.utils.seqlen_balancing`` replaced by
  ``megatron_dpsched.compat.verl``. verl's ``DataProto`` and test helpers are imported from the checkout, so
  verl's own dependencies must be importable (``tensordict``, ``ray``, ``omegaconf``, ``transformers<5``; put
  them on ``PYTHONPATH``). ``test_seqlen_balancing_distributed_params`` starts NCCL on two GPUs and is
  deselected on a machine with fewer.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.distributed


def run_peer_test(source: Path, *, module: str, tmp_path: Path, extra_path: list[Path], deselect: list[str]) -> str:
    """Copy ``source`` with ``module`` imported from the drop-in instead, run it, return pytest's summary."""
    text = source.read_text()
    replaced = text.replace(module, "megatron_dpsched.compat." + module.split(".")[0])
    assert replaced != text, f"{source} does not import {module}"
    target = tmp_path / f"test_peer_{source.stem}.py"
    target.write_text(replaced)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *map(str, extra_path), env.get("PYTHONPATH", "")])
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target)]
    if deselect:
        args += ["-k", " and ".join(f"not {name}" for name in deselect)]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return summary


def peer_source(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"set {variable} to a checkout of the peer to run its own tests against the drop-in")
    return Path(value).resolve()


def test_slime_own_dp_schedule_tests_pass(tmp_path):
    src = peer_source("DPSCHED_SLIME_SRC")
    summary = run_peer_test(src / "tests" / "test_dp_schedule.py", module="slime.utils.dp_schedule",
                            tmp_path=tmp_path, extra_path=[], deselect=[])
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    print(f"slime tests/test_dp_schedule.py: {summary}")


def test_verl_own_seqlen_balancing_tests_pass(tmp_path):
    src = peer_source("DPSCHED_VERL_SRC")
    import torch

    deselect = [] if torch.cuda.device_count() >= 2 else ["test_seqlen_balancing_distributed_params"]
    summary = run_peer_test(src / "tests" / "utils" / "test_seqlen_balancing.py",
                            module="verl.utils.seqlen_balancing", tmp_path=tmp_path, extra_path=[src],
                            deselect=deselect)
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
    print(f"verl tests/utils/test_seqlen_balancing.py: {summary}")
