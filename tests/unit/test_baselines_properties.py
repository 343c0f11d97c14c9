"""Property tests: every baseline plan schedules every sample once, in equal and legal counts per rank."""

from __future__ import annotations

import math

import pytest
from assertions import assert_invariants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_dpsched import CostModel, ScheduleConfig
from megatron_dpsched.baselines import BASELINES, CAP_BREAKING, build_baseline_schedule, cap_violations
from megatron_dpsched.core.cost import sample_costs
from megatron_dpsched.core.invariants import ScheduleInvariantError

CASES = settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def plans(draw):
    cap = draw(st.integers(1, 4096))
    heavy = st.floats(0, math.log(cap * 4 + 1)).map(lambda x: max(1, int(math.exp(x))))
    element = draw(st.sampled_from([st.integers(1, cap), heavy, st.integers(1, 8)]))
    lengths = draw(st.lists(element, min_size=1, max_size=120))
    pp = draw(st.integers(1, 4))
    vpp = draw(st.sampled_from([1, 2, 3])) if pp > 1 else 1
    group = draw(st.one_of(st.none(), st.integers(pp, pp + 4))) if vpp > 1 else None
    config = ScheduleConfig(
        dp_size=draw(st.integers(1, 9)), global_batch_size=draw(st.integers(1, 40)), max_tokens_per_gpu=cap,
        cp_size=draw(st.sampled_from([1, 1, 2])), pp_size=pp, vpp_size=vpp,
        microbatch_group_size_per_vp_stage=group, drop_last=draw(st.booleans()) and len(lengths) >= 40,
    )
    return lengths, config


def assert_scheduled_once_in_legal_counts(schedule, lengths):
    config = schedule.config
    owned = sorted(i for part in schedule.partitions for i in part)
    assert sorted(owned + list(schedule.dropped)) == list(range(len(lengths)))
    for part, batches in zip(schedule.partitions, schedule.micro_batch_indices):
        assert [p for mb in batches for p in mb] == list(range(len(part)))
    for step, count in enumerate(schedule.num_microbatches):
        assert config.layout.is_legal(count)
        assert all(len(schedule.rank_step_micro_batches(r, step)) == count for r in range(config.dp_size))


@pytest.mark.slow
@CASES
@given(sample=plans(), use_costs=st.booleans())
def test_every_baseline_schedules_every_sample_once_in_legal_counts(sample, use_costs):
    lengths, config = sample
    model = CostModel(hidden_size=64, num_layers=2, num_attention_heads=4)
    costs = sample_costs(lengths, model) if use_costs else None
    for name in BASELINES:
        schedule = build_baseline_schedule(name, lengths, config=config, costs=costs)
        assert_scheduled_once_in_legal_counts(schedule, lengths)
        if name not in CAP_BREAKING:
            assert cap_violations(schedule) == 0
            assert_invariants(schedule, lengths, baseline=True)
        elif cap_violations(schedule):
            try:
                schedule.check()
            except ScheduleInvariantError as error:
                assert str(error).startswith("invariant 2"), error
            else:
                raise AssertionError("check() passed a plan over the cap")
        else:
            assert_invariants(schedule, lengths, baseline=True)
