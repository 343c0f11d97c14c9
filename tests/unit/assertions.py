"""One shared invariant assertion for every scenario.

``assert_invariants`` runs the planner's own checker and then re-derives each
numbered invariant of the spec from the raw inputs, so a bug in the checker
cannot hide a bug in the planner.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from megatron_dpsched import DPSchedule


def legal(count: int, *, pp: int, vpp: int, group: int) -> bool:
    """Megatron's interleaved rule, restated."""
    if vpp == 1:
        return count >= 1
    return pp <= group <= count and (count % group == 0 or count % group >= pp)


def collated_tokens(micro_batch: Sequence[int], lengths: Sequence[int], *, pad_multiple: int, padded_rows: bool) -> int:
    """What collate makes of a micro-batch, restated: each length rounded up to ``pad_multiple``; packed, their
    sum; padded rows, the row count times the longest."""
    padded = [(lengths[i] + pad_multiple - 1) // pad_multiple * pad_multiple for i in micro_batch]
    if not padded:
        return 0
    return len(padded) * max(padded) if padded_rows else sum(padded)


def assert_invariants(
    schedule: DPSchedule,
    lengths: Sequence[int],
    *,
    groups: Sequence[Hashable] | None = None,
    baseline: bool = False,
) -> None:
    """``baseline``: a comparison plan, which keeps invariants 1-6 but not the planner's packing rules."""
    schedule.check()
    config = schedule.config
    dp, total = config.dp_size, sum(schedule.num_microbatches)
    assert list(schedule.lengths) == list(lengths)
    # 1. lock-step
    assert all(len(batches) == total for batches in schedule.micro_batch_indices)
    # 3. coverage
    owned = [i for part in schedule.partitions for i in part]
    assert len(owned) == len(set(owned))
    assert sorted(owned + list(schedule.dropped)) == list(range(len(lengths)))
    for part, batches in zip(schedule.partitions, schedule.micro_batch_indices):
        assert [p for mb in batches for p in mb] == list(range(len(part)))
    group_size = config.microbatch_group_size_per_vp_stage or config.pp_size
    step_of: dict[int, int] = {}
    for step in range(schedule.num_steps):
        # 4. legal count
        assert legal(schedule.num_microbatches[step], pp=config.pp_size, vpp=config.vpp_size, group=group_size)
        for rank in range(dp):
            batches = schedule.rank_step_micro_batches(rank, step)
            assert len(batches) == schedule.num_microbatches[step]
            # spec step 4: empty micro-batches only on a rank with fewer samples than micro-batches
            if not baseline and sum(len(mb) for mb in batches) >= len(batches):
                assert all(batches), f"rank {rank} step {step}: an empty micro-batch beside splittable ones"
            for mb in batches:
                # 2. caps
                if config.max_tokens_per_gpu is not None and len(mb) > 1:
                    tokens = collated_tokens(mb, lengths, pad_multiple=config.pad_multiple,
                                             padded_rows=config.padded_rows)
                    assert tokens <= config.max_tokens_per_gpu * config.cp_size
                if config.micro_batch_size is not None:
                    assert len(mb) <= config.micro_batch_size
                for i in mb:
                    step_of[i] = step
    # 5. steps and groups
    units = list(range(len(lengths))) if groups is None else _first_appearance(groups)
    for step in range(schedule.num_steps):
        members = [i for i, s in step_of.items() if s == step]
        assert len(members) == schedule.step_num_samples[step]
        step_units = sorted({units[i] for i in members})
        expected_start = step * config.global_batch_size
        assert step_units == list(range(expected_start, expected_start + len(step_units)))
        if step < schedule.num_steps - 1:
            assert len(step_units) == config.global_batch_size
    if groups is not None:
        by_group: dict[Hashable, set[int]] = {}
        for i, g in enumerate(groups):
            by_group.setdefault(g, set()).add(step_of.get(i, -1))
        assert all(len(steps) == 1 for steps in by_group.values())
    if schedule.dropped:
        assert config.drop_last
        n_units = max(units) + 1
        assert len({units[i] for i in schedule.dropped}) == n_units % config.global_batch_size
    # minimality: never below the aligned lower bound; no plan beats the capacity bound
    for stats in schedule.stats():
        assert stats.num_microbatches >= stats.lower_bound
        assert stats.token_imbalance >= stats.capacity_bound * (1 - 1e-9)
        if config.step_time_model is not None:  # 4. step 7 never runs more than max(M, align(n))
            most = max(sum(len(mb) for mb in schedule.rank_step_micro_batches(r, stats.step)) for r in range(dp))
            aligned = next(c for c in range(most, most + 2 * group_size + 2)
                           if legal(c, pp=config.pp_size, vpp=config.vpp_size, group=group_size))
            assert stats.num_microbatches <= max(stats.lower_bound, aligned)


def _first_appearance(groups: Sequence[Hashable]) -> list[int]:
    order: dict[Hashable, int] = {}
    return [order.setdefault(g, len(order)) for g in groups]
