"""Property-based tests: random lengths, layouts, caps and groups; every plan must keep the invariants."""

from __future__ import annotations

import json
import math

import pytest
from assertions import assert_invariants
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dpsched import CostModel, DPSchedule, ScheduleConfig, build_dp_schedule
from megatron_dpsched.baselines import build_baseline_schedule
from megatron_dpsched.core.packing import best_fit_decreasing


@st.composite
def lengths_and_cap(draw):
    cap = draw(st.integers(1, 4096))
    shape = draw(st.sampled_from(["uniform", "heavy", "tiny", "around_cap"]))
    if shape == "uniform":
        element = st.integers(1, max(1, cap))
    elif shape == "heavy":  # log-uniform over four decades, well past the cap
        element = st.floats(0, math.log(cap * 4 + 1)).map(lambda x: max(1, int(math.exp(x))))
    elif shape == "tiny":
        element = st.integers(1, 8)
    else:
        element = st.integers(max(1, cap // 2 - 3), cap + 3)
    lengths = draw(st.lists(element, min_size=1, max_size=120))
    return lengths, cap


@st.composite
def layouts(draw):
    pp = draw(st.integers(1, 4))
    vpp = draw(st.sampled_from([1, 2, 3])) if pp > 1 else 1
    group = draw(st.one_of(st.none(), st.integers(pp, pp + 4))) if vpp > 1 else None
    return {"pp_size": pp, "vpp_size": vpp, "microbatch_group_size_per_vp_stage": group}


def largest_step(count, global_batch_size, groups):
    """Samples in the largest step: ``global_batch_size`` samples, or groups by first appearance."""
    if groups is None:
        return min(count, global_batch_size)
    order = list(dict.fromkeys(groups))
    sizes = {g: groups.count(g) for g in order}
    return max(sum(sizes[g] for g in order[i : i + global_batch_size]) for i in range(0, len(order), global_batch_size))


def maybe_groups(draw, count):
    if not draw(st.booleans()):
        return None
    return draw(st.lists(st.integers(0, max(1, count // 3)), min_size=count, max_size=count))


@pytest.mark.slow
@given(data=st.data(), sample=lengths_and_cap(), layout=layouts())
def test_dynamic_plans_keep_every_invariant(data, sample, layout):
    lengths, cap = sample
    groups = maybe_groups(data.draw, len(lengths))
    kwargs = dict(
        dp_size=data.draw(st.integers(1, 9)),
        global_batch_size=data.draw(st.integers(1, 40)),
        max_tokens_per_gpu=cap,
        cp_size=data.draw(st.sampled_from([1, 1, 2])),
        balance=data.draw(st.sampled_from(["cost", "tokens", "none"])),
        drop_last=data.draw(st.booleans()) and len(lengths) >= 40,
        cost_model=data.draw(st.sampled_from([None, CostModel(hidden_size=64, num_layers=2, num_attention_heads=4)])),
        **layout,
    )
    if kwargs["dp_size"] > largest_step(len(lengths), kwargs["global_batch_size"], groups):
        with pytest.raises(ValueError, match="is larger than the .* samples of the largest step"):
            build_dp_schedule(lengths, groups=groups, **kwargs)
        return
    schedule = build_dp_schedule(lengths, groups=groups, **kwargs)
    assert_invariants(schedule, lengths, groups=groups)
    if groups is None and kwargs["balance"] != "none":
        _assert_never_more_than_global_first_fit(schedule, lengths, kwargs)


def _assert_never_more_than_global_first_fit(schedule, lengths, kwargs):
    """At most the count of one global first fit (and of best fit decreasing) dealt to the ranks, except where
    step 5 reached past it for a tail past the cap: then at most the most samples one rank holds (aligned)."""
    baseline = build_baseline_schedule("global_first_fit", lengths, config=schedule.config)
    assert_invariants(baseline, lengths, baseline=True)
    cap = kwargs["max_tokens_per_gpu"] * kwargs["cp_size"]
    layout = schedule.config.layout
    for step, theirs in enumerate(baseline.num_microbatches):
        items = schedule.step_samples(step)
        bins = best_fit_decreasing(items, lengths, cap)
        upper = min(theirs, layout.align(math.ceil(len(bins) / schedule.dp_size)))
        ours = schedule.num_microbatches[step]
        if ours > upper:
            most = max(sum(len(mb) for mb in schedule.rank_step_micro_batches(r, step))
                       for r in range(schedule.dp_size))
            assert ours <= layout.align(most)


@pytest.mark.slow
@given(data=st.data(), layout=layouts())
def test_static_plans_keep_every_invariant(data, layout):
    dp = data.draw(st.integers(1, 6))
    mbs = data.draw(st.integers(1, 4))
    per_step = dp * mbs * data.draw(st.integers(1, 4))
    lengths = data.draw(st.lists(st.integers(1, 5000), min_size=dp, max_size=3 * per_step))
    schedule = build_dp_schedule(
        lengths,
        dp_size=dp,
        global_batch_size=per_step,
        micro_batch_size=mbs,
        balance=data.draw(st.sampled_from(["cost", "tokens", "none"])),
        **layout,
    )
    assert_invariants(schedule, lengths)
    for step, count in enumerate(schedule.num_microbatches):
        needed = math.ceil(schedule.step_num_samples[step] / (mbs * dp))
        assert count == schedule.config.layout.align(needed)


@settings(max_examples=300)
@given(sample=lengths_and_cap(), layout=layouts(), dp=st.integers(1, 5))
def test_json_round_trip(sample, layout, dp):
    lengths, cap = sample
    dp = min(dp, len(lengths))
    schedule = build_dp_schedule(lengths, dp_size=dp, global_batch_size=16, max_tokens_per_gpu=cap, **layout)
    assert DPSchedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule


@settings(max_examples=300)
@given(data=st.data(), sample=lengths_and_cap(), layout=layouts())
def test_baselines_keep_the_invariants_they_promise(data, sample, layout):
    lengths, cap = sample
    dp = data.draw(st.integers(1, 6))
    for name in ("megatron_fixed", "per_rank_first_fit", "global_first_fit"):
        config = ScheduleConfig(dp_size=dp, global_batch_size=8, max_tokens_per_gpu=cap, **layout)
        assert_invariants(build_baseline_schedule(name, lengths, config=config), lengths, baseline=True)
