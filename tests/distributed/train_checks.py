"""Shared checks of a scheduled training run against the one-process whole-batch reference.

Every layout test calls :func:`assert_trained_like_reference`; it checks every rank:

1. each rank ran, per step and model chunk, exactly the micro-batches its plan gives it;
2. every sample of a step was trained exactly once per pipeline stage and model chunk;
3. the reduced gradients of every step (gathered over tensor parallelism) equal the reference's,
   on every rank that holds the parameter (DP, CP and TP replicas included);
4. the weights every step starts from, and the weights after training, equal the reference's;
5. the LR scheduler and ``consumed_train_samples`` advanced by the samples trained;
6. Megatron's ``evaluate()`` loss equals the reference's on every last-stage rank.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch
from harness import GLOBAL_BATCH, TRAIN_ITERS

RTOL = 1e-5


def step_samples(step: int) -> list[int]:
    """The sample ids of ``step`` (the loader reads the dataset in order)."""
    return list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))


def merged(results: list[dict], key: str, step: int | None = None) -> dict[str, torch.Tensor]:
    """One tensor per global parameter name, from the first rank that holds it."""
    out: dict[str, torch.Tensor] = {}
    for result in results:
        values = result[key] if step is None else result[key][step]
        for name, value in values.items():
            out.setdefault(name, value)
    return out


def assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str, *,
                 rtol: float = RTOL, names_equal: bool = True) -> None:
    """Every tensor of ``actual`` within ``rtol`` (relative norm) of ``expected``."""
    if names_equal:
        assert set(actual) == set(expected), f"{what}: parameter names differ"
    for name, value in actual.items():
        ref = expected[name]
        err = (value.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-12)
        assert err < rtol, f"{what}: {name} relative error {err:.2e}"


def assert_every_rank_close(results: list[dict], reference: dict, key: str, *, rtol: float,
                            step: int | None = None) -> None:
    """The reference's values on every rank (each rank's own parameters), and all of them covered."""
    expected = reference[key] if step is None else reference[key][step]
    what = key if step is None else f"step {step} {key}"
    for result in results:
        values = result[key] if step is None else result[key][step]
        assert_close(values, expected, f"{what}, rank {result['global_rank']}", rtol=rtol, names_equal=False)
    assert set(merged(results, key, step)) == set(expected), f"{what}: parameter names differ"


def assert_micro_batches_follow_plan(results: list[dict], *, num_chunks: int) -> set[int]:
    """Invariant 1; the set of micro-batch counts seen."""
    counts = set()
    for result in results:
        read = defaultdict(list)
        for step, chunk, ids in result["records"]:
            read[step, chunk].append(ids)
        for step, planned in enumerate(result["plan_micro_batches"]):
            counts.add(len(planned))
            for chunk in range(num_chunks):
                assert read[step, chunk] == list(planned), f"rank {result['global_rank']} step {step} chunk {chunk}"
        assert len(read) == TRAIN_ITERS * num_chunks
    return counts


def assert_each_sample_once(results: list[dict]) -> None:
    """Invariant 2 (per data-parallel group: every CP/TP rank reads the same micro-batches)."""
    by_stage: dict[Any, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        if result.get("tp_rank", 0) or result.get("cp_rank", 0):
            continue
        for step, chunk, ids in result["records"]:
            by_stage[result["pp_rank"], chunk][step].extend(ids)
    for (stage, chunk), steps in by_stage.items():
        for step in range(TRAIN_ITERS):
            assert sorted(steps[step]) == step_samples(step), f"stage {stage} chunk {chunk} step {step}"


def assert_trained_like_reference(results: list[dict], reference: dict, *, num_chunks: int = 1,
                                  rtol: float = RTOL, grads: bool = True) -> None:
    """Invariants 1-6 (``grads=False`` where the recorded gradient is a shard, e.g. the distributed optimizer)."""
    counts = assert_micro_batches_follow_plan(results, num_chunks=num_chunks)
    assert len(counts) > 1, f"the plan should change the micro-batch count between steps, got {counts}"
    assert_each_sample_once(results)
    for step in range(TRAIN_ITERS):
        if grads:
            assert_every_rank_close(results, reference, "grads", rtol=rtol, step=step)
        assert_every_rank_close(results, reference, "weights_before_step", rtol=rtol, step=step)
    assert_every_rank_close(results, reference, "weights", rtol=rtol)
    for result in results:
        assert result["consumed_train_samples"] == TRAIN_ITERS * GLOBAL_BATCH
        assert result["scheduler_num_steps"] == TRAIN_ITERS * GLOBAL_BATCH
    losses = [r["eval_loss"] for r in results if r["eval_loss"] is not None]
    assert losses, "no last-stage rank reported an evaluation loss"
    for loss in losses:
        assert loss == pytest.approx(reference["eval_loss"], rel=rtol)


SAME_FIGURES = ("records", "plan_micro_batches", "plan_num_samples", "consumed_train_samples", "scheduler_num_steps",
                "iteration", "eval_loss")
"""What two ways into the same run (the source patch, the monkey-patch) must give identically, besides tensors."""


def assert_same_training(result: dict, expected: dict) -> None:
    """One rank's run equals ``expected`` bit for bit: its figures, every step's gradients, the final weights."""
    for key in SAME_FIGURES:
        assert result[key] == expected[key], key
    for step in range(TRAIN_ITERS):
        assert result["grads"][step].keys() == expected["grads"][step].keys()
        assert all(torch.equal(result["grads"][step][n], g) for n, g in expected["grads"][step].items()), step
    assert all(torch.equal(result["weights"][n], w) for n, w in expected["weights"].items())
