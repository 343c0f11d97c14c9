"""Global data-parallel micro-batch schedule: the specification.

``build_dp_schedule`` plans every optimizer step of a stream of samples at
once, from their token counts alone. It is pure Python (no torch, no
Megatron), deterministic, and every rank that calls it with the same inputs
gets the same plan, so no collective is needed.

Steps (per optimizer step):

1. Cut the samples into steps: ``global_batch_size`` consecutive samples, or
   ``global_batch_size`` groups (in order of their first sample) with all of
   their samples. A trailing partial step is a smaller step, or with
   ``drop_last`` is reported in ``dropped``.
2. Lower bound: with a token cap ``C = max_tokens_per_gpu * cp_size`` the step
   needs at least ``L = oversize + max(ceil(tokens / C), #samples > C/2)``
   micro-batches, so each rank runs at least ``M = align(ceil(L / dp_size))``,
   where ``align`` gives the smallest count Megatron's schedule accepts
   (interleaved rule, see :mod:`~megatron_dpsched.core.alignment`). With
   ``micro_batch_size`` it is ``align(ceil(samples / (micro_batch_size * dp_size)))``.
3. Assign samples to ranks, largest cost first, each to the least-loaded rank
   that still has room (``M * C`` capped tokens, or ``M * micro_batch_size``
   samples). With a token cap, stop here if the busiest rank is within 2% of
   ``max(mean rank cost, dearest sample)``.
4. Pack each rank's samples into exactly ``M`` micro-batches: worst-fit
   decreasing (even micro-batches), else best-fit decreasing then splitting
   the fullest micro-batches; empty micro-batches only when a rank has fewer
   samples than ``M``. A rank whose samples need more than ``M`` hands the
   samples of its emptiest micro-batches to the least-loaded ranks with room.
5. Otherwise (a rank overflowed, or the cap kept ranks from balancing: heavy
   tails at high fill), retry with the next legal ``M``, up to ``U``, the count
   of one global packing (the better of best-fit decreasing and first fit in
   arrival order, so never more than a global first fit), or with
   ``balance_growth`` up to ``U * (1 + balance_growth)``. A larger ``M`` is
   kept only if it cuts the busiest rank's cost by more than 2%. If no count
   up to ``U`` fits, the global micro-batches are split to ``U * dp_size`` and
   dealt to ranks by LPT, which always works. A plan that is not yet balanced
   is first refined: single samples move off the busiest rank into a lighter
   rank's micro-batch with room, while that lowers the busiest rank's cost.
   ``balance="none"`` goes straight to this, dealing micro-batches round-robin.
6. Order each rank's micro-batches: with ``pp_size > 1`` the cheapest at both
   ends (pipeline warm-up and cool-down), the dearest in the middle.

Invariants (checked by :meth:`DPSchedule.check`, for every accepted input):

1. Every rank runs the same ``num_microbatches[s]`` micro-batches in step ``s``.
2. With ``max_tokens_per_gpu``, every micro-batch holds at most
   ``max_tokens_per_gpu * cp_size`` tokens, or is a single longer sample; with
   ``micro_batch_size``, at most that many samples.
3. Flattening ``micro_batch_indices[r]`` gives ``range(len(partitions[r]))``;
   partitions are disjoint and their union is every sample not in ``dropped``.
4. ``num_microbatches[s]`` is legal for Megatron's schedule (interleaved rule
   with ``vpp_size > 1``).
5. Samples of one group are in the same step; steps follow the input order;
   every step but a trailing one holds exactly ``global_batch_size`` samples
   (groups); ``step_num_samples[s]`` counts the samples of step ``s``; only a
   trailing partial step can be dropped, and only with ``drop_last``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.balancing import assign_bins, lpt_assign, refine_by_moves
from megatron_dpsched.core.cost import CostFunction, sample_costs
from megatron_dpsched.core.ordering import order_micro_batches, resolve_order
from megatron_dpsched.core.packing import (
    best_fit_decreasing,
    bin_lower_bound,
    first_fit,
    pack_into,
    split_to_count,
)
from megatron_dpsched.core.steps import split_steps
from megatron_dpsched.core.validation import require_int, require_lengths

BALANCE_MODES = ("cost", "tokens", "none")

RankPlan = list[list[int]]
"""One rank's micro-batches in one step, as sample ids."""


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """Everything besides the samples that shapes a plan."""

    dp_size: int
    """Data-parallel ranks (context parallelism excluded)."""
    global_batch_size: int
    """Samples per optimizer step (groups per step when the plan has groups)."""
    max_tokens_per_gpu: int | None = None
    """Dynamic batching: token cap per micro-batch per GPU (times ``cp_size`` per DP rank)."""
    micro_batch_size: int | None = None
    """Static batching: at most this many samples per micro-batch."""
    cp_size: int = 1
    """Context-parallel ranks sharing each micro-batch."""
    pp_size: int = 1
    """Pipeline-parallel stages."""
    vpp_size: int = 1
    """Virtual pipeline stages per pipeline rank (interleaved schedule when > 1)."""
    microbatch_group_size_per_vp_stage: int | None = None
    """Interleaved schedule group size; ``None`` means ``pp_size`` as in Megatron."""
    balance: str = "cost"
    """``"cost"`` (cost model), ``"tokens"`` (token counts) or ``"none"`` (round-robin)."""
    drop_last: bool = False
    """Drop a trailing partial step (its samples go to ``dropped``) instead of running it smaller."""
    balance_growth: float = 0.0
    """With a token cap: the share by which the micro-batch count may exceed that of one global
    packing when more micro-batches balance the ranks better (heavy tails at high fill). 0 keeps
    the count at or below a global first fit."""
    microbatch_order: str | None = None
    """``"pipeline"`` (cheap micro-batches at both ends), ``"none"``, or ``None``/``"auto"``:
    ``"pipeline"`` when ``pp_size > 1``. Stored resolved."""

    def __post_init__(self) -> None:
        require_int("dp_size", self.dp_size)
        require_int("global_batch_size", self.global_batch_size)
        require_int("cp_size", self.cp_size)
        self.layout.validate()
        self._validate_batching()
        if not 0.0 <= self.balance_growth <= 10.0:
            raise ValueError(f"balance_growth must be between 0 and 10, got {self.balance_growth!r}")
        if self.balance not in BALANCE_MODES:
            raise ValueError(f"balance must be one of {', '.join(BALANCE_MODES)}; got {self.balance!r}")
        object.__setattr__(self, "microbatch_order", resolve_order(self.microbatch_order, self.pp_size))

    def _validate_batching(self) -> None:
        cap, mbs = self.max_tokens_per_gpu, self.micro_batch_size
        if (cap is None) == (mbs is None):
            raise ValueError(
                "give exactly one of max_tokens_per_gpu (dynamic batching) and micro_batch_size "
                f"(static batching); got max_tokens_per_gpu={cap!r}, micro_batch_size={mbs!r}"
            )
        if cap is not None:
            require_int("max_tokens_per_gpu", cap)
        if mbs is not None:
            require_int("micro_batch_size", mbs)

    @property
    def layout(self) -> PipelineLayout:
        """The pipeline shape that decides which micro-batch counts are legal."""
        return PipelineLayout(
            pp_size=self.pp_size,
            vpp_size=self.vpp_size,
            microbatch_group_size_per_vp_stage=self.microbatch_group_size_per_vp_stage,
        )

    @property
    def token_cap(self) -> int | None:
        """Tokens per micro-batch per DP rank: ``max_tokens_per_gpu * cp_size``."""
        return None if self.max_tokens_per_gpu is None else self.max_tokens_per_gpu * self.cp_size


