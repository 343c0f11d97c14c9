"""Real megatron-core ``train()`` / ``train_step`` on CPU/gloo with the dp-schedule data path.

Layouts: DP=2, PP=2, PP=2 with VPP=2 (2 processes) and DP=2 x PP=2 (4 processes);
the reference is one process training every step's whole global batch as a
single micro-batch. See ``scenarios.py`` for what runs in the processes.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from harness import GLOBAL_BATCH, LENGTHS, TRAIN_ITERS
from registry import case, names
from train_checks import RTOL, assert_close, merged, step_samples

pytestmark = pytest.mark.distributed

LAYOUTS = names("whole_batch")
"""E.g. ``dp2_precomputed``: a shipped DPSchedule (JSON) plus an empty micro-batch per rank and step."""
LOADER_LAYOUTS = names("resumes")
STATIC_COUNTS = {"dp2_static": 2, "pp2_vpp2_static": 2}
"""Static batching (no token cap): 8 samples / (2 x 2) = 2; under VPP the count 1 grows to the group of 2."""


def test_bad_layout_fails_before_training_naming_the_flag(launches) -> None:
    for result in launches.get("bad_layout"):
        assert result["error"] is not None, "a VPP group below PP was accepted"
        assert "--microbatch-group-size-per-virtual-pipeline-stage" in result["error"]


def test_a_plan_for_another_dp_size_is_refused_before_training(launches) -> None:
    for result in launches.get("dp_mismatch"):
        assert result["error"] is not None, "a plan made for dp_size=4 ran on 2 ranks"
        assert "dp_size=4" in result["error"] and "runs 2" in result["error"]
        assert result["unchanged"], "weights changed before the mismatch was caught"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_micro_batches_per_step_follow_the_plan(launches, layout: str) -> None:
    counts, num_chunks = set(), case(layout).vpp
    for result in launches.get(layout):
        read = defaultdict(list)
        for step, chunk, ids in result["records"]:
            read[step, chunk].append(ids)
        for step, planned in enumerate(result["plan_micro_batches"]):
            counts.add(len(planned))
            for chunk in range(num_chunks):
                assert read[step, chunk] == list(planned), f"step {step} chunk {chunk}"
        assert len(read) == TRAIN_ITERS * num_chunks
    if case(layout).static_micro_batch_size is not None:
        assert counts == {STATIC_COUNTS[layout]}, counts
        return
    assert len(counts) > 1, f"the plan should change the micro-batch count between steps, got {counts}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_sample_of_a_step_trained_exactly_once(launches, layout: str) -> None:
    by_stage = defaultdict(lambda: defaultdict(list))
    for result in launches.get(layout):
        for step, chunk, ids in result["records"]:
            by_stage[result["pp_rank"], chunk][step].extend(ids)
    for (stage, chunk), steps in by_stage.items():
        for step in range(TRAIN_ITERS):
            assert sorted(steps[step]) == step_samples(step), f"stage {stage} chunk {chunk} step {step}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_match_whole_batch_reference_every_step(launches, layout: str) -> None:
    results, (reference,) = launches.get(layout), launches.get("reference")
    for step in range(TRAIN_ITERS):
        assert_close(merged(results, "grads", step), reference["grads"][step], f"step {step} grads")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_data_parallel_replicas_hold_the_same_gradients(launches, layout: str) -> None:
    by_stage = defaultdict(list)
    for result in launches.get(layout):
        by_stage[result["pp_rank"]].append(result["grads"][0])
    for replicas in by_stage.values():
        for other in replicas[1:]:
            assert_close(other, replicas[0], "DP replica grads")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_after_training_match_reference(launches, layout: str) -> None:
    results, (reference,) = launches.get(layout), launches.get("reference")
    assert_close(merged(results, "weights"), reference["weights"], f"weights after {TRAIN_ITERS} steps")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lr_scheduler_and_consumed_samples_count_trained_samples(launches, layout: str) -> None:
    for result in launches.get(layout):
        trained = sum(result["plan_num_samples"])
        assert trained == TRAIN_ITERS * GLOBAL_BATCH
        assert result["consumed_train_samples"] == trained
        assert result["scheduler_num_steps"] == trained


@pytest.mark.parametrize("layout", LAYOUTS)
def test_evaluate_loss_matches_reference(launches, layout: str) -> None:
    (reference,) = launches.get("reference")
    losses = [r["eval_loss"] for r in launches.get(layout) if r["eval_loss"] is not None]
    assert losses, "no last-stage rank reported an evaluation loss"
    for loss in losses:
        assert loss == pytest.approx(reference["eval_loss"], rel=RTOL)


@pytest.mark.parametrize("layout", LOADER_LAYOUTS)
def test_resume_from_consumed_samples_gives_the_same_next_plan(launches, layout: str) -> None:
    next_samples = set(range(TRAIN_ITERS * GLOBAL_BATCH, min(len(LENGTHS), (TRAIN_ITERS + 1) * GLOBAL_BATCH)))
    seen = set()
    for result in launches.get(layout):
        assert result["resumed_next_step"] == result["next_step"]
        seen.update(i for mb in result["next_step"] for i in mb)
    assert seen == next_samples
