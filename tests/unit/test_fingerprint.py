"""``DPSchedule.step_fingerprint``: equal plans agree, any difference a rank could have changes it."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_dpsched import build_dp_schedule

LENGTHS = [(i * 37) % 90 + 5 for i in range(64)]
KWARGS = {"dp_size": 4, "global_batch_size": 32, "max_tokens_per_gpu": 128}


@pytest.fixture(scope="module")
def plan():
    return build_dp_schedule(LENGTHS, **KWARGS)


def test_the_same_inputs_give_the_same_fingerprint_per_step(plan) -> None:
    again = build_dp_schedule(list(LENGTHS), **KWARGS)
    prints = [plan.step_fingerprint(s) for s in range(plan.num_steps)]
    assert prints == [again.step_fingerprint(s) for s in range(again.num_steps)]
    assert prints[0] != prints[1]
    assert all(0 <= p < 2**63 for p in prints)


@pytest.mark.parametrize("change", [
    lambda lengths: [lengths[1], lengths[0], *lengths[2:]],  # read in another order
    lambda lengths: [n + 1 if i == 7 else n for i, n in enumerate(lengths)],  # one length off by one
])
def test_other_lengths_change_the_fingerprint(plan, change) -> None:
    other = build_dp_schedule(change(LENGTHS), **KWARGS)
    assert other.step_fingerprint(0) != plan.step_fingerprint(0)


def test_other_options_change_the_fingerprint(plan) -> None:
    other = build_dp_schedule(LENGTHS, **{**KWARGS, "max_tokens_per_gpu": 129})
    assert other.step_fingerprint(0) != plan.step_fingerprint(0)


@pytest.mark.parametrize("rank", range(KWARGS["dp_size"]))
def test_one_rank_with_another_split_changes_the_fingerprint(plan, rank) -> None:
    """The same samples on the same rank, one of them in the neighbouring micro-batch of step 0."""
    batches = [list(mb) for mb in plan.micro_batch_indices[rank]]
    source = next(b for b in plan.step_micro_batch_range(0) if len(batches[b]) >= 2)
    target = source + 1 if source + 1 in plan.step_micro_batch_range(0) else source - 1
    batches[target].append(batches[source].pop())
    tampered = list(plan.micro_batch_indices)
    tampered[rank] = tuple(tuple(sorted(mb)) for mb in batches)
    other = dataclasses.replace(plan, micro_batch_indices=tuple(tampered))
    assert other.step_fingerprint(0) != plan.step_fingerprint(0)
    assert other.step_fingerprint(1) == plan.step_fingerprint(1)


def test_the_position_in_the_stream_is_part_of_the_fingerprint(plan) -> None:
    assert plan.step_fingerprint(0, first_sample=32) != plan.step_fingerprint(0)
