"""The cap bounds what collate builds: planned (padded) sizes and padded rows (spec "Planned sizes", invariant 2)."""

from __future__ import annotations

import json

import pytest
from assertions import assert_invariants, collated_tokens
from hypothesis import given
from hypothesis import strategies as st

from megatron_dpsched import DPSchedule, ScheduleConfig, build_dp_schedule
from megatron_dpsched.core import StepTimeModel
from megatron_dpsched.core.packing import bin_lower_bound, chunk_count, chunk_decreasing, pack_into

STEP_TIME = StepTimeModel(seconds_per_token=1e-6, seconds_per_token_pair=1e-10, seconds_per_microbatch=1e-4)


def assert_cap_holds_on_collated(schedule: DPSchedule, lengths: list[int]) -> None:
    """Every micro-batch, collated by hand, fits the cap unless it is one sample."""
    config = schedule.config
    cap = config.max_tokens_per_gpu * config.cp_size
    for rank in range(schedule.dp_size):
        for step in range(schedule.num_steps):
            for mb in schedule.rank_step_micro_batches(rank, step):
                tokens = collated_tokens(mb, lengths, pad_multiple=config.pad_multiple, padded_rows=config.padded_rows)
                assert len(mb) <= 1 or tokens <= cap, (rank, step, mb, tokens, cap)


