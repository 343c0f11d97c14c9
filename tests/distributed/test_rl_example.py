"""``examples/rl_controller.py`` end to end: rollouts planned by the controller, trained by gloo trainer ranks.

The jobs are the README's two commands (the same in docs/rl.md), run exactly as written (relative ``--out``
and ``--resume`` paths, from the repository root): one trains 3 rollouts on 2 trainer ranks and saves its state after 2;
the second resumes from that state. Every rank's records are checked: each rollout sample trained exactly once, in the
micro-batches of the shipped plan, finite losses, Megatron's counters advanced by the samples
trained; the resumed job makes the same next plan and trains it with the same losses and counters. Each job ends
saying where it saved; the resumed one says that it matched the job that saved its state, and a resume with
another rollout seed says that it differs, naming the rollout, with exit code 1.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rl_controller.py"
DP = 2  # the example's defaults, which the README's commands keep
ROLLOUTS = 3

pytestmark = pytest.mark.distributed


def records(out: Path) -> list[list[dict]]:
    return [json.loads((out / f"records.rank{rank}.json").read_text()) for rank in range(DP)]


def plan(out: Path, rollout: int) -> dict:
    return json.loads((out / "plans" / f"rollout_{rollout}.json").read_text())


def readme_commands(page: str = "README.md") -> list[list[str]]:
    """The ``examples/rl_controller.py`` command lines of ``page``, split as a shell would (comments dropped)."""
    text = (REPO / page).read_text()
    lines = [line for line in text.splitlines() if line.startswith(".venv/bin/python examples/rl_controller.py")]
    return [shlex.split(line, comments=True) for line in lines]


def test_the_readme_and_docs_rl_show_the_same_commands() -> None:
    assert len(readme_commands()) == 2 and readme_commands() == readme_commands("docs/rl.md")


def run_as_written(argv: list[str], *, returncode: int = 0) -> list[str]:
    """``argv`` from the repository root; its interpreter is the checkout's ``.venv`` (this one without it); the
    lines it printed."""
    python = argv[0] if (REPO / argv[0]).exists() else sys.executable
    proc = subprocess.run([python, *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == returncode, (shlex.join(argv) + "\n" + proc.stdout + proc.stderr)[-4000:]
    return proc.stdout.splitlines()


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The README's two jobs (the same in docs/rl.md), run as written; their outputs copied out of the checkout
    (and removed from it when they were not there before)."""
    first, second = readme_commands()
    assert "--save-state-after" in first and "--resume" in second, (first, second)
    assert not Path(option(first, "--out")).is_absolute() and option(second, "--resume").startswith(
        option(first, "--out") + "/")
    outs = [REPO / option(argv, "--out") for argv in (first, second)]
    existed = [out.exists() for out in outs]
    root = tmp_path_factory.mktemp("rl_example")
    try:
        for argv, name in zip((first, second), ("full", "resumed"), strict=True):
            printed = run_as_written(argv)
            (root / f"{name}.stdout").write_text("\n".join(printed))
        for out, name in zip(outs, ("full", "resumed"), strict=True):
            shutil.copytree(out, root / name)
    finally:
        for out, was_there in zip(outs, existed, strict=True):
            if not was_there:
                shutil.rmtree(out, ignore_errors=True)
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


def test_each_job_says_where_it_saved_and_the_resumed_one_that_it_matched(jobs):
    full, resumed = jobs
    first, second = readme_commands()
    out, state = option(first, "--out"), option(second, "--resume")
    assert state == f"{out}/state_after_2"
    full_lines = (full.parent / "full.stdout").read_text().splitlines()
    assert full_lines[-2:] == [
        "trained rollouts 0..2 on 2 ranks",
        f"saved: the state after 2 rollouts in {state} (continue with --resume {state}); plans in {out}/plans, "
        f"per-rank records in {out}/records.rank*.json"]
    resumed_out = option(second, "--out")
    assert (full.parent / "resumed.stdout").read_text().splitlines()[-3:] == [
        "trained rollouts 2..2 on 2 ranks",
        f"saved: plans in {resumed_out}/plans, per-rank records in {resumed_out}/records.rank*.json; no state "
        f"(--save-state-after K saves one)",
        f"resume: matches the job that saved {state} (its --out {out}): rollouts 2..2 planned the same, and trained "
        f"with the same micro-batches, losses, learning rates, iterations and consumed samples on 2 ranks"]


def test_a_resume_that_trains_otherwise_says_it_differs_and_exits_1(jobs, tmp_path):
    full, _ = jobs
    argv = [sys.executable, str(EXAMPLE), "--out", str(tmp_path / "other"), "--resume", str(full / "state_after_2"),
            "--seed", "1"]  # other rollouts than the job that saved the state made
    lines = run_as_written(argv, returncode=1)
    assert lines[-1] == (f"resume: DIFFERS from the job that saved {full / 'state_after_2'} (its --out {full}): "
                         f"rollout 2: another plan"), lines[-3:]