@dataclass(frozen=True, kw_only=True)
class DPSchedule:
    """A whole plan: which rank trains which samples, in which micro-batches, in which step."""

    config: ScheduleConfig
    """The options the plan was made with."""
    lengths: tuple[int, ...]
    """Token count of every sample, in global order."""
    costs: tuple[float, ...]
    """Estimated cost of every sample (what ``balance`` balanced)."""
    groups: tuple[Hashable, ...] | None
    """Group id of every sample, or ``None``."""
    partitions: tuple[tuple[int, ...], ...]
    """Per DP rank: global sample ids it owns over all steps, in micro-batch order."""
    micro_batch_indices: tuple[tuple[tuple[int, ...], ...], ...]
    """Per DP rank: its micro-batches over all steps, as positions into ``partitions[r]``."""
    num_microbatches: tuple[int, ...]
    """Per step: micro-batches per rank (the same on every rank)."""
    step_num_samples: tuple[int, ...]
    """Per step: samples trained over all ranks (the LR-scheduler increment)."""
    dropped: tuple[int, ...] = ()
    """Samples not scheduled (a trailing partial step with ``drop_last``)."""
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        offsets = [0]
        for count in self.num_microbatches:
            offsets.append(offsets[-1] + count)
        object.__setattr__(self, "_offsets", tuple(offsets))

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks."""
        return self.config.dp_size

    @property
    def num_steps(self) -> int:
        """Optimizer steps in the plan."""
        return len(self.num_microbatches)

    def step_micro_batch_range(self, step: int) -> range:
        """Positions of step ``step``'s micro-batches in every rank's ``micro_batch_indices``."""
        return range(self._offsets[step], self._offsets[step + 1])

    def rank_step_micro_batches(self, rank: int, step: int) -> tuple[tuple[int, ...], ...]:
        """Global sample ids of each micro-batch that ``rank`` runs in ``step``, in run order."""
        partition = self.partitions[rank]
        batches = self.micro_batch_indices[rank]
        return tuple(
            tuple(partition[p] for p in batches[b]) for b in self.step_micro_batch_range(step)
        )

    def step_samples(self, step: int) -> list[int]:
        """All sample ids of ``step`` over all ranks, sorted."""
        return sorted(
            i
            for rank in range(self.dp_size)
            for mb in self.rank_step_micro_batches(rank, step)
            for i in mb
        )

    def check(self) -> None:
        """Raise :class:`ScheduleInvariantError` naming the first broken invariant."""
        from megatron_dpsched.core.invariants import check_invariants

        check_invariants(self)

    def stats(self) -> list[Any]:
        """Per-step figures (:class:`~megatron_dpsched.core.stats.StepStats`)."""
        from megatron_dpsched.core.stats import schedule_stats

        return schedule_stats(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_dict` rebuilds an equal schedule."""
        return {
            "config": asdict(self.config),
            "lengths": list(self.lengths),
            "costs": list(self.costs),
            "groups": None if self.groups is None else list(self.groups),
            "partitions": [list(p) for p in self.partitions],
            "micro_batch_indices": [[list(mb) for mb in rank] for rank in self.micro_batch_indices],
            "num_microbatches": list(self.num_microbatches),
            "step_num_samples": list(self.step_num_samples),
            "dropped": list(self.dropped),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DPSchedule:
        """Rebuild a schedule from :meth:`to_dict` output (e.g. after a JSON round trip)."""
        groups = data["groups"]
        return cls(
            config=ScheduleConfig(**data["config"]),
            lengths=tuple(data["lengths"]),
            costs=tuple(float(c) for c in data["costs"]),
            groups=None if groups is None else tuple(groups),
            partitions=tuple(tuple(p) for p in data["partitions"]),
            micro_batch_indices=tuple(
                tuple(tuple(mb) for mb in rank) for rank in data["micro_batch_indices"]
            ),
            num_microbatches=tuple(data["num_microbatches"]),
            step_num_samples=tuple(data["step_num_samples"]),
            dropped=tuple(data["dropped"]),
        )


def build_dp_schedule(
    lengths: Sequence[int],
    *,
    dp_size: int,
    global_batch_size: int,
    max_tokens_per_gpu: int | None = None,
    micro_batch_size: int | None = None,
    cp_size: int = 1,
    pp_size: int = 1,
    vpp_size: int = 1,
    microbatch_group_size_per_vp_stage: int | None = None,
    groups: Sequence[Hashable] | None = None,
    balance: str = "cost",
    cost_model: CostFunction | None = None,
    drop_last: bool = False,
    microbatch_order: str | None = None,
    balance_growth: float = 0.0,
) -> DPSchedule:
    """Plan every step of ``lengths`` at once (see the module docstring for the rules)."""
    config = ScheduleConfig(
        dp_size=dp_size,
        global_batch_size=global_batch_size,
        max_tokens_per_gpu=max_tokens_per_gpu,
        micro_batch_size=micro_batch_size,
        cp_size=cp_size,
        pp_size=pp_size,
        vpp_size=vpp_size,
        microbatch_group_size_per_vp_stage=microbatch_group_size_per_vp_stage,
        balance=balance,
        drop_last=bool(drop_last),
        microbatch_order=microbatch_order,
        balance_growth=balance_growth,
    )
    return plan_schedule(lengths, config=config, groups=groups, cost_model=cost_model)


def plan_schedule(
    lengths: Sequence[int],
    *,
    config: ScheduleConfig,
    groups: Sequence[Hashable] | None = None,
    cost_model: CostFunction | None = None,
) -> DPSchedule:
    """:func:`build_dp_schedule` with the options already gathered in a :class:`ScheduleConfig`."""
    sizes = require_lengths(lengths)
    _check_static_layout(config, groups)
    steps, dropped = split_steps(
        len(sizes), global_batch_size=config.global_batch_size, groups=groups, drop_last=config.drop_last
    )
    if not steps:
        raise ValueError(
            f"lengths holds {len(sizes)} samples, fewer than one global_batch_size="
            f"{config.global_batch_size} step, and drop_last=True would drop them all"
        )
    costs = sample_costs(sizes, None if config.balance == "tokens" else cost_model)
    plans = [plan_step(step, sizes=sizes, costs=costs, config=config) for step in steps]
    return assemble_schedule(plans, sizes=sizes, costs=costs, groups=groups, config=config, dropped=dropped)


def plan_step(
    samples: Sequence[int],
    *,
    sizes: Sequence[int],
    costs: Sequence[float],
    config: ScheduleConfig,
) -> list[RankPlan]:
    """One step: per rank, its micro-batches (global sample ids) in run order."""
    local_sizes = [sizes[i] for i in samples]
    local_costs = [costs[i] for i in samples]
    if config.micro_batch_size is not None:
        ranks = _plan_static(local_sizes, local_costs, config=config)
    else:
        ranks = _plan_dynamic(local_sizes, local_costs, config=config)
    order = config.microbatch_order
    return [
        [[samples[i] for i in mb] for mb in order_micro_batches(rank, local_costs, order)]
        for rank in ranks
    ]


def lower_bound_microbatches(sizes: Sequence[int], *, config: ScheduleConfig) -> int:
    """Step 2: the fewest legal micro-batches per rank any plan of these samples can run."""
    dp = config.dp_size
    if config.micro_batch_size is not None:
        needed = math.ceil(len(sizes) / (config.micro_batch_size * dp))
    else:
        needed = math.ceil(bin_lower_bound(sizes, config.token_cap) / dp)
    return config.layout.align(needed)


def _plan_static(sizes: list[int], costs: list[float], *, config: ScheduleConfig) -> list[RankPlan]:
    dp, count = config.dp_size, len(sizes)
    num_microbatches = lower_bound_microbatches(sizes, config=config)
    if config.balance == "none":
        ranks = [list(range(count))[r * count // dp : (r + 1) * count // dp] for r in range(dp)]
    else:
        ranks = lpt_assign(
            range(count),
            costs=costs,
            weights=[1.0] * count,
            capacity=num_microbatches * config.micro_batch_size,
            num_ranks=dp,
        )
        assert ranks is not None, "static capacity covers every sample"
    return [_chunk_by_length(items, sizes, num_microbatches) for items in ranks]


def _chunk_by_length(items: list[int], sizes: Sequence[int], num_bins: int) -> RankPlan:
    """Split into ``num_bins`` near-equal-count micro-batches of similar lengths (least padding)."""
    ordered = sorted(items, key=lambda i: (-sizes[i], i))
    base, extra = divmod(len(ordered), num_bins)
    bins, start = [], 0
    for b in range(num_bins):
        stop = start + base + (b < extra)
        bins.append(ordered[start:stop])
        start = stop
    return bins


BALANCE_TOLERANCE = 0.02
"""A larger micro-batch count must cut the busiest rank's cost by more than this share to be chosen."""


def _plan_dynamic(sizes: list[int], costs: list[float], *, config: ScheduleConfig) -> list[RankPlan]:
    """Steps 3-5: the smallest count that balances, within the count of one global packing."""
    items = range(len(sizes))
    if config.balance == "none":
        return _plan_by_bins(best_fit_decreasing(items, sizes, config.token_cap), sizes, costs, config=config)
    ideal = max(sum(costs) / config.dp_size, max(costs))
    num_microbatches = lower_bound_microbatches(sizes, config=config)
    best, best_peak = None, math.inf
    global_bins: list[list[int]] | None = None
    upper = num_microbatches
    while True:
        plan = _assign_and_pack(
            sizes, costs, cap=config.token_cap, dp=config.dp_size, num_microbatches=num_microbatches
        )
        if plan is None or _peak_cost(plan, costs) > ideal * (1 + BALANCE_TOLERANCE):
            global_bins = global_bins or _global_packing(sizes, config.token_cap)
            upper = config.layout.align(math.ceil(len(global_bins) / config.dp_size))
            if plan is None and best is None and num_microbatches >= upper:
                plan = _plan_by_bins(global_bins, sizes, costs, config=config)
            if plan is not None:
                refine_by_moves(plan, sizes=sizes, costs=costs, cap=config.token_cap, max_moves=4 * config.dp_size)
        peak = _peak_cost(plan, costs)
        if peak < best_peak * (1 - BALANCE_TOLERANCE):
            best, best_peak = plan, peak
        if best_peak <= ideal * (1 + BALANCE_TOLERANCE):
            return best
        limit = config.layout.align(math.ceil(upper * (1 + config.balance_growth)))
        if best is not None and num_microbatches >= limit:
            return best
        num_microbatches = config.layout.next_legal(num_microbatches)


def _global_packing(sizes: list[int], cap: int) -> list[list[int]]:
    """The better of best-fit decreasing and first fit in arrival order over the whole step."""
    items = range(len(sizes))
    return min(best_fit_decreasing(items, sizes, cap), first_fit(items, sizes, cap), key=len)


def _peak_cost(plan: list[RankPlan] | None, costs: list[float]) -> float:
    if plan is None:
        return math.inf
    return max(sum(costs[i] for mb in rank for i in mb) for rank in plan)


def _plan_by_bins(
    bins: list[list[int]], sizes: list[int], costs: list[float], *, config: ScheduleConfig
) -> list[RankPlan]:
    """Step 5: global micro-batches split to ``M * dp_size`` and dealt to ranks."""
    dp = config.dp_size
    num_microbatches = config.layout.align(math.ceil(len(bins) / dp))
    bins = split_to_count(bins, sizes, num_microbatches * dp)
    owners = assign_bins(bins, costs=costs, num_ranks=dp, balance=config.balance != "none")
    return [[bins[b] for b in owned] for owned in owners]


def _assign_and_pack(
    sizes: list[int], costs: list[float], *, cap: int, dp: int, num_microbatches: int
) -> list[RankPlan] | None:
    """Steps 3-4 for one candidate micro-batch count; ``None`` if it does not fit."""
    weights = [min(size, cap) for size in sizes]
    ranks = lpt_assign(
        range(len(sizes)), costs=costs, weights=weights, capacity=num_microbatches * cap, num_ranks=dp
    )
    if ranks is None:
        return None
    packed = [pack_into(items, sizes, cap, num_microbatches) for items in ranks]
    if all(bins is not None for bins in packed):
        return packed
    return _repair_overflow(ranks, packed, sizes, costs, cap=cap, num_microbatches=num_microbatches)


def _repair_overflow(
    ranks: list[list[int]],
    packed: list[RankPlan | None],
    sizes: list[int],
    costs: list[float],
    *,
    cap: int,
    num_microbatches: int,
) -> list[RankPlan] | None:
    """Move the samples of overflowing ranks' emptiest micro-batches to the lightest ranks with room."""
    loads = [sum(costs[i] for i in items) for items in ranks]
    homeless: list[int] = []
    bins_per_rank: list[RankPlan] = []
    for rank, bins in enumerate(packed):
        if bins is None:
            bins = sorted(best_fit_decreasing(ranks[rank], sizes, cap), key=lambda b: -_load(b, sizes))
            for item in (i for b in bins[num_microbatches:] for i in b):
                homeless.append(item)
                loads[rank] -= costs[item]
            bins = bins[:num_microbatches]
        bins_per_rank.append(bins)
    residuals = [[cap - _load(b, sizes) for b in bins] for bins in bins_per_rank]
    for item in sorted(homeless, key=lambda i: -sizes[i]):
        size = sizes[item]
        fits = [r for r in range(len(loads)) if residuals[r] and max(residuals[r]) >= size]
        if not fits:
            return None
        rank = min(fits, key=lambda r: loads[r])
        b = next(b for b, room in enumerate(residuals[rank]) if room >= size)
        bins_per_rank[rank][b].append(item)
        residuals[rank][b] -= size
        loads[rank] += costs[item]
    return [split_to_count(bins, sizes, num_microbatches) for bins in bins_per_rank]


def _load(items: Sequence[int], sizes: Sequence[int]) -> int:
    return sum(sizes[i] for i in items)


def _check_static_layout(config: ScheduleConfig, groups: Sequence[Hashable] | None) -> None:
    """Static batching without groups follows Megatron: each step fills every micro-batch."""
    mbs = config.micro_batch_size
    if mbs is None or groups is not None:
        return
    per_step = mbs * config.dp_size
    if config.global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size={config.global_batch_size} must be a multiple of micro_batch_size * "
            f"dp_size = {mbs} * {config.dp_size} = {per_step} for static batching"
        )


def assemble_schedule(
    plans: list[list[RankPlan]],
    *,
    sizes: tuple[int, ...],
    costs: tuple[float, ...],
    groups: Sequence[Hashable] | None,
    config: ScheduleConfig,
    dropped: list[int],
) -> DPSchedule:
    """Turn per-step, per-rank micro-batches into the rank-major contract."""
    partitions: list[list[int]] = [[] for _ in range(config.dp_size)]
    micro_batch_indices: list[list[tuple[int, ...]]] = [[] for _ in range(config.dp_size)]
    for step_plan in plans:
        for rank, micro_batches in enumerate(step_plan):
            for mb in micro_batches:
                start = len(partitions[rank])
                partitions[rank].extend(mb)
                micro_batch_indices[rank].append(tuple(range(start, start + len(mb))))
    return DPSchedule(
        config=config,
        lengths=sizes,
        costs=costs,
        groups=None if groups is None else tuple(groups),
        partitions=tuple(tuple(p) for p in partitions),
        micro_batch_indices=tuple(tuple(mbs) for mbs in micro_batch_indices),
        num_microbatches=tuple(len(step_plan[0]) for step_plan in plans),
        step_num_samples=tuple(sum(len(mb) for rank in step for mb in rank) for step in plans),
        dropped=tuple(dropped),
    )
