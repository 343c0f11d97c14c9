"""This planner as one of Megatron-LM's packing schedulers (``megatron/core/datasets/data_schedule.py``).

Megatron-LM main (``d98e8a6`` on) and its ``dev`` branch have a ``BasePackingScheduler`` interface that
``wrap_data_iterator`` runs once per step: it gathers every sample's padded length over the data-parallel
ranks, asks the scheduler's ``get_groups_and_subsamples`` which DP x CP rank packs which samples in which
micro-batch, moves the samples there (all-to-all), packs them as THD with ``cu_seqlens`` and returns the
new iterator and micro-batch count. megatron-core 0.19.2 and earlier do not ship it.

:func:`scheduler_class` builds :class:`DPScheduleScheduler`, a subclass of Megatron's
``DpBalancedScheduler`` that answers ``get_groups_and_subsamples`` with this planner's plan of the step
(:func:`megatron_dpsched.compat.megatron_packing.sample_id_groups`) and inherits everything else: the
required sample keys, ``run`` (fetch, all-gather, all-to-all, THD packing, PP / TP broadcasts, VPP
iterators) and Megatron's batch fetch ``get_batch_on_this_rank_for_sequence_packing``. It only records the
pipeline size from ``run``'s ``pp_group`` first, so the count is legal for the real pipeline.

:func:`register_packing_scheduler` adds it to Megatron's ``scheduler_map`` under a name (``"dpsched"``):
main looks the name up through the ``PackingSchedulerEnum`` enum, which is rebuilt with one more member;
``dev`` keys the map by string. ``docs/megatron_packing_scheduler.md`` says what a user does on each.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

from megatron_dpsched.compat.megatron_packing import PackingLayout, sample_id_groups

SCHEDULER_NAME = "dpsched"
"""The name :func:`register_packing_scheduler` registers by default (``config.sequence_packing_scheduler``)."""


@functools.cache
def scheduler_class() -> type:
    """:class:`DPScheduleScheduler`, built on the ``DpBalancedScheduler`` of the Megatron that imports; an
    ``ImportError`` naming what is missing on a Megatron without the packing-scheduler interface."""
    try:
        from megatron.core.datasets import data_schedule
    except ImportError as error:
        raise ImportError(f"Megatron's packing-scheduler interface needs megatron.core.datasets.data_schedule: "
                          f"{error}") from error
    base = getattr(data_schedule, "DpBalancedScheduler", None)
    if base is None:
        raise ImportError("this Megatron's megatron/core/datasets/data_schedule.py has no BasePackingScheduler / "
                          "DpBalancedScheduler (megatron-core 0.19 and earlier); use Megatron-LM main or dev")
    return _subclass(base)


def _subclass(base: type) -> type:
    class DPScheduleScheduler(base):
        """Megatron's ``DpBalancedScheduler`` with this planner's ``get_groups_and_subsamples``."""

        pp_size: int | None = None
        """Pipeline stages, read from ``run``'s ``pp_group`` (``None`` before: ``G``, a multiple of it)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if getattr(self, "max_num_seqs", None) is not None:
                raise ValueError("--thd-max-packed-sequences cannot be combined with the dpsched packing scheduler "
                                 "(it caps tokens, not sequences per pack)")

        def layout(self) -> PackingLayout:
            """The scheduler's sizes as the planner's translation reads them."""
            return PackingLayout(
                max_seqlen_per_dp_cp_rank=self.max_seqlen_per_dp_cp_rank, dp_size=self.dp_size,
                cp_size=self.cp_size, microbatch_group_size_per_vp_stage=self.microbatch_group_size_per_vp_stage,
                pp_size=self.pp_size,
            )

        def get_groups_and_subsamples(self, sample_id_seqlens: Any) -> list[list[list[int]]]:
            """This planner's plan of the step: per micro-batch, per DP x CP rank, the global ids it packs."""
            return sample_id_groups([(int(gid), int(size)) for gid, size in sample_id_seqlens], layout=self.layout())

        def run(self, data_iterator: Any, num_microbatches: int, dp_group: Any, tp_group: Any, pp_group: Any,
                dp_cp_group: Any, dev: Any, config: Any) -> tuple:
            """Megatron's own ``run``, after noting the pipeline size."""
            self.pp_size = pp_group.size()
            return super().run(data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev,
                               config)

    DPScheduleScheduler.__qualname__ = "DPScheduleScheduler"
    return DPScheduleScheduler


def register_packing_scheduler(name: str = SCHEDULER_NAME) -> type:
    """Put :class:`DPScheduleScheduler` into Megatron's ``scheduler_map`` under ``name`` (again: a no-op);
    returns the class. On main, whose map is keyed by ``PackingSchedulerEnum``, the enum is rebuilt with a
    member for ``name`` (``wrap_data_iterator`` reads both at call time); on ``dev`` the key is the string."""
    from megatron.core.datasets import data_schedule

    scheduler = scheduler_class()
    keys = getattr(data_schedule, "PackingSchedulerEnum", None)
    if keys is None:  # dev: string keys
        data_schedule.scheduler_map[name] = scheduler
        return scheduler
    if name.upper() not in keys.__members__:
        members = {member.name: member.value for member in keys} | {name.upper(): name}
        keys = enum.Enum(keys.__name__, members, module=keys.__module__)
        data_schedule.scheduler_map = {keys[old.name]: cls for old, cls in data_schedule.scheduler_map.items()}
        data_schedule.PackingSchedulerEnum = keys
    data_schedule.scheduler_map[keys[name.upper()]] = scheduler
    return scheduler
