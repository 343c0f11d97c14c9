"""Feeding Megatron's real ``train()``: prefetching changes nothing, a shipped plan resumes by itself.

* ``dp2_prefetch`` trains the ``dp2`` scenario with the loader preparing each next step in its
  background thread: the same micro-batches, bit-identical gradients and weights.
* ``dp2_precomputed_resumed`` starts Megatron's ``train()`` with the counters a checkpoint of step 1
  leaves (``iteration=1``, ``consumed_train_samples`` = step 0's samples) and a shipped plan built with
  ``consumed_samples="megatron"``: it trains exactly the plan's steps 1 and 2.
"""

from __future__ import annotations

import pytest
import torch
from harness import TRAIN_ITERS

pytestmark = pytest.mark.distributed


def test_prefetching_gives_bit_identical_training(launches) -> None:
    plain, prefetched = launches.get("dp2"), launches.get("dp2_prefetch")
    for off, on in zip(plain, prefetched, strict=True):
        assert on["records"] == off["records"]
        assert on["plan_micro_batches"] == off["plan_micro_batches"]
        assert len(on["grads"]) == len(off["grads"]) == TRAIN_ITERS
        for step, (a, b) in enumerate(zip(off["grads"], on["grads"])):
            for name in a:
                assert torch.equal(a[name], b[name]), f"step {step}: gradient of {name}"
        for name, value in off["weights"].items():
            assert torch.equal(value, on["weights"][name]), name
        assert on["consumed_train_samples"] == off["consumed_train_samples"]
        assert on["eval_loss"] == off["eval_loss"]


def test_a_shipped_plan_resumes_from_megatrons_consumed_train_samples(launches) -> None:
    full, resumed = launches.get("dp2_precomputed"), launches.get("dp2_precomputed_resumed")
    for whole, part in zip(full, resumed, strict=True):
        assert {step for step, _, _ in part["records"]} == {1, 2}
        assert part["records"] == [r for r in whole["records"] if r[0] >= 1]
        assert part["consumed_train_samples"] == whole["consumed_train_samples"]
        assert part["scheduler_num_steps"] == sum(whole["plan_num_samples"][1:])
