"""``examples/rl_controller.py`` end to end: rollouts planned by the controller, trained by gloo trainer ranks.

One job trains 3 rollouts on 2 trainer ranks and saves its state after 2; a second job resumes from
that state. Every rank's records are checked: each rollout sample trained exactly once, in the
micro-batches of the shipped plan, finite losses, Megatron's counters advanced by the samples
trained; the resumed job makes the same next plan and trains it with the same losses and counters.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rl_controller.py"
DP = 2
ROLLOUTS = 3

pytestmark = pytest.mark.distributed


def run_example(out: Path, *extra: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out), "--dp", str(DP),
                           "--rollouts", str(ROLLOUTS), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def records(out: Path) -> list[list[dict]]:
    return [json.loads((out / f"records.rank{rank}.json").read_text()) for rank in range(DP)]


def plan(out: Path, rollout: int) -> dict:
    return json.loads((out / "plans" / f"rollout_{rollout}.json").read_text())


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("rl_example")
    run_example(root / "full", "--save-state-after", "2")
    run_example(root / "resumed", "--resume", str(root / "full" / "state_after_2"))
    return root / "full", root / "resumed"


def test_help_runs():
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "--resume" in proc.stdout


def test_every_rollout_sample_is_trained_once_as_planned(jobs):
    full, _ = jobs
    per_rank = records(full)
    generated = {s["key"] for r in range(ROLLOUTS) for s in plan(full, r)["samples"]}
    trained = [key for rank in per_rank for rec in rank for mb in rec["micro_batches"] for key in mb]
    assert sorted(trained) == sorted(generated)  # every sample once (waiting groups in a later rollout)
    for rank, recs in enumerate(per_rank):
        assert [rec["rollout"] for rec in recs] == [0, 1, 2]  # one optimizer step per rollout
        for rec in recs:
            shipped = plan(full, rec["rollout"])
            keys = [s["key"] for s in shipped["samples"]]
            partition = shipped["schedule"]["partitions"][rank]
            planned = [[keys[partition[p]] for p in mb] for mb in shipped["schedule"]["micro_batch_indices"][rank]]
            assert rec["micro_batches"] == planned, f"rank {rank}, rollout {rec['rollout']}"
            assert math.isfinite(rec["loss"]) and rec["loss"] > 0


def test_counters_advance_by_the_samples_trained_and_ranks_agree(jobs):
    full, _ = jobs
    per_rank = records(full)
    consumed = 0
    for step, rec in enumerate(per_rank[0]):
        consumed += sum(plan(full, rec["rollout"])["schedule"]["step_num_samples"])
        assert rec["consumed_train_samples"] == rec["scheduler_num_steps"] == consumed
        assert rec["iteration"] == step + 1
    for other in per_rank[1:]:
        assert [(r["loss"], r["iteration"], r["consumed_train_samples"]) for r in other] == \
            [(r["loss"], r["iteration"], r["consumed_train_samples"]) for r in per_rank[0]]


def test_resume_makes_the_same_next_plan_and_trains_it_the_same(jobs):
    full, resumed = jobs
    assert plan(resumed, 2) == plan(full, 2)
    assert not (resumed / "plans" / "rollout_0.json").exists()
    for rank, (whole, cont) in enumerate(zip(records(full), records(resumed), strict=True)):
        assert cont == whole[2:], f"rank {rank}"  # same micro-batches, loss, LR, iteration, consumed samples
