"""Megatron-LM's packing-scheduler contract (``BasePackingScheduler.get_groups_and_subsamples``), backed by this
planner; no torch, no Megatron.

Contract source: NVIDIA/Megatron-LM ``main`` at ``d98e8a6``, ``megatron/core/datasets/data_schedule.py``
(``BasePackingScheduler``, ``DpBalancedScheduler``, ``wrap_data_iterator``) and its ``readme.md``
("Packing Scheduler"). Only the contract was taken from there; the planning is :func:`plan_schedule`.
The Megatron-facing class (which inherits Megatron's own ``run``) is
:class:`megatron_dpsched.megatron.packing_scheduler.DPScheduleScheduler`.

Megatron calls ``get_groups_and_subsamples(sample_id_seqlens)`` once per optimizer step on every rank with
the same argument: ``[(global_id, padded_seq_len), ...]`` for every sample of the global batch, ordered by
data-parallel rank, then local index. It expects, per micro-batch, per DP x CP rank of the data-parallel
group with context parallelism (rank ``d * cp_size + c``), the list of global ids that rank packs:

* every global id exactly once (Megatron's ``run`` asserts it);
* the ``cp_size`` context-parallel ranks of one data-parallel rank hold the same pack (Megatron's
  ``get_batch_on_this_rank_for_sequence_packing`` splits that pack between them);
* every pack non-empty, and at most ``max_seqlen_per_dp_cp_rank * cp_size`` padded tokens unless it is a
  single sample (which alone may exceed it, as in ``DpBalancedScheduler``);
* the number of micro-batches legal for the pipeline schedule: with virtual stages (``microbatch_group_
  size_per_vp_stage`` given) Megatron's interleaved rule (``pp <= G <= M``, ``M % G == 0 or M % G >= pp``;
  with ``pp`` unknown ``pp = G``, i.e. a multiple of ``G``, which is what ``DpBalancedScheduler`` makes).

:func:`sample_id_groups` plans the step with this planner (balanced ranks, the fewest micro-batches that
balance, :mod:`megatron_dpsched.core.schedule`) and answers in that shape; :func:`check_sample_id_groups`
checks an answer against every rule above. Where no answer can keep them (fewer samples than the
data-parallel ranks times the micro-batches the cap and pipeline need), it raises :class:`PackingError`
naming the numbers; where ``DpBalancedScheduler`` finds an answer, so does this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from megatron_dpsched.compat._fill import fill_empty_micro_batches
from megatron_dpsched.core import CostModel, DPSchedule, ScheduleConfig, plan_schedule
from megatron_dpsched.core.alignment import PipelineLayout

MEGATRON_CONTRACT = "NVIDIA/Megatron-LM@d98e8a6:megatron/core/datasets/data_schedule.py"
"""Where the argument and return contract comes from."""

SampleIdGroups = list[list[list[int]]]
"""``groups[micro_batch][dp_rank * cp_size + cp_rank]``: the global ids that rank packs in that micro-batch."""


class PackingError(ValueError):
    """No answer keeps Megatron's rules for this step, or an answer breaks one; the message says which."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PackingLayout:
    """What Megatron's ``wrap_data_iterator`` hands a packing scheduler, plus the pipeline size when known."""

    max_seqlen_per_dp_cp_rank: int
    """Megatron's ``--max-seqlen-per-dp-cp-rank``: padded tokens per DP x CP rank and micro-batch."""
    dp_size: int
    """Data-parallel ranks (without context parallelism)."""
    cp_size: int = 1
    """Context-parallel ranks per data-parallel rank; a pack holds up to ``max_seqlen_per_dp_cp_rank * cp_size``."""
    microbatch_group_size_per_vp_stage: int | None = None
    """``G`` with virtual pipeline stages, else ``None`` (Megatron passes ``None`` without VPP)."""
    pp_size: int | None = None
    """Pipeline stages where known (the Megatron class reads them in ``run``); ``None``: ``G``, or 1 without VPP."""

    def pipeline(self) -> PipelineLayout:
        """The pipeline shape whose legal micro-batch counts the answer keeps."""
        group = self.microbatch_group_size_per_vp_stage
        if group is None:
            return PipelineLayout(pp_size=self.pp_size or 1)
        pp = group if self.pp_size is None else self.pp_size
        return PipelineLayout(pp_size=pp, vpp_size=2, microbatch_group_size_per_vp_stage=group)

    def schedule_config(self, num_samples: int) -> ScheduleConfig:
        """The planner's configuration for one step of ``num_samples`` samples."""
        pipeline = self.pipeline()
        return ScheduleConfig(
            dp_size=self.dp_size, global_batch_size=num_samples, max_tokens_per_gpu=self.max_seqlen_per_dp_cp_rank,
            cp_size=self.cp_size, pp_size=pipeline.pp_size, vpp_size=pipeline.vpp_size,
            microbatch_group_size_per_vp_stage=pipeline.microbatch_group_size_per_vp_stage,
        )


