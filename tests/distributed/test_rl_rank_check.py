"""A shipped plan knows whom it feeds: ``examples/rl_controller.py`` edited as an attacker would (a copy of the
example with one line changed), run as a whole job (the controller and 2 gloo trainer ranks of real
megatron-core), ends before its first training step with one line naming both sides and exit code 2.

* ``rank=0`` on both data-parallel ranks (the issue's attack: before, both ranks trained the same samples
  every rollout, half the batch twice and half never, and the job exited 0);
* a plan made for twice the data-parallel size the trainers run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rl_controller.py"

ATTACKS = {  # name -> (the example's line, the attacker's, the one line the job ends with)
    "rank=0 on both ranks": (
        "rank=parallel_state.get_data_parallel_rank(),", "rank=0,",
        r"dp-schedule: rank 1: ScheduledDataIterator\(rank=0\) on data-parallel rank 1 of 2 \(megatron\.core\."
        r"parallel_state\.get_data_parallel_rank\(\)\); pass rank=1: ranks fed the same rank= train the same "
        r"samples, part of the batch twice and the rest never"),
    "a plan for dp 4 on 2 ranks": (
        "dp=options.dp, cap=options.max_tokens_per_gpu", "dp=2 * options.dp, cap=options.max_tokens_per_gpu",
        r"dp-schedule: rank [01]: ScheduledDataIterator: the plan was made for dp_size=4, but this job runs 2 "
        r"data-parallel ranks \(megatron\.core\.parallel_state\); plan again with dp_size=2"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_shipped_plan_fed_to_the_wrong_rank_ends_the_job_in_one_line(attack: str, tmp_path: Path) -> None:
    line, changed, expected = ATTACKS[attack]
    source = EXAMPLE.read_text()
    assert source.count(line) == 1, f"the example no longer holds {line!r}"
    script = tmp_path / "rl_controller.py"
    script.write_text(source.replace(line, changed))
    environment = {key: value for key, value in os.environ.items() if key != "DPSCHED_DEBUG"}
    environment["PYTHONPATH"] = str(REPO)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True,
                          env=environment, timeout=600, cwd=tmp_path)
    ours = [text for text in proc.stderr.splitlines() if text.startswith("dp-schedule")]
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-4000:]
    assert len(ours) == 1 and re.fullmatch(expected, ours[0]), proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-4000:]
    assert "rollout 0:" not in proc.stdout and not (out / "records.rank0.json").exists()  # no step trained
