"""Micro-batch plans as other frameworks make them, for comparison.

Each is written from the framework's own source (the module of each names the repository,
commit, file and functions read) and returns a :class:`~megatron_dpsched.DPSchedule` over the
same steps as the planner, so ``stats()`` and :func:`~megatron_dpsched.core.steptime.simulate_step`
measure all of them the same way. Every rank runs the same number of micro-batches in a step
and the count is legal for Megatron's schedule (``PipelineLayout.align``): where a peer's count
is not, ranks run empty micro-batches, as the peer would have to.

- ``"megatron_fixed"``, ``"per_rank_first_fit"``, ``"global_first_fit"``: Megatron's fixed
  micro-batch size and two first-fit plans (:mod:`.simple`).
- ``"verl"``: Karmarkar-Karp over DP ranks with equal counts, then an uncapped Karmarkar-Karp
  into the all-reduced MAX count, lightest micro-batches at both ends (:mod:`.verl`).
- ``"nemo_rl"``: modified first-fit decreasing, bins round-robin (:mod:`.nemo_rl`).
- ``"slime_strided"``, ``"slime_kk"``: first fit split to an aligned count, bins strided or by
  Karmarkar-Karp on their cost (:mod:`.slime`).
- ``"megatron_lm_rl"``: next-fit decreasing, bins FIFO (:mod:`.megatron_lm_rl`).

Only ``"verl"`` may put more than the cap in a micro-batch of several samples (what its users
get); :func:`cap_violations` counts them. Such a plan breaks invariant 2, so its ``check()``
raises; it is still built, and its stats and simulated step times are still measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from megatron_dpsched.baselines.megatron_lm_rl_rewrite import megatron_lm_rl_plan
from megatron_dpsched.baselines.nemo_rl_rewrite import nemo_rl_plan
from megatron_dpsched.baselines.simple import (
    fixed_micro_batch_size,
    global_first_fit,
    megatron_fixed,
    per_rank_first_fit,
)
from megatron_dpsched.baselines.slime_rewrite import slime_kk_plan, slime_strided_plan
from megatron_dpsched.baselines.verl_rewrite import verl_plan
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.schedule import DPSchedule, assemble_schedule
from megatron_dpsched.core.steps import split_steps

StepPlanner = Callable[..., list[RankPlan]]
"""``planner(step, *, sizes, costs, config)``: one step's micro-batches per rank."""

PLANNERS: dict[str, StepPlanner] = {
    "megatron_fixed": megatron_fixed,
    "per_rank_first_fit": per_rank_first_fit,
    "global_first_fit": global_first_fit,
    "verl": verl_plan,
    "nemo_rl": nemo_rl_plan,
    "slime_strided": slime_strided_plan,
    "slime_kk": slime_kk_plan,
    "megatron_lm_rl": megatron_lm_rl_plan,
}

BASELINES = tuple(PLANNERS)

CAP_BREAKING = ("verl",)
"""Baselines whose micro-batches of several samples may hold more than the token cap."""


def build_baseline_schedule(
    name: str, lengths: Sequence[int], *, config: ScheduleConfig, costs: Sequence[float] | None = None,
    micro_batch_size: int | None = None,
) -> DPSchedule:
    """Plan ``lengths`` the way baseline ``name`` would (token-capped config only).

    ``costs`` (default: the token counts) are what cost-balancing baselines balance (``"slime_kk"``);
    ``"verl"`` always uses its own workload estimate. ``micro_batch_size`` sets ``"megatron_fixed"``'s
    (default: :func:`~.simple.fixed_micro_batch_size`, found once for all steps).
    """
    if name not in PLANNERS:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    if config.token_cap is None:
        raise ValueError("baselines compare token-capped plans: set max_tokens_per_gpu")
    sizes = lengths if _tuple_of(lengths, int) else tuple(int(n) for n in lengths)
    if costs is None:
        costs = tuple(float(n) for n in sizes)
    elif not _tuple_of(costs, float):
        costs = tuple(float(c) for c in costs)
    if len(costs) != len(sizes):
        raise ValueError(f"costs must hold one cost per sample: got {len(costs)} for {len(sizes)} lengths")
    steps, dropped = split_steps(
        len(sizes), global_batch_size=config.global_batch_size, groups=None, drop_last=config.drop_last
    )
    planner = PLANNERS[name]
    if name == "megatron_fixed":
        planner = partial(megatron_fixed, micro_batch_size=micro_batch_size or fixed_micro_batch_size(
            sizes, config=config))
    elif micro_batch_size is not None:
        raise ValueError(f"micro_batch_size sets megatron_fixed's micro-batches, not {name}'s")
    plans = [planner(step, sizes=sizes, costs=costs, config=config) for step in steps]
    return assemble_schedule(plans, lengths=sizes, costs=costs, groups=None, config=config, dropped=dropped)


def _tuple_of(values: Sequence[object], kind: type) -> bool:
    """Whether ``values`` is a tuple of exactly ``kind`` (a plan's own lengths or costs: no copy needed)."""
    return isinstance(values, tuple) and set(map(type, values)) <= {kind}


def padded_tokens(micro_batch: Sequence[int], sizes: Sequence[int]) -> int:
    """Tokens a micro-batch computes when padded to its longest sample."""
    return len(micro_batch) * max((sizes[i] for i in micro_batch), default=0)


def cap_violations(schedule: DPSchedule) -> int:
    """Micro-batches of two or more samples holding more than ``max_tokens_per_gpu * cp_size`` tokens
    (:func:`breaks_cap`), over all steps."""
    return sum(step_cap_violations(schedule))


def step_cap_violations(schedule: DPSchedule) -> tuple[int, ...]:
    """:func:`cap_violations` of each step."""
    cap, lengths = schedule.config.token_cap, schedule.lengths
    return tuple(
        0 if cap is None else sum(breaks_cap(mb, lengths, cap) for rank in range(schedule.dp_size)
                                  for mb in schedule.rank_step_micro_batches(rank, step))
        for step in range(schedule.num_steps)
    )


def breaks_cap(micro_batch: Sequence[int], lengths: Sequence[int], cap: int) -> bool:
    """Whether a micro-batch of two or more samples holds more than ``cap`` tokens; a single sample longer than
    the cap does not count: no plan can split it. Tokens are the raw lengths: the baselines plan without
    ``pad_multiple`` or ``padded_rows``, where they equal invariant 2's collated size."""
    return len(micro_batch) > 1 and sum(lengths[i] for i in micro_batch) > cap