def sample_id_groups(
    sample_id_seqlens: Sequence[tuple[int, int]], *, layout: PackingLayout, cost_model: CostModel | None = None
) -> SampleIdGroups:
    """This planner's plan of one step in the shape ``get_groups_and_subsamples`` returns (module docstring)."""
    schedule = plan_packing_step(sample_id_seqlens, layout=layout, cost_model=cost_model)
    groups = to_sample_id_groups(schedule, sample_ids=[int(gid) for gid, _ in sample_id_seqlens],
                                 cp_size=layout.cp_size)
    check_sample_id_groups(groups, sample_id_seqlens, layout=layout)
    return groups


def plan_packing_step(
    sample_id_seqlens: Sequence[tuple[int, int]], *, layout: PackingLayout, cost_model: CostModel | None = None
) -> DPSchedule:
    """One step planned from the padded lengths, no micro-batch empty; sample ids are positions in the input.

    Where the balanced plan's count leaves fewer samples than micro-batches (a tail past the cap on a step
    with few samples), the step's global packing dealt to the ranks (``balance="none"``) answers instead.
    """
    lengths = [int(length) for _, length in sample_id_seqlens]
    if len(lengths) < layout.dp_size:
        raise _no_answer(len(lengths), layout=layout, count=layout.pipeline().align(1))
    config = layout.schedule_config(len(lengths))
    try:
        return fill_empty_micro_batches(plan_schedule(lengths, config=config, cost_model=cost_model))
    except ValueError:  # the balanced count leaves too few samples: deal one global packing, fewer micro-batches
        dealt = plan_schedule(lengths, config=replace(config, balance="none"))
    try:
        return fill_empty_micro_batches(dealt)
    except ValueError:
        raise _no_answer(len(lengths), layout=layout, count=dealt.num_microbatches[0]) from None


def _no_answer(num_samples: int, *, layout: PackingLayout, count: int) -> PackingError:
    cap = layout.max_seqlen_per_dp_cp_rank * layout.cp_size
    return PackingError(
        f"{num_samples} samples cannot fill {layout.dp_size} data-parallel ranks x {count} micro-batches (the "
        f"fewest the cap max_seqlen_per_dp_cp_rank * cp_size = {cap} and the pipeline allow) with one sample "
        "each: give the step more samples or a larger --max-seqlen-per-dp-cp-rank"
    )


def to_sample_id_groups(schedule: DPSchedule, *, sample_ids: Sequence[int], cp_size: int) -> SampleIdGroups:
    """Step 0 of ``schedule`` as ``groups[micro_batch][dp_rank * cp_size + cp_rank]`` of ``sample_ids``."""
    ranks = [schedule.rank_step_micro_batches(rank, 0) for rank in range(schedule.dp_size)]
    return [
        [[sample_ids[i] for i in ranks[rank][mb]] for rank in range(schedule.dp_size) for _ in range(cp_size)]
        for mb in range(schedule.num_microbatches[0])
    ]


def check_sample_id_groups(
    groups: SampleIdGroups, sample_id_seqlens: Sequence[tuple[int, int]], *, layout: PackingLayout
) -> None:
    """Raise :class:`PackingError` unless ``groups`` keeps every rule of the module docstring."""
    lengths = {int(gid): int(length) for gid, length in sample_id_seqlens}
    if not layout.pipeline().is_legal(len(groups)):
        raise PackingError(f"{len(groups)} micro-batches is not a count the pipeline schedule accepts")
    seen: list[int] = []
    for mb, ranks in enumerate(groups):
        _check_micro_batch(mb, ranks, lengths=lengths, layout=layout)
        seen.extend(gid for dp_rank in range(layout.dp_size) for gid in ranks[dp_rank * layout.cp_size])
    if sorted(seen) != sorted(lengths) or len(seen) != len(sample_id_seqlens):
        raise PackingError(f"the groups place {len(seen)} ids ({len(set(seen))} distinct), not each of the "
                           f"{len(sample_id_seqlens)} samples once")


def _check_micro_batch(mb: int, ranks: list[list[int]], *, lengths: dict[int, int], layout: PackingLayout) -> None:
    cap = layout.max_seqlen_per_dp_cp_rank * layout.cp_size
    if len(ranks) != layout.dp_size * layout.cp_size:
        raise PackingError(f"micro-batch {mb} has {len(ranks)} packs, not dp_size * cp_size = "
                           f"{layout.dp_size * layout.cp_size}")
    for dp_rank in range(layout.dp_size):
        pack = ranks[dp_rank * layout.cp_size]
        if any(ranks[dp_rank * layout.cp_size + c] != pack for c in range(layout.cp_size)):
            raise PackingError(f"micro-batch {mb}: the context-parallel ranks of data-parallel rank {dp_rank} "
                               "hold different packs")
        if not pack:
            raise PackingError(f"micro-batch {mb}: data-parallel rank {dp_rank} has an empty pack")
        if any(gid not in lengths for gid in pack):
            raise PackingError(f"micro-batch {mb}: data-parallel rank {dp_rank} packs an id not in the step")
        size = sum(lengths[gid] for gid in pack)
        if size > cap and len(pack) > 1:
            raise PackingError(f"micro-batch {mb}: data-parallel rank {dp_rank} packs {size} tokens, over the "
                               f"cap max_seqlen_per_dp_cp_rank * cp_size = {cap}")
