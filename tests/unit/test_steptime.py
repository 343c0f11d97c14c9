"""The step-time model: hand-computed timelines, Megatron's orders, properties and bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_dpsched.core import (
    CostModel,
    PipelineLayout,
    StepEvent,
    StepTimeModel,
    rank_forward_times,
    simulate_rank,
    simulate_step,
    stage_op_order,
)

UNIT = StepTimeModel(seconds_per_token=1.0)  # backward_factor 2: every backward is twice its forward


def layout(pp: int = 1, vpp: int = 1, group: int | None = None) -> PipelineLayout:
    return PipelineLayout(pp_size=pp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group)


def bars(timeline) -> list[list[tuple[str, float, float]]]:
    """Per stage: ``("F0", start, end)``, with ``".c"`` appended for chunk c when interleaved."""
    out = []
    for stage_events in timeline.events:
        row = []
        for e in stage_events:
            name = f"{e.kind}{e.microbatch}" + (f".{e.chunk}" if len({x.chunk for x in stage_events}) > 1 else "")
            row.append((name, e.start, e.end))
        out.append(row)
    return out


# ---------------------------------------------------------------- the model (rule 1)


def test_forward_time_is_linear_plus_quadratic_per_sample_plus_overhead():
    model = StepTimeModel(seconds_per_token=0.5, seconds_per_token_pair=0.01, seconds_per_microbatch=3.0)
    # two samples packed separately: 0.5 * (10 + 20) + 0.01 * (100 + 400) + 3
    assert model.forward_time([10, 20]) == pytest.approx(15 + 5 + 3)
    assert model.forward_time([30]) == pytest.approx(15 + 9 + 3)  # one 30-token sample: dearer attention
    assert model.backward_time([10, 20]) == pytest.approx(2 * 23)
    assert model.forward_time([]) == pytest.approx(0.5 + 0.01 + 3.0)  # a dummy: one one-token sample
    assert model.forward_time(()) == model.forward_time([1])


def test_from_cost_model_divides_forward_flops_by_throughput():
    cost = CostModel(hidden_size=64, num_layers=2, num_attention_heads=4, vocab_size=100)
    model = StepTimeModel.from_cost_model(cost, flops_per_second=1e9, seconds_per_microbatch=1e-3)
    assert model.backward_factor == 2.0
    for lengths in ([100], [100, 50, 7]):
        forward_flops = sum(cost(length) for length in lengths) / 3  # CostModel counts forward + backward
        assert model.forward_time(lengths) == pytest.approx(forward_flops / 1e9 + 1e-3, rel=1e-12)
    assert model.seconds_per_token == pytest.approx(cost.linear_flops_per_token / 1e9)
    assert model.seconds_per_token_pair == pytest.approx(cost.quadratic_flops_per_token_pair / 1e9)


def test_rank_forward_times_lists_each_micro_batch():
    model = StepTimeModel(seconds_per_token=1.0, seconds_per_token_pair=0.5, seconds_per_microbatch=2.0)
    assert rank_forward_times([[2], [1, 1], []], model=model) == [2 + 2 + 2, 2 + 1 + 2, 1 + 0.5 + 2]


# ---------------------------------------------------------------- hand-computed timelines (f = forward share)


def test_pp1_runs_forward_then_backward_of_each_micro_batch():
    timeline = simulate_rank([1.0, 2.0, 3.0], layout=layout(), model=UNIT)
    assert bars(timeline) == [[("F0", 0, 1), ("B0", 1, 3), ("F1", 3, 5), ("B1", 5, 9), ("F2", 9, 12), ("B2", 12, 18)]]
    assert timeline.makespan == 18.0 == 3 * (1 + 2 + 3)
    assert timeline.busy_times == (18.0,)
    assert timeline.bubble_fraction == 0.0


def test_pp2_one_micro_batch():
    timeline = simulate_rank([2.0], layout=layout(pp=2), model=UNIT)  # share: F 1, B 2 per stage
    assert bars(timeline) == [[("F0", 0, 1), ("B0", 4, 6)],
                              [("F0", 1, 2), ("B0", 2, 4)]]
    assert timeline.makespan == 6.0
    assert timeline.busy_times == (3.0, 3.0)
    assert timeline.bubble_fraction == pytest.approx(0.5)


def test_pp2_two_micro_batches():
    timeline = simulate_rank([2.0, 2.0], layout=layout(pp=2), model=UNIT)
    # stage 0: one warm-up forward, then F1 B0, then the cool-down B1; stage 1: F0 B0 F1 B1
    assert bars(timeline) == [[("F0", 0, 1), ("F1", 1, 2), ("B0", 4, 6), ("B1", 7, 9)],
                              [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 5), ("B1", 5, 7)]]
    assert timeline.makespan == 9.0  # (M + PP - 1) * (f + b)


def test_pp2_four_micro_batches():
    timeline = simulate_rank([2.0] * 4, layout=layout(pp=2), model=UNIT)
    assert bars(timeline) == [
        [("F0", 0, 1), ("F1", 1, 2), ("B0", 4, 6), ("F2", 6, 7), ("B1", 7, 9), ("F3", 9, 10), ("B2", 10, 12),
         ("B3", 13, 15)],
        [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 5), ("B1", 5, 7), ("F2", 7, 8), ("B2", 8, 10), ("F3", 10, 11),
         ("B3", 11, 13)],
    ]
    assert timeline.makespan == 15.0
    assert timeline.busy_times == (12.0, 12.0)


def test_pp2_unequal_micro_batches():
    timeline = simulate_rank([2.0, 4.0], layout=layout(pp=2), model=UNIT)  # F shares 1 and 2
    assert bars(timeline) == [[("F0", 0, 1), ("F1", 1, 3), ("B0", 4, 6), ("B1", 10, 14)],
                              [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 6), ("B1", 6, 10)]]
    assert timeline.makespan == 14.0
    assert timeline.busy_times == (9.0, 9.0)


def test_pp2_the_dearest_micro_batch_costs_least_in_the_middle():
    # F shares (1, 1, 3) / (3, 1, 1) / (1, 3, 1), B twice that; every stage is busy 15 s in all three
    last = simulate_rank([2.0, 2.0, 6.0], layout=layout(pp=2), model=UNIT)
    first = simulate_rank([6.0, 2.0, 2.0], layout=layout(pp=2), model=UNIT)
    middle = simulate_rank([2.0, 6.0, 2.0], layout=layout(pp=2), model=UNIT)
    assert bars(last)[0] == [("F0", 0, 1), ("F1", 1, 2), ("B0", 4, 6), ("F2", 6, 9), ("B1", 9, 11), ("B2", 18, 24)]
    assert bars(middle) == [[("F0", 0, 1), ("F1", 1, 4), ("B0", 4, 6), ("F2", 6, 7), ("B1", 13, 19), ("B2", 19, 21)],
                            [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 7), ("B1", 7, 13), ("F2", 13, 14),
                             ("B2", 14, 16)]]
    assert (last.makespan, first.makespan, middle.makespan) == (24.0, 24.0, 21.0)
    assert last.busy_times == first.busy_times == middle.busy_times == (15.0, 15.0)


def test_pp4_one_micro_batch_walks_down_and_back_up():
    timeline = simulate_rank([4.0], layout=layout(pp=4), model=UNIT)  # share: F 1, B 2
    assert bars(timeline) == [[("F0", 0, 1), ("B0", 10, 12)],
                              [("F0", 1, 2), ("B0", 8, 10)],
                              [("F0", 2, 3), ("B0", 6, 8)],
                              [("F0", 3, 4), ("B0", 4, 6)]]
    assert timeline.makespan == 12.0 == 4 * (1 + 2)


def test_pp2_vpp2_two_micro_batches():
    # chunk c of stage s is virtual stage 2c + s; share per (stage, chunk): F 1, B 2
    timeline = simulate_rank([4.0, 4.0], layout=layout(pp=2, vpp=2), model=UNIT)
    assert bars(timeline) == [
        # warm-up 2 * 1 + 1 * 2 = 4 = all forwards; backwards run chunk 1 first
        [("F0.0", 0, 1), ("F1.0", 1, 2), ("F0.1", 2, 3), ("F1.1", 3, 4),
         ("B0.1", 6, 8), ("B1.1", 9, 11), ("B0.0", 11, 13), ("B1.0", 13, 15)],
        # warm-up 2, then F0.1 B0.1, F1.1 B1.1, then the cool-down
        [("F0.0", 1, 2), ("F1.0", 2, 3), ("F0.1", 3, 4), ("B0.1", 4, 6),
         ("F1.1", 6, 7), ("B1.1", 7, 9), ("B0.0", 9, 11), ("B1.0", 11, 13)],
    ]
    assert timeline.makespan == 15.0
    assert timeline.busy_times == (12.0, 12.0)
    plain = simulate_rank([4.0, 4.0], layout=layout(pp=2), model=UNIT)
    assert plain.makespan == 18.0  # same work without interleaving: (2 + 1) * (2 + 4)


def test_p2p_latency_delays_every_hop():
    timeline = simulate_rank([4.0], layout=layout(pp=4), model=UNIT, p2p_latency=0.5)
    assert [e.start for e in timeline.events[3]] == [4.5, 5.5]  # F after 3 hops; B right after F on the last stage
    assert timeline.makespan == pytest.approx(12.0 + 6 * 0.5)


def test_events_name_their_fields():
    event = simulate_rank([2.0, 2.0], layout=layout(pp=2), model=UNIT).events[0][2]
    assert event == StepEvent(stage=0, chunk=0, microbatch=0, kind="B", start=4.0, end=6.0)


def test_simulate_step_waits_for_the_slowest_rank():
    ranks = [[2.0, 2.0, 6.0], [2.0, 6.0, 2.0], [2.0, 2.0, 2.0]]
    step = simulate_step(ranks, layout=layout(pp=2), model=UNIT)
    assert step.rank_seconds == (24.0, 21.0, 12.0)  # (3 + 1) * (1 + 2) for the third
    assert step.seconds == 24.0
    assert step.slowest_rank == 0
    assert step.rank_busy_seconds == (15.0, 15.0, 9.0)


# ---------------------------------------------------------------- Megatron's order (rule 5), written out


def test_interleaved_order_with_a_short_last_group():
    ops = {s: [f"{k}{m}.{c}" for k, m, c in stage_op_order(layout(2, 2, 3), num_microbatches=5, stage=s)]
           for s in (0, 1)}
    # table (mb, chunk): (0,0) (1,0) (2,0) (0,1) (1,1) (2,1) (3,0) (4,0) (3,1) (4,1)
    assert ops[0] == ["F0.0", "F1.0", "F2.0", "F0.1", "F1.1",  # warm-up 2 * 1 + 1 * 3
                      "F2.1", "B0.1", "F3.0", "B1.1", "F4.0", "B2.1", "F3.1", "B0.0", "F4.1", "B1.0",
                      "B2.0", "B3.1", "B4.1", "B3.0", "B4.0"]
    assert ops[1] == ["F0.0", "F1.0", "F2.0",  # warm-up 1 * 3
                      "F0.1", "B0.1", "F1.1", "B1.1", "F2.1", "B2.1", "F3.0", "B0.0", "F4.0", "B1.0",
                      "F3.1", "B2.0", "F4.1", "B3.1",
                      "B4.1", "B3.0", "B4.0"]


def test_non_interleaved_order_caps_the_warm_up_at_the_micro_batch_count():
    order = [f"{k}{m}" for k, m, _ in stage_op_order(layout(4), num_microbatches=2, stage=0)]
    assert order == ["F0", "F1", "B0", "B1"]
    order = [f"{k}{m}" for k, m, _ in stage_op_order(layout(4), num_microbatches=5, stage=1)]
    assert order == ["F0", "F1", "F2", "B0", "F3", "B1", "F4", "B2", "B3", "B4"]


def test_interleaved_warm_up_can_take_every_forward():
    order = stage_op_order(layout(4, 2), num_microbatches=4, stage=0)  # warm-up 2 * 3 + 1 * 4 = 10 > 8
    assert [k for k, _, _ in order] == ["F"] * 8 + ["B"] * 8


# ---------------------------------------------------------------- properties


@st.composite
def rank_steps(draw, *, max_microbatches: int = 16):
    pp = draw(st.integers(1, 4))
    vpp = draw(st.sampled_from([1, 2, 3])) if pp > 1 else 1
    group = draw(st.one_of(st.none(), st.integers(pp, pp + 3))) if vpp > 1 else None
    shape = layout(pp, vpp, group)
    count = shape.align(draw(st.integers(1, max_microbatches)))
    times = draw(st.lists(st.floats(0, 10, allow_subnormal=False), min_size=count, max_size=count))
    model = StepTimeModel(seconds_per_token=1.0, backward_factor=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])))
    latency = draw(st.sampled_from([0.0, 0.0, 0.25]))
    return shape, times, model, latency


def _dependency(event: StepEvent, *, pp: int, vpp: int) -> tuple[str, int, int] | None:
    """Rule 3 as (kind, micro-batch, virtual stage) of the op ``event`` waits for."""
    virtual, last = event.chunk * pp + event.stage, pp * vpp - 1
    if event.kind == "F":
        return None if virtual == 0 else ("F", event.microbatch, virtual - 1)
    if virtual == last:
        return ("F", event.microbatch, virtual)
    return ("B", event.microbatch, virtual + 1)


@pytest.mark.slow
@given(rank_steps())
def test_every_stage_runs_megatrons_order_one_op_at_a_time_respecting_dependencies(case):
    shape, times, model, latency = case
    timeline = simulate_rank(times, layout=shape, model=model, p2p_latency=latency)
    pp, vpp, share = shape.pp_size, shape.vpp_size, 1 / (shape.pp_size * shape.vpp_size)
    ends = {(e.kind, e.microbatch, e.chunk * pp + e.stage): e.end for row in timeline.events for e in row}
    assert len(ends) == 2 * len(times) * pp * vpp
    for stage, row in enumerate(timeline.events):
        assert [(e.kind, e.microbatch, e.chunk) for e in row] == list(
            stage_op_order(shape, num_microbatches=len(times), stage=stage))
        assert all(e.stage == stage and e.start >= 0 for e in row)
        assert all(a.end <= b.start for a, b in zip(row, row[1:]))  # never two ops at once
        for index, e in enumerate(row):
            factor = 1.0 if e.kind == "F" else model.backward_factor
            assert math.isclose(e.end - e.start, factor * times[e.microbatch] * share, rel_tol=1e-9, abs_tol=1e-9)
            dependency = _dependency(e, pp=pp, vpp=vpp)
            ready = 0.0
            if dependency is not None:
                hop = latency if dependency[2] != e.chunk * pp + e.stage else 0.0
                ready = ends[dependency] + hop
                assert ready <= e.start
            assert e.start == max(row[index - 1].end if index else 0.0, ready)  # as soon as possible
    assert timeline.makespan == max(e.end for row in timeline.events for e in row)


@pytest.mark.slow
@given(rank_steps())
def test_makespan_bounds(case):
    shape, times, model, latency = case
    timeline = simulate_rank(times, layout=shape, model=model, p2p_latency=latency)
    for busy, row in zip(timeline.busy_times, timeline.events):
        assert busy == pytest.approx(sum(e.end - e.start for e in row), abs=1e-9)
        assert timeline.makespan >= busy
        assert busy == pytest.approx((1 + model.backward_factor) * sum(times) / shape.pp_size, abs=1e-9)
    hops = 2 * (shape.pp_size * shape.vpp_size - 1)
    for forward in times:  # one micro-batch's chain: every virtual stage forward, then back
        assert timeline.makespan >= (1 + model.backward_factor) * forward + hops * latency - 1e-9
    assert 0.0 <= timeline.bubble_fraction <= 1.0
    if timeline.busy_time > 1e-9 * timeline.makespan:  # all idle only when ops take (next to) no time
        assert timeline.bubble_fraction < 1.0


@pytest.mark.slow
@given(rank_steps(), st.integers(0, 10**6))
def test_longer_ops_never_shorten_a_step(case, seed):
    shape, times, model, latency = case
    base = simulate_rank(times, layout=shape, model=model, p2p_latency=latency).makespan
    slower = list(times)
    slower[seed % len(times)] += 1.0 + seed % 7
    assert simulate_rank(slower, layout=shape, model=model, p2p_latency=latency).makespan >= base
    assert simulate_rank(times, layout=shape, model=model, p2p_latency=latency + 0.5).makespan >= base


@pytest.mark.slow
@given(st.data(), rank_steps(max_microbatches=12))
def test_more_overhead_never_shortens_a_step(data, case):
    shape, times, _, latency = case
    lengths = [data.draw(st.lists(st.integers(1, 500), max_size=4)) for _ in times]
    cheap = StepTimeModel(seconds_per_token=1e-3, seconds_per_token_pair=1e-6, seconds_per_microbatch=0.1)
    dear = StepTimeModel(seconds_per_token=1e-3, seconds_per_token_pair=1e-6, seconds_per_microbatch=0.3)
    ranks = [rank_forward_times(lengths, model=m) for m in (cheap, dear)]
    cheap_time = simulate_step([ranks[0]], layout=shape, model=cheap, p2p_latency=latency).seconds
    dear_time = simulate_step([ranks[1]], layout=shape, model=dear, p2p_latency=latency).seconds
    # the critical path starts with a forward and ends with a backward on virtual stage 0: both got dearer
    assert dear_time >= cheap_time + (0.2 + 0.2 * 2) / (shape.pp_size * shape.vpp_size) - 1e-9


@pytest.mark.slow
@given(st.lists(st.floats(0, 10, allow_subnormal=False), min_size=1, max_size=30),
       st.sampled_from([0.5, 1.0, 2.0, 3.0]))
def test_pp1_makespan_is_the_sum_of_forward_and_backward(times, factor):
    model = StepTimeModel(seconds_per_token=1.0, backward_factor=factor)
    timeline = simulate_rank(times, layout=layout(), model=model, p2p_latency=0.7)  # no hop with one stage
    assert timeline.makespan == pytest.approx(sum((1 + factor) * t for t in times), abs=1e-9)
    assert timeline.bubble_fraction == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
@given(rank_steps(), st.floats(0.1, 10))
def test_equal_micro_batches_pay_the_textbook_bubble(case, forward):
    shape, times, model, _ = case
    pp, chunks, count = shape.pp_size, shape.vpp_size, len(times)
    timeline = simulate_rank([forward] * count, layout=shape, model=model)
    per_op = (1 + model.backward_factor) * forward / (pp * chunks)  # one (stage, chunk)'s F + B
    assert timeline.makespan == pytest.approx((count * chunks + pp - 1) * per_op, rel=1e-9)


@pytest.mark.slow
@given(st.data(), rank_steps(max_microbatches=12))
def test_simulate_step_is_the_slowest_rank(data, case):
    shape, times, model, latency = case
    others = [data.draw(st.lists(st.floats(0, 10, allow_subnormal=False), min_size=len(times), max_size=len(times)))
              for _ in range(data.draw(st.integers(0, 3)))]
    ranks = [times, *others]
    step = simulate_step(ranks, layout=shape, model=model, p2p_latency=latency)
    timelines = [simulate_rank(r, layout=shape, model=model, p2p_latency=latency) for r in ranks]
    assert step.rank_seconds == tuple(t.makespan for t in timelines)
    assert step.rank_busy_seconds == tuple(t.busy_time for t in timelines)
    assert step.seconds == max(step.rank_seconds) == step.rank_seconds[step.slowest_rank]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seconds_per_token": -1.0}, "seconds_per_token"),
        ({"seconds_per_token": math.nan}, "seconds_per_token"),
        ({"seconds_per_token": math.inf}, "seconds_per_token"),
        ({"seconds_per_token": "1"}, "seconds_per_token"),
        ({"seconds_per_token": True}, "seconds_per_token"),
        ({"seconds_per_token": 1.0, "seconds_per_token_pair": -1e-9}, "seconds_per_token_pair"),
        ({"seconds_per_token": 1.0, "seconds_per_token_pair": math.nan}, "seconds_per_token_pair"),
        ({"seconds_per_token": 1.0, "seconds_per_microbatch": -0.5}, "seconds_per_microbatch"),
        ({"seconds_per_token": 1.0, "seconds_per_microbatch": math.nan}, "seconds_per_microbatch"),
        ({"seconds_per_token": 1.0, "backward_factor": 0.0}, "backward_factor"),
        ({"seconds_per_token": 1.0, "backward_factor": -2.0}, "backward_factor"),
        ({"seconds_per_token": 1.0, "backward_factor": math.nan}, "backward_factor"),
    ],
)
def test_bad_coefficients(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepTimeModel(**kwargs)


def test_bad_cost_model_arguments():
    cost = CostModel(hidden_size=64, num_layers=2, num_attention_heads=4)
    with pytest.raises(ValueError, match="flops_per_second"):
        StepTimeModel.from_cost_model(cost, flops_per_second=0.0)
    with pytest.raises(ValueError, match="flops_per_second"):
        StepTimeModel.from_cost_model(cost, flops_per_second=math.nan)
    with pytest.raises(ValueError, match="seconds_per_microbatch"):
        StepTimeModel.from_cost_model(cost, flops_per_second=1e9, seconds_per_microbatch=-1.0)
    with pytest.raises(ValueError, match="cost_model"):
        StepTimeModel.from_cost_model(len, flops_per_second=1e9)


@pytest.mark.parametrize(
    ("lengths", "match"), [([3, 0], r"lengths\[1\]"), ([2.5], r"lengths\[0\]"), (None, "lengths must be a sequence")]
)
def test_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        UNIT.forward_time(lengths)


def test_bad_micro_batch_lengths_name_the_micro_batch():
    with pytest.raises(ValueError, match=r"micro_batch_lengths\[1\]: lengths\[0\]"):
        rank_forward_times([[1], [-4]], model=UNIT)
    with pytest.raises(ValueError, match="model"):
        rank_forward_times([[1]], model=CostModel(hidden_size=8, num_layers=1, num_attention_heads=1))


@pytest.mark.parametrize(
    ("times", "shape", "match"),
    [
        ([], layout(), "forward_times is empty"),
        ([1.0, -1.0], layout(), r"forward_times\[1\]"),
        ([1.0, math.nan], layout(pp=2), r"forward_times\[1\]"),
        ([1.0, math.inf], layout(pp=2), r"forward_times\[1\]"),
        ([1.0, "2"], layout(), r"forward_times\[1\]"),
        (None, layout(), "forward_times must be a sequence"),
        ([1.0] * 5, layout(pp=4, vpp=2), r"len\(forward_times\)=5 .* next legal count is 8"),
        ([1.0] * 3, layout(pp=2, vpp=2), r"len\(forward_times\)=3"),  # fewer than the group
        ([1.0] * 7, layout(pp=2, vpp=2, group=3), r"len\(forward_times\)=7"),  # 7 % 3 = 1 < pp
        ([1.0] * 4, layout(pp=1, vpp=2), "vpp_size"),
        ([1.0] * 4, layout(pp=4, vpp=2, group=2), "microbatch_group_size_per_vp_stage"),
    ],
)
def test_bad_forward_times_and_layouts(times, shape, match):
    with pytest.raises(ValueError, match=match):
        simulate_rank(times, layout=shape, model=UNIT)
    with pytest.raises(ValueError, match=match.replace("forward_times", r"per_rank_forward_times\[0\]")):
        simulate_step([times], layout=shape, model=UNIT)


def test_bad_simulation_arguments():
    with pytest.raises(ValueError, match="per_rank_forward_times is empty"):
        simulate_step([], layout=layout(), model=UNIT)
    with pytest.raises(ValueError, match=r"per_rank_forward_times: every rank .* \[2, 3\]"):
        simulate_step([[1.0, 1.0], [1.0, 1.0, 1.0]], layout=layout(pp=2), model=UNIT)
    with pytest.raises(ValueError, match="p2p_latency"):
        simulate_rank([1.0], layout=layout(), model=UNIT, p2p_latency=-1.0)
    with pytest.raises(ValueError, match="p2p_latency"):
        simulate_step([[1.0]], layout=layout(), model=UNIT, p2p_latency=math.nan)
    with pytest.raises(ValueError, match="layout"):
        simulate_rank([1.0], layout={"pp_size": 2}, model=UNIT)
    with pytest.raises(ValueError, match="model"):
        simulate_rank([1.0], layout=layout(), model=None)
    with pytest.raises(ValueError, match="num_microbatches"):
        stage_op_order(layout(2, 2), num_microbatches=3, stage=0)
    with pytest.raises(ValueError, match="num_microbatches"):
        stage_op_order(layout(2), num_microbatches=0, stage=0)
    with pytest.raises(ValueError, match="stage"):
        stage_op_order(layout(2), num_microbatches=4, stage=2)
