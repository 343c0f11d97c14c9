"""The contract of Megatron-LM's ``get_groups_and_subsamples``, answered by this planner (no torch, no Megatron).

Random steps: every sample once, the cap kept, the count legal for the pipeline (VPP group), the
context-parallel ranks of one data-parallel rank holding one pack, and no error wherever Megatron's own
``DpBalancedScheduler`` finds an answer (its rule, next fit in arrival order then splitting trailing packs,
is restated below as a feasibility count only).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_dpsched.compat.megatron_packing import (
    PackingError,
    PackingLayout,
    check_sample_id_groups,
    plan_packing_step,
    sample_id_groups,
)


@st.composite
def steps(draw: st.DrawFn) -> tuple[list[tuple[int, int]], PackingLayout]:
    cap = draw(st.integers(16, 4096))
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    element = draw(st.sampled_from([st.integers(1, cap * cp), st.integers(1, cap // 4 + 1),
                                    st.integers(1, 2 * cap * cp)]))
    lengths = draw(st.lists(element, min_size=1, max_size=120))
    group = draw(st.sampled_from([None, None, 2, 4]))
    pp = draw(st.sampled_from([None, 2])) if group else draw(st.sampled_from([None, 1, 4]))
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=cap, dp_size=draw(st.integers(1, 8)), cp_size=cp,
                           microbatch_group_size_per_vp_stage=group, pp_size=pp)
    return [(gid, length) for gid, length in enumerate(lengths)], layout


def megatron_finds_answer(sample_id_seqlens: list[tuple[int, int]], layout: PackingLayout) -> bool:
    """Whether ``DpBalancedScheduler`` answers without its "Not enough samples to move" assert."""
    cap = layout.max_seqlen_per_dp_cp_rank * layout.cp_size
    packs: list[int] = []  # sample count per pack, next fit in arrival order
    filled = cap + 1
    for _, length in sample_id_seqlens:
        if packs and filled + length <= cap:
            packs[-1] += 1
            filled += length
        else:
            packs.append(1)
            filled = length
    multiple = layout.dp_size * (layout.microbatch_group_size_per_vp_stage or 1)
    needed = -len(packs) % multiple
    return needed <= sum(count - 1 for count in packs[1:])  # it never splits the first pack


@pytest.mark.slow
@given(steps())
def test_answer_keeps_megatrons_rules(step: tuple[list[tuple[int, int]], PackingLayout]) -> None:
    sample_id_seqlens, layout = step
    try:
        groups = sample_id_groups(sample_id_seqlens, layout=layout)
    except PackingError:
        assert not megatron_finds_answer(sample_id_seqlens, layout), "Megatron answers this step, the plan raised"
        return
    check_sample_id_groups(groups, sample_id_seqlens, layout=layout)  # sample_id_groups checks it too
    placed = [gid for ranks in groups for rank in ranks[:: layout.cp_size] for gid in rank]
    assert sorted(placed) == [gid for gid, _ in sample_id_seqlens]
    cap = layout.max_seqlen_per_dp_cp_rank * layout.cp_size
    lengths = dict(sample_id_seqlens)
    for ranks in groups:
        assert len(ranks) == layout.dp_size * layout.cp_size
        for rank in ranks:
            assert rank and (len(rank) == 1 or sum(lengths[gid] for gid in rank) <= cap)
    group = layout.microbatch_group_size_per_vp_stage
    if group is not None and layout.pp_size is None:
        assert len(groups) % group == 0  # pipeline size unknown: a multiple of G, as DpBalancedScheduler


def test_global_ids_are_kept_and_cp_ranks_share_a_pack() -> None:
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=100, dp_size=2, cp_size=2)
    sample_id_seqlens = [(10 + i, length) for i, length in enumerate([90, 80, 60, 50, 40, 30, 20, 10])]
    groups = sample_id_groups(sample_id_seqlens, layout=layout)
    assert sorted(gid for ranks in groups for rank in ranks[::2] for gid in rank) == list(range(10, 18))
    assert all(ranks[0] == ranks[1] and ranks[2] == ranks[3] for ranks in groups)


def test_same_plan_as_the_planner() -> None:
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=64, dp_size=2)
    sample_id_seqlens = list(enumerate([60, 5, 33, 31, 17, 64, 2, 40]))
    schedule = plan_packing_step(sample_id_seqlens, layout=layout)
    groups = sample_id_groups(sample_id_seqlens, layout=layout)
    assert [[list(schedule.rank_step_micro_batches(r, 0)[mb]) for r in range(2)] for mb in range(len(groups))] \
        == groups


def test_no_answer_names_the_numbers() -> None:
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=100, dp_size=2)
    with pytest.raises(PackingError, match="3 samples cannot fill 2 data-parallel ranks x 2 micro-batches"):
        sample_id_groups([(0, 90), (1, 90), (2, 90)], layout=layout)


@pytest.mark.parametrize(("groups", "message"), [
    ([[[0], [1]]], "not each of the 3 samples once"),
    ([[[0, 1], [2]]], "over the cap"),
    ([[[0], [1, 2]], [[], [2]]], "empty pack"),
    ([[[0], [1], [2]]], "has 3 packs"),
    ([[[0], [1, 7]]], "an id not in the step"),
])
def test_check_refuses_broken_answers(groups: list[list[list[int]]], message: str) -> None:
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=100, dp_size=2)
    with pytest.raises(PackingError, match=message):
        check_sample_id_groups(groups, [(0, 90), (1, 50), (2, 40)], layout=layout)


def test_check_refuses_cp_ranks_with_different_packs_and_illegal_counts() -> None:
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=100, dp_size=1, cp_size=2)
    with pytest.raises(PackingError, match="different packs"):
        check_sample_id_groups([[[0], [1]], [[1], [0]]], [(0, 10), (1, 10)], layout=layout)
    vpp = PackingLayout(max_seqlen_per_dp_cp_rank=100, dp_size=1, microbatch_group_size_per_vp_stage=2)
    with pytest.raises(PackingError, match="3 micro-batches is not a count"):
        check_sample_id_groups([[[0]], [[1]], [[2]]], [(0, 10), (1, 10), (2, 10)], layout=vpp)