@st.composite
def padded_inputs(draw):
    pad = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 48]))
    cap = draw(st.integers(pad, 2048))
    shape = draw(st.sampled_from(["uniform", "short", "around_cap", "mixed"]))
    if shape == "uniform":
        element = st.integers(1, cap)
    elif shape == "short":
        element = st.integers(1, max(1, cap // 8))
    elif shape == "around_cap":
        element = st.integers(max(1, cap - 2 * pad), cap + pad)
    else:
        element = st.one_of(st.integers(1, 16), st.integers(max(1, cap // 2), 2 * cap))
    lengths = draw(st.lists(element, min_size=1, max_size=100))
    dp = draw(st.integers(1, min(8, len(lengths))))
    pp = draw(st.sampled_from([1, 1, 2, 4]))
    kwargs = {
        "dp_size": dp,
        "global_batch_size": draw(st.integers(dp, max(dp, len(lengths)))),
        "max_tokens_per_gpu": cap,
        "pp_size": pp,
        "vpp_size": draw(st.sampled_from([1, 2])) if pp > 1 else 1,
        "balance": draw(st.sampled_from(["cost", "tokens", "none"])),
        "balance_growth": draw(st.sampled_from([0.0, 0.25])),
        "pad_multiple": pad,
        "padded_rows": draw(st.booleans()),
    }
    if kwargs["balance"] != "none" and draw(st.booleans()):
        kwargs["step_time_model"] = STEP_TIME
    return lengths, kwargs


@pytest.mark.slow
@given(padded_inputs())
def test_every_collated_micro_batch_fits_the_cap(case):
    lengths, kwargs = case
    schedule = build_dp_schedule(lengths, **kwargs)
    assert_cap_holds_on_collated(schedule, lengths)
    assert_invariants(schedule, lengths)


@pytest.mark.slow
@given(st.lists(st.integers(1, 64), min_size=1, max_size=7), st.integers(64, 160))
def test_chunking_is_the_fewest_padded_rows_micro_batches(sizes, cap):
    """The fit test is ``(rows + 1) * max(longest, size) <= cap``; chunking the decreasing sizes is optimal."""
    bins = chunk_decreasing(range(len(sizes)), sizes, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    assert all(len(b) * max(sizes[i] for i in b) <= cap for b in bins)
    assert len(bins) == chunk_count(sizes, cap) == bin_lower_bound(sizes, cap, padded_rows=True)
    assert len(bins) == _fewest_row_bins(sizes, cap)


def _fewest_row_bins(sizes: list[int], cap: int) -> int:
    """Brute force: every way of putting the samples, one by one, into a micro-batch that still fits or a new one."""
    best = len(sizes)

    def place(item: int, groups: list[list[int]]) -> None:
        nonlocal best
        if len(groups) >= best:
            return
        if item == len(sizes):
            best = len(groups)
            return
        for group in groups:
            if (len(group) + 1) * max(*group, sizes[item]) <= cap:
                group.append(sizes[item])
                place(item + 1, groups)
                group.pop()
        place(item + 1, [*groups, [sizes[item]]])

    place(0, [])
    return best


def test_raw_token_packing_overflows_after_padding_and_the_padded_plan_does_not():
    lengths, cap, pad = [33, 17, 10, 1], 64, 16  # 61 raw tokens; padded 48 + 32 + 16 + 16 = 112
    raw = build_dp_schedule(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=cap)
    assert raw.num_microbatches == (1,)
    assert collated_tokens(range(4), lengths, pad_multiple=pad, padded_rows=False) == 112 > cap
    padded = build_dp_schedule(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=cap, pad_multiple=pad)
    assert padded.num_microbatches == (2,)
    assert_cap_holds_on_collated(padded, lengths)
    assert_invariants(padded, lengths)
    tampered = DPSchedule.from_dict({**raw.to_dict(), "config": {**raw.to_dict()["config"], "pad_multiple": pad}})
    with pytest.raises(AssertionError, match="invariant 2: .* collates to 112 tokens"):
        tampered.check()


def test_padded_rows_bound_rows_times_longest():
    lengths, cap = [50, 4, 4, 4], 64  # 62 raw tokens fit one micro-batch; as rows 4 x 50 = 200
    raw = build_dp_schedule(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=cap)
    assert raw.num_microbatches == (1,)
    rows = build_dp_schedule(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=cap, padded_rows=True)
    assert sorted(map(sorted, rows.rank_step_micro_batches(0, 0))) == [[0], [1, 2, 3]]
    assert_cap_holds_on_collated(rows, lengths)
    assert_invariants(rows, lengths)


def test_pack_into_padded_rows_keeps_similar_lengths_together():
    sizes = [64, 60, 8, 8, 8, 8, 7, 7]  # chunks [64, 60] (2 x 64 = 128) and the six short ones (6 x 8)

    def packed(count):
        bins = pack_into(range(len(sizes)), sizes, 128, count, padded_rows=True)
        return None if bins is None else sorted(sorted(b) for b in bins)
    assert packed(1) is None
    assert packed(2) == [[0, 1], [2, 3, 4, 5, 6, 7]]
    assert packed(3) == [[0], [1], [2, 3, 4, 5, 6, 7]]  # the largest (128) splits first
    assert packed(4) == [[0], [1], [2, 3, 4], [5, 6, 7]]
    assert all(packed(8)) and packed(9)[0] == []  # empty only once every micro-batch holds one sample


def test_defaults_plan_raw_tokens():
    lengths = [33, 17, 10, 1, 900, 5, 64, 63]
    base = build_dp_schedule(lengths, dp_size=2, global_batch_size=8, max_tokens_per_gpu=128)
    explicit = build_dp_schedule(lengths, dp_size=2, global_batch_size=8, max_tokens_per_gpu=128,
                                 pad_multiple=1, padded_rows=False)
    assert base == explicit
    assert base.config.pad_multiple == 1 and base.config.padded_rows is False


def test_plans_serialise_and_fingerprint_with_the_padding():
    lengths = [33, 17, 10, 1, 900, 5, 64, 63] * 4
    kwargs = {"dp_size": 2, "global_batch_size": 16, "max_tokens_per_gpu": 128}
    plain = build_dp_schedule(lengths, **kwargs)
    padded = build_dp_schedule(lengths, **kwargs, pad_multiple=16, padded_rows=True)
    again = DPSchedule.from_dict(json.loads(json.dumps(padded.to_dict())))
    assert again == padded and again.config.pad_multiple == 16 and again.config.padded_rows is True
    again.check()
    assert again.step_fingerprint(0) == padded.step_fingerprint(0) != plain.step_fingerprint(0)
    old = plain.to_dict()  # a plan written before the padding options existed
    for key in ("pad_multiple", "padded_rows"):
        del old["config"][key]
    assert DPSchedule.from_dict(old) == plain


@pytest.mark.parametrize(("options", "message"), [
    ({"pad_multiple": 0}, "pad_multiple must be an integer >= 1"),
    ({"pad_multiple": 2.0}, "pad_multiple must be an integer"),
    ({"pad_multiple": True}, "pad_multiple must be an integer"),
    ({"pad_multiple": 256}, "pad_multiple=256 is larger than the token cap"),
    ({"padded_rows": 1}, "padded_rows must be True or False"),
])
def test_bad_padding_options_name_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        ScheduleConfig(dp_size=1, global_batch_size=1, max_tokens_per_gpu=128, **options)


def test_pad_multiple_counts_against_the_cap_times_cp():
    config = ScheduleConfig(dp_size=1, global_batch_size=1, max_tokens_per_gpu=64, cp_size=4, pad_multiple=256)
    assert config.token_cap == 256
