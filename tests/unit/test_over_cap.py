"""Samples over the token cap: found by their planned size, listed longest first, warned about or refused as
``--dp-schedule-over-cap`` says, and counted per step (no torch)."""

from __future__ import annotations

import random

import pytest

from megatron_dpsched import build_dp_schedule
from megatron_dpsched.runtime.over_cap import SHOWN, describe, find_over_cap, over_cap_notice, step_over_cap


def _over_by_hand(lengths: list[int], cap: int, multiple: int) -> list[int]:
    """The ids whose length, rounded up to ``multiple``, exceeds ``cap`` (written out again, loop by loop)."""
    ids = []
    for i, n in enumerate(lengths):
        padded = n
        while padded % multiple:
            padded += 1
        if padded > cap:
            ids.append(i)
    return ids


@pytest.mark.parametrize("multiple", [1, 2, 8])
def test_over_cap_samples_are_those_whose_planned_size_exceeds_the_cap(multiple) -> None:
    rng = random.Random(multiple)
    lengths = [rng.randint(1, 120) for _ in range(300)]
    over = find_over_cap(lengths, token_cap=100, pad_multiple=multiple)
    expected = _over_by_hand(lengths, 100, multiple)
    assert list(over.ids) == expected and over.lengths == tuple(lengths[i] for i in expected)
    assert over.count == len(expected) and over.longest == max(lengths[i] for i in expected) and over.cap == 100


def test_padding_can_put_a_sample_over_the_cap() -> None:
    assert find_over_cap([97, 100, 101], token_cap=100).ids == (2,)
    assert find_over_cap([97, 100, 101], token_cap=100, pad_multiple=8).ids == (0, 1, 2)  # 104 > 100
    assert find_over_cap([10, 20], token_cap=100).longest == 0


def test_the_message_lists_the_longest_first_and_counts_the_rest() -> None:
    lengths = [5, 300, 7, 250, 400, 250, 120, 130, 140, 6]
    over = find_over_cap(lengths, token_cap=100)
    text = describe(over, dataset="train")
    assert text.startswith("7 sample(s) of the train dataset are over the token cap of 100")
    assert "the longest 400 tokens: id 4 (400 tokens), id 1 (300 tokens), id 3 (250 tokens), id 5 (250 tokens), " \
           "id 8 (140 tokens) and 2 more;" in text
    assert text.count(" tokens)") == SHOWN


def test_allow_warn_refuse() -> None:
    over = find_over_cap([50, 150, 20], token_cap=100)
    assert over_cap_notice(over, policy="allow", dataset="train") is None
    warning = over_cap_notice(over, policy="warn", dataset="valid")
    assert warning.startswith("dp-schedule: WARNING: 1 sample(s) of the valid dataset are over the token cap of 100")
    assert "id 1 (150 tokens)" in warning and "\n" not in warning
    with pytest.raises(ValueError, match=r"^--dp-schedule-over-cap refuse: 1 sample\(s\) of the train dataset .*"
                                         r"id 1 \(150 tokens\)"):
        over_cap_notice(over, policy="refuse", dataset="train")
    none = find_over_cap([50, 20], token_cap=100)
    assert over_cap_notice(none, policy="refuse", dataset="train") is None
    with pytest.raises(ValueError, match="^--dp-schedule-over-cap must be one of allow, warn, refuse"):
        over_cap_notice(over, policy="loud", dataset="train")


def test_each_step_counts_its_own_over_cap_samples() -> None:
    lengths = [10, 150, 20, 30, 40, 260, 300, 5]
    plan = build_dp_schedule(lengths, dp_size=2, global_batch_size=4, max_tokens_per_gpu=100)
    for step, expected in ((0, (1, 150)), (1, (2, 300))):
        samples = [i for rank in range(2) for mb in plan.rank_step_micro_batches(rank, step) for i in mb]
        over = step_over_cap(plan.lengths, samples, token_cap=plan.config.token_cap,
                             pad_multiple=plan.config.pad_multiple)
        assert (over.count, over.longest) == expected
        assert sorted(over.ids) == sorted(i for i in samples if lengths[i] > 100)
    assert step_over_cap(lengths, [0, 1], token_cap=None, pad_multiple=1) is None
