"""Planning one step: steps 2-5 and 7 of the contract in :mod:`megatron_dpsched.core.schedule`
(step 6 in :mod:`~megatron_dpsched.core.ordering`, step 7's search in :mod:`~megatron_dpsched.core.objective`).

Names: ``lengths`` are real token counts; ``sizes`` are planned sizes (what the cap counts,
:func:`plan_step_layout`); ``costs`` are what ranks are balanced by. Below :func:`plan_step_layout`, sample ids
are positions in the step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate, chain, pairwise

import numpy as np

from megatron_dpsched.core import padding
from megatron_dpsched.core.balancing import (
    assign_costed,
    lpt_assign,
    lpt_ranks,
    peak_cost,
    python_sums,
    refine_by_moves,
    refine_laid_out,
    run_sums,
)
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.objective import MAX_STALE_COUNTS, count_bound, plan_for_step_time, tail_heavy
from megatron_dpsched.core.ordering import ordered_layout
from megatron_dpsched.core.packing import (
    BinArrays,
    PackedRanks,
    Refits,
    best_fit_decreasing,
    best_fit_ranks,
    bin_lower_bound,
    first_fit_below,
    flat_lists,
    pack_rank_arrays,
    runs_of,
    split_owned,
    split_to_count,
)
from megatron_dpsched.core.padding import collated_sizes

StepLayout = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One step's plan laid out: each rank's micro-batch count, every micro-batch's sample count (rank after rank, in
run order) and their global sample ids end to end."""


def plan_step_layout(
    samples: Sequence[int], *, lengths: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> StepLayout:
    """One step: per rank, its micro-batches (global sample ids) in run order, as a :data:`StepLayout`.

    ``lengths`` and ``costs`` are indexed by global sample id. The step is planned on planned sizes
    (lengths rounded up to ``pad_multiple``) wherever it counts tokens: the lower bound, rank
    capacities, packing, the global packing, overflow repair and refinement moves, and the step-time
    model's micro-batch times (what runs). Costs stay those of the real lengths: a cost is a property
    of one sample, while the padding a sample carries under ``padded_rows`` depends on which samples
    share its micro-batch, which step 3 does not know yet; per-sequence padding adds fewer than
    ``pad_multiple`` tokens to a sample (and packed attention runs on the real ``cu_seqlens``); and the
    lengths are what the plan stores, fingerprints and checks against the data.
    """
    ranks, local_costs, layout = _plan_positions(samples, lengths=lengths, costs=costs, config=config, laid_out=True)
    if config.step_time_model is None:
        per_rank, counts, flat = ordered_layout(ranks, local_costs, config.microbatch_order, run_sums=run_sums,
                                                layout=layout)
    else:
        per_rank = np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))
        counts, flat = flat_lists(list(chain.from_iterable(ranks)))
    first = samples[0]
    if samples[-1] - first + 1 == len(samples):  # a range
        return per_rank, counts, flat + first if first else flat
    return per_rank, counts, np.asarray(samples, dtype=np.int64)[flat]


def _plan_positions(
    samples: Sequence[int], *, lengths: Sequence[int], costs: Sequence[float], config: ScheduleConfig,
    laid_out: bool = False,
) -> tuple[list[RankPlan], Sequence[float], StepLayout | None]:
    """Steps 2-6 (step 7 too, which returns its plan in run order) of one step, in positions within the step;
    with the step's costs. ``laid_out``: where step 5's plan has its layout (:func:`_plan_dynamic`), it comes as
    a :data:`StepLayout` in plan order instead of lists (``[]``)."""
    first = samples[0]
    contiguous = samples[-1] - first + 1 == len(samples)  # sorted and distinct: a range
    if contiguous and first == 0 and len(samples) == len(lengths):
        local_lengths, local_costs = lengths, costs  # the whole run: no copy
    elif contiguous:
        stop = first + len(samples)
        local_lengths, local_costs = padding.array_slice(lengths, first, stop), padding.array_slice(costs, first, stop)
    else:
        local_lengths, local_costs = [lengths[i] for i in samples], [costs[i] for i in samples]
    local_sizes = padding.step_sizes(local_lengths, pad_multiple=config.pad_multiple)
    local_costs = padding.array_tuple(local_costs, np.float64)
    layout = None
    tried: Packings | None = None if config.step_time_model is None else {}  # step 5's packings, for step 7
    upper = _GlobalCount(local_sizes, config)  # steps 5 and 7 share ``U``
    if config.micro_batch_size is not None:
        ranks = _plan_static(local_sizes, local_costs, config=config)
    else:
        laid_out = laid_out and config.step_time_model is None and (  # what ordered_layout takes
            config.microbatch_order == "none" or padding.all_floats(local_costs))
        ranks, layout = _plan_dynamic(local_sizes, local_costs, config=config, laid_out=laid_out, tried=tried,
                                      upper=upper)
    if config.step_time_model is not None:  # step 7 returns its plan in run order
        ranks = _plan_step_time(ranks, local_sizes, local_costs, config=config, tried=tried, upper=upper)
        layout = None
    return ranks, local_costs, layout


def lower_bound_microbatches(sizes: Sequence[int], *, config: ScheduleConfig) -> int:
    """Step 2: ``M``, the fewest legal micro-batches per rank any plan of these samples can run.

    With a token cap ``align(ceil(L / dp_size))``, ``L`` the :func:`~megatron_dpsched.core.packing.bin_lower_bound`
    of the planned ``sizes`` under ``C`` (with ``padded_rows`` the count of step 4's chunking over the whole
    step, the fewest possible); with ``micro_batch_size``, ``align(ceil(samples / (micro_batch_size * dp_size)))``.
    """
    dp = config.dp_size
    if 0 < len(sizes) <= dp:  # at most one micro-batch per sample: the bound is 1 to ``dp`` micro-batches
        needed = 1
    elif config.micro_batch_size is not None:
        needed = math.ceil(len(sizes) / (config.micro_batch_size * dp))
    else:
        needed = math.ceil(bin_lower_bound(sizes, config.token_cap, padded_rows=config.padded_rows) / dp)
    return config.layout.align(needed)


def _plan_static(sizes: list[int], costs: list[float], *, config: ScheduleConfig) -> list[RankPlan]:
    """Steps 3-4 with ``micro_batch_size``: samples to ranks largest cost first, each to the least-loaded
    rank with room for ``M * micro_batch_size`` samples (``balance="none"``: contiguous slices), then each
    rank's samples chunked by length into ``M`` micro-batches."""
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
"""A plan is balanced when its busiest rank's cost is within this share of ``max(mean rank cost,
dearest sample)``; a larger micro-batch count must cut the busiest rank's cost by more than this share
to be chosen."""


def _plan_dynamic(
    sizes: list[int], costs: list[float], *, config: ScheduleConfig, laid_out: bool = False,
    tried: Packings | None = None, upper: _GlobalCount | None = None,
) -> tuple[list[RankPlan], StepLayout | None]:
    """Steps 3-5 with a token cap: the smallest count that balances, within the count of one global packing.
    With ``laid_out``, a plan known as arrays (step 2's count where worst fit packs every rank, :func:`_attempt`,
    or :func:`_deal_bins`' deal) comes as its :data:`StepLayout` in plan order and no lists (``[]``); else the
    plan's lists and ``None``.

    Steps 3-4 at ``M`` (step 2); a balanced plan (:data:`BALANCE_TOLERANCE`) is kept. Otherwise (a rank overflowed,
    or the cap kept ranks from balancing: heavy tails at high fill) the next legal counts are tried, up to ``U``,
    the count of :func:`_global_packing` dealt to the ranks (made only where a decision needs it,
    :class:`_GlobalCount`), or with ``balance_growth`` up to ``align(U * (1 + balance_growth))``, or without it for
    a tail past the cap up to ``B`` (:func:`_reached`; each plan past ``U`` within its own ``B``); when ``M`` does
    not fit, :func:`_first_fitting_count` finds the first count that does. A larger count is kept only if it cuts
    the busiest rank's cost by more than :data:`BALANCE_TOLERANCE`; the search stops after
    :data:`~megatron_dpsched.core.objective.MAX_STALE_COUNTS` larger counts in a row bring nothing. A plan not yet
    balanced is first refined (:func:`_refine`). If no count up to ``U`` fits, :func:`_deal_bins` deals the global
    packing, which always works; ``balance="none"`` goes straight to it. ``tried`` (when given) receives the counts
    steps 3-4 do not fit and, in steps of at most :data:`KEPT_SAMPLES` samples, the plans of the counts that do
    (refined in place); ``upper``: the step's :class:`_GlobalCount`, where the caller keeps it.
    """
    if config.balance == "none":
        layout = _deal_bins(_global_packing(sizes, config), sizes, costs, config=config)
        return ([], layout) if laid_out else (_plan_of(layout), None)
    num_microbatches = lower = lower_bound_microbatches(sizes, config=config)
    if len(sizes) <= config.dp_size:  # balanced: the busiest rank costs the dearest sample
        plan = _one_per_rank(sizes, costs, config=config, num_microbatches=num_microbatches)
        if plan is not None:
            return plan, None
    balanced = _balanced_peak(costs, config)
    plan, layout = _attempt(sizes, costs, config=config, num_microbatches=num_microbatches, laid_out=laid_out,
                            tried=tried)
    if layout is not None:  # worst fit packed every rank: if balanced, that is the plan (its lists never made)
        if _layout_peak(layout, costs) <= balanced:
            return [], layout
        plan = _plan_of(layout)
    upper = upper or _GlobalCount(sizes, config)
    if plan is None:  # the lower bound does not fit: find the first count that does, in O(log) tries
        num_microbatches, plan = _first_fitting_count(sizes, costs, config=config, low=num_microbatches,
                                                      high=upper.exact(), tried=tried)
    best, best_peak, best_layout = None, math.inf, None
    stale = 0  # larger counts tried in a row without a better plan
    while True:
        if plan is not None and tried is not None and len(sizes) <= KEPT_SAMPLES:
            tried[num_microbatches] = plan  # refined below as plan_at_count refines it
        peak, layout = peak_cost(plan, costs), None
        if peak > balanced:
            if plan is None and best is None and num_microbatches >= upper.exact():
                layout = _deal_bins(upper.take_bins(), sizes, costs, config=config)  # its lists freed as made
                plan = [] if laid_out else _plan_of(layout)  # laid out: the lists are never made
            if plan is not None:
                peak, layout = _refine(plan or None, sizes, costs, config=config, layout=layout)
        stale = stale + 1 if best is not None else 0
        if peak < best_peak * (1 - BALANCE_TOLERANCE):
            best, best_peak, best_layout, stale = plan, peak, layout, 0
        if best_peak <= balanced or stale >= MAX_STALE_COUNTS:
            return _result(best, best_layout, laid_out=laid_out)
        if best is not None and _reached(best or _plan_of(best_layout), costs, config=config, count=num_microbatches,
                                         upper=upper, lower_bound=lower):
            return _result(best, best_layout, laid_out=laid_out)
        num_microbatches = config.layout.next_legal(num_microbatches)
        plan = _assign_and_pack(sizes, costs, config=config, num_microbatches=num_microbatches, tried=tried)
        if (plan is not None and not config.balance_growth
                and num_microbatches > count_bound(plan, config=config, lower_bound=lower)
                and upper.below(num_microbatches)):
            plan = None  # past ``U`` for a tail: each plan within its own ``B``


class _GlobalCount:
    """``U``, the count of :func:`_global_packing` dealt to the ranks (:func:`_bins_count`), packed only where a
    decision needs it. Without ``padded_rows`` the global packing is an any-fit packing (a sample opens a
    micro-batch only where it fits no open one), so at most one of its micro-batches is at most half full: it has
    at most ``floor(2 * tokens / C) + 1``, which bounds ``U`` from above for free (:meth:`below`)."""

    __slots__ = ("bins", "config", "sizes", "value")

    def __init__(self, sizes: Sequence[int], config: ScheduleConfig) -> None:
        self.sizes, self.config = sizes, config
        self.bins: list[list[int]] | None = None
        self.value: int | None = None

    def exact(self) -> int:
        """``U`` (the global packing made, once)."""
        if self.value is None:
            self.bins = _global_packing(self.sizes, self.config)
            self.value = _bins_count(self.bins, self.config)
        return self.value

    def take_bins(self) -> list[list[int]]:
        """The global packing's micro-batches, handed over (made again if asked for again)."""
        self.exact()
        bins, self.bins = self.bins, None
        return bins if bins is not None else _global_packing(self.sizes, self.config)

    def below(self, count: int) -> bool:
        """Whether ``U < count``; the packing made only where the any-fit bound does not decide it."""
        if self.value is None and not self.config.padded_rows:
            tokens = int(np.asarray(self.sizes, dtype=np.int64).sum())
            most = 2 * tokens // self.config.token_cap + 1
            if self.config.layout.align(math.ceil(most / self.config.dp_size)) < count:
                return True
        return self.exact() < count


def _result(
    plan: list[RankPlan], layout: StepLayout | None, *, laid_out: bool
) -> tuple[list[RankPlan], StepLayout | None]:
    """:func:`_plan_dynamic`'s result: with ``laid_out`` and ``layout`` known (then ``plan`` is ``[]``), the plan's
    :data:`StepLayout` and no lists; else the plan's lists."""
    return ([], layout) if laid_out and layout is not None else (plan, None)


def _layout_peak(layout: StepLayout, costs: Sequence[float]) -> float:
    """:func:`~megatron_dpsched.core.balancing.peak_cost` of a plan given as its :data:`StepLayout`."""
    per_rank, counts, flat = layout
    ends = np.concatenate(([0], np.cumsum(counts)))[np.cumsum(per_rank)]  # where each rank's samples end
    return float(run_sums(costs, flat, np.diff(ends, prepend=0)).max(initial=0.0))


def _plan_of(layout: StepLayout) -> list[RankPlan]:
    """The plan of a :data:`StepLayout` as lists."""
    per_rank, counts, flat = layout
    bins = runs_of(flat.tolist(), counts)
    return [bins[a:b] for a, b in pairwise(accumulate(per_rank.tolist(), initial=0))]


def _reached(
    best: list[RankPlan], costs: list[float], *, config: ScheduleConfig, count: int, upper: _GlobalCount,
    lower_bound: int,
) -> bool:
    """Whether ``count`` is step 5's largest: with ``balance_growth`` ``align(U * (1 + balance_growth))``; else
    ``U``, or when ``best``'s busiest rank costs more than :data:`~megatron_dpsched.core.objective.TAIL_IMBALANCE`
    above ``max(mean rank cost, dearest sample)`` (:func:`~megatron_dpsched.core.objective.tail_heavy`: a tail past
    the cap) ``max(U, B)``, ``B`` the most samples one rank holds
    (:func:`~megatron_dpsched.core.objective.count_bound`)."""
    if config.balance_growth:
        return count >= config.layout.align(math.ceil(upper.exact() * (1 + config.balance_growth)))
    if tail_heavy(best, costs) and count < count_bound(best, config=config, lower_bound=lower_bound):
        return False
    return upper.below(count + 1)  # count >= U


def _plan_step_time(
    default: list[RankPlan], sizes: list[int], costs: list[float], *, config: ScheduleConfig,
    tried: Packings | None = None, upper: _GlobalCount | None = None,
) -> list[RankPlan]:
    """Step 7: the default plan, or one at another count that the step-time model finds faster; a count step 5
    packed (``tried``) is not packed again, nor the global packing (``upper``: step 5's :class:`_GlobalCount`)."""
    growth_limit = None
    if config.balance_growth > 0:
        count = (upper or _GlobalCount(sizes, config)).exact()
        growth_limit = config.layout.align(math.ceil(count * (1 + config.balance_growth)))

    def replan(num_microbatches: int) -> list[RankPlan] | None:
        if tried and num_microbatches in tried:
            return tried.pop(num_microbatches)
        return plan_at_count(sizes, costs, config=config, num_microbatches=num_microbatches)

    return plan_for_step_time(
        default, sizes, costs, config=config, replan=replan,
        lower_bound=lower_bound_microbatches(sizes, config=config), growth_limit=growth_limit,
    )


def plan_at_count(
    sizes: list[int], costs: list[float], *, config: ScheduleConfig, num_microbatches: int
) -> list[RankPlan] | None:
    """Steps 3-4 at one count, refined as in step 5 when unbalanced; ``None`` if it does not fit."""
    plan = _assign_and_pack(sizes, costs, config=config, num_microbatches=num_microbatches)
    if plan is not None and peak_cost(plan, costs) > _balanced_peak(costs, config):
        _refine(plan, sizes, costs, config=config)
    return plan


def _balanced_peak(costs: list[float], config: ScheduleConfig) -> float:
    """The busiest rank's cost at which a plan counts as balanced (:data:`BALANCE_TOLERANCE`)."""
    return max(sum(costs) / config.dp_size, max(costs)) * (1 + BALANCE_TOLERANCE)


def _refine(
    plan: list[RankPlan] | None, sizes: list[int], costs: list[float], *, config: ScheduleConfig,
    layout: StepLayout | None = None,
) -> tuple[float, StepLayout | None]:
    """Step 5's refinement (:func:`~megatron_dpsched.core.balancing.refine_by_moves`, in place): single samples
    move off the busiest rank into a lighter rank's micro-batch with room while that lowers the busiest rank's
    cost, at most ``4 * dp_size`` moves; returns the refined plan's busiest rank's cost
    (:func:`~megatron_dpsched.core.balancing.peak_cost`) and, when the plan's :data:`StepLayout` is given, the
    refined plan's (``plan`` ``None``: its lists are not made)."""
    kwargs = {"sizes": sizes, "costs": costs, "cap": config.token_cap, "max_moves": 4 * config.dp_size,
              "padded_rows": config.padded_rows}
    if layout is None:
        return refine_by_moves(plan, **kwargs), None
    return refine_laid_out(plan, **kwargs, layout=layout)


def _bins_count(bins: list[list[int]], config: ScheduleConfig) -> int:
    """Micro-batches per rank when ``bins`` are dealt to the ranks (the legal count at or above)."""
    return config.layout.align(math.ceil(len(bins) / config.dp_size))


def _first_fitting_count(
    sizes: list[int], costs: list[float], *, config: ScheduleConfig, low: int, high: int,
    tried: Packings | None = None,
) -> tuple[int, list[RankPlan] | None]:
    """The smallest legal count in ``(low, high]`` whose per-rank packing fits, with its plan.

    ``low`` does not fit. Counts grow by doubling steps until one fits (or ``high`` is
    reached, where the global packing always fits), then bisect back between the last
    count that did not fit and the first that did: O(log(high - low)) packings instead of
    one per count (equal samples just over a third of the cap fit two per micro-batch, so
    every count between ``n / 3`` and ``n / 2`` fails). ``tried`` (when given) receives the counts that fail.
    """
    layout = config.layout

    def attempt(count: int) -> list[RankPlan] | None:
        return _assign_and_pack(sizes, costs, config=config, num_microbatches=count, tried=tried)

    if high <= low:  # ``low`` is the only count allowed and it does not fit (padded rows: ``M == U`` always)
        return low, None

    step, fitting, plan = 1, high, None
    while True:
        candidate = min(layout.align(low + step), high)
        plan = attempt(candidate)
        if plan is not None or candidate >= high:
            fitting = candidate
            break
        low, step = candidate, 2 * step
    while plan is not None and layout.next_legal(low) < fitting:
        middle = layout.align((low + fitting) // 2)
        if middle <= low or middle >= fitting:
            middle = layout.next_legal(low)
        smaller = attempt(middle)
        if smaller is None:
            low = middle
        else:
            fitting, plan = middle, smaller
    return fitting, plan


def _global_packing(sizes: list[int], config: ScheduleConfig) -> list[list[int]]:
    """The better of best-fit decreasing and first fit in arrival order over the whole step (so never more
    micro-batches per rank than a global first fit; best fit alone where its count per rank is step 2's lower
    bound, which first fit cannot beat, or on ties; first fit stops once a prefix shows it cannot end with
    fewer, :func:`~megatron_dpsched.core.packing.first_fit_below`); with ``padded_rows`` the chunking of
    :func:`~megatron_dpsched.core.packing.chunk_decreasing` (the fewest)."""
    items, cap = range(len(sizes)), config.token_cap
    if config.padded_rows:
        return best_fit_decreasing(items, sizes, cap, padded_rows=True)
    best_fit = best_fit_decreasing(items, sizes, cap)
    if _bins_count(best_fit, config) <= lower_bound_microbatches(sizes, config=config):
        return best_fit  # first fit cannot lower the count per rank
    return first_fit_below(items, sizes, cap, limit=len(best_fit)) or best_fit  # ties: best fit


def _deal_bins(
    bins: list[list[int]], sizes: Sequence[int], costs: Sequence[float], *, config: ScheduleConfig
) -> StepLayout:
    """Step 5's fallback: the global micro-batches ``bins`` split to ``U * dp_size``
    (:func:`~megatron_dpsched.core.packing.split_to_count`) and dealt to ranks by LPT on cost, which always
    works (``balance="none"``: round-robin); the plan as its :data:`StepLayout` (:func:`_plan_of`: its lists).
    ``bins`` are handed over (split in place).

    The bins are flattened once: their collated sizes, costs and the layout come from that, and only the bins
    the split made are read again."""
    dp, rows = config.dp_size, config.padded_rows
    num_microbatches = config.layout.align(math.ceil(len(bins) / dp))
    counts, flat = flat_lists(bins)
    size_array = np.asarray(sizes, dtype=np.int64)
    loads = padding.collated_of(counts, size_array[flat], padded_rows=rows)
    replaced: list[int] = []
    split = split_owned(bins, sizes, num_microbatches * dp, padded_rows=rows, loads=loads, replaced=replaced)
    del loads  # each array goes as soon as it is read: this is the fallback's peak of memory
    made = sorted(set(replaced)) + list(range(len(counts), len(split)))
    made_counts, made_flat = flat_lists([split[b] for b in made])
    bin_costs = None
    if config.balance != "none":
        bin_costs = np.concatenate((run_sums(costs, flat, counts), np.zeros(len(split) - len(counts))))
        bin_costs[made] = python_sums(costs, [split[b] for b in made])
    starts = np.zeros(len(split), dtype=np.int64)
    starts[:len(counts)] = np.cumsum(counts) - counts
    starts[made] = len(flat) + np.cumsum(made_counts) - made_counts
    counts = np.concatenate((counts, np.zeros(len(split) - len(counts), dtype=np.int64)))
    counts[made] = made_counts
    count = len(split)
    split.clear()  # its lists are read: freed here, in about the order they were made (the caller's bins are split)
    owners = assign_costed(count, num_ranks=dp, bin_costs=bin_costs)
    del bin_costs
    order = np.concatenate(owners)
    counts, starts = counts[order], starts[order]
    flat = np.concatenate((flat, made_flat)) if len(made_flat) else flat
    per_rank = np.fromiter(map(len, owners), dtype=np.int64, count=len(owners))
    return per_rank, counts, padding.gather_runs(flat, starts, counts)


def _assign_and_pack(
    sizes: list[int], costs: list[float], *, config: ScheduleConfig, num_microbatches: int,
    tried: Packings | None = None,
) -> list[RankPlan] | None:
    """Steps 3-4 for one candidate micro-batch count; ``None`` if it does not fit (:func:`_attempt`)."""
    return _attempt(sizes, costs, config=config, num_microbatches=num_microbatches, tried=tried)[0]


def _attempt(
    sizes: list[int], costs: list[float], *, config: ScheduleConfig, num_microbatches: int, laid_out: bool = False,
    tried: Packings | None = None,
) -> tuple[list[RankPlan] | None, StepLayout | None]:
    """:func:`_fit_count`; a count that does not fit noted in ``tried`` (when given)."""
    plan, layout = _fit_count(sizes, costs, config=config, num_microbatches=num_microbatches, laid_out=laid_out)
    if plan is None and tried is not None:
        tried[num_microbatches] = None
    return plan, layout


def _fit_count(
    sizes: list[int], costs: list[float], *, config: ScheduleConfig, num_microbatches: int, laid_out: bool
) -> tuple[list[RankPlan] | None, StepLayout | None]:
    """Steps 3-4 for one candidate micro-batch count: its plan, ``None`` if it does not fit; with ``laid_out``,
    where worst fit packed every rank, ``[]`` and the plan's :data:`StepLayout` instead (its lists never made).

    Step 3: samples to ranks by :func:`~megatron_dpsched.core.balancing.lpt_ranks` (each rank's samples an
    array), each rank with room for
    ``num_microbatches * C`` capped tokens (a sample weighs ``min(size, C)``: an oversize sample fills one
    micro-batch alone). Step 4: each rank's samples packed into exactly ``num_microbatches``
    (:func:`~megatron_dpsched.core.packing.pack_into`); ranks whose samples need more hand some over
    (:func:`_repair_overflow`).
    """
    cap, rows = config.token_cap, config.padded_rows
    if len(sizes) <= config.dp_size and num_microbatches >= 1:
        plan = _one_per_rank(sizes, costs, config=config, num_microbatches=num_microbatches)
        if plan is not None:
            return plan, None
    ranks = lpt_ranks(range(len(sizes)), costs=costs, weights=np.minimum(np.asarray(sizes, dtype=np.int64), cap),
                      capacity=num_microbatches * cap, num_ranks=config.dp_size)
    if ranks is None:
        return None, None
    refits: Refits = {}
    packed = pack_rank_arrays(ranks, sizes, cap, num_microbatches, padded_rows=rows, refits=refits)
    if laid_out and packed.worst.all():
        return [], (np.full(len(ranks), num_microbatches, dtype=np.int64), packed.bin_counts, packed.members)
    if not packed.failing():
        return packed.lists(), None
    return _repair_overflow(ranks, packed, sizes, costs, config=config, num_microbatches=num_microbatches,
                            refits=refits), None


Packings = dict[int, "list[RankPlan] | None"]
"""Step 5's plans of steps 3-4 by count, refined as :func:`plan_at_count` refines them (``None``: it does not fit)."""
KEPT_SAMPLES = 1 << 16
"""Step 5 keeps the plans it made for step 7 in steps of at most this many samples (more would hold several plans of
a large step at once)."""


def _one_per_rank(
    sizes: Sequence[int], costs: Sequence[float], *, config: ScheduleConfig, num_microbatches: int
) -> list[RankPlan] | None:
    """Steps 3-4 when there are no more samples than ranks and every cost is positive and finite (else ``None``):
    LPT then deals the samples dearest first (cost, then capped size descending, then id) to ranks 0, 1, ...
    (each rank dealt to is then heavier than the empty ones), one each, and packing puts a rank's one sample in
    its first micro-batch; every other micro-batch, and every rank past the samples, is empty."""
    cost_array = np.asarray(costs, dtype=np.float64)
    if not len(cost_array) or not (cost_array.min() > 0 and cost_array.max() < math.inf):
        return None
    capped = np.minimum(np.asarray(sizes, dtype=np.int64), config.token_cap)
    order = np.lexsort((np.arange(len(capped)), -capped, -cost_array)).tolist()
    rest = range(num_microbatches - 1)
    plan = [[[i], *[[] for _ in rest]] for i in order]
    plan.extend([[] for _ in range(num_microbatches)] for _ in range(config.dp_size - len(order)))
    return plan


def _repair_overflow(
    ranks: list[np.ndarray],
    packed: PackedRanks,
    sizes: list[int],
    costs: list[float],
    *,
    config: ScheduleConfig,
    num_microbatches: int,
    refits: Refits,
) -> list[RankPlan] | None:
    """A rank whose samples need more than ``num_microbatches`` micro-batches hands the samples of its emptiest
    ones (best-fit decreasing, by collated size) to the least-loaded ranks with room; ``None`` if one fits nowhere.
    ``refits``: those micro-batches where :func:`~megatron_dpsched.core.packing.pack_ranks` made them. ``packed``:
    each rank's micro-batches (made lists only once the repair may succeed)."""
    cap, rows = config.token_cap, config.padded_rows
    failing = packed.failing()
    missing = [rank for rank in failing if rank not in refits]
    if rows:
        refits.update((r, BinArrays.of(bins, collated_sizes(bins, sizes, padded_rows=True)))
                      for r, bins in zip(missing, (best_fit_decreasing(ranks[r], sizes, cap, padded_rows=True)
                                                   for r in missing), strict=True))
    else:
        refits.update((r, BinArrays.of(bins, loads)) for r, (bins, loads) in
                      zip(missing, best_fit_ranks([ranks[r] for r in missing], sizes, cap), strict=True))
    if _rehome_fails(packed, [refits[r] for r in failing], sizes=sizes, config=config,
                     num_microbatches=num_microbatches):
        return None
    counts, flat = flat_lists(ranks)
    loads = run_sums(costs, flat, counts).tolist()
    homeless: list[int] = []
    bins_per_rank = list(packed.lists())
    for rank, (bins, collated) in ((r, (refits[r].bins(), refits[r].loads.tolist())) for r in failing):
        order = sorted(range(len(bins)), key=lambda b: -collated[b])
        for item in (i for b in order[num_microbatches:] for i in bins[b]):
            homeless.append(item)
            loads[rank] -= costs[item]
        bins_per_rank[rank] = [bins[b] for b in order[:num_microbatches]]
    if not _rehome(sorted(homeless, key=lambda i: -sizes[i]), bins_per_rank, loads, sizes=sizes, costs=costs,
                   config=config):
        return None
    return [split_to_count(bins, sizes, num_microbatches, padded_rows=rows) for bins in bins_per_rank]


def _rehome_fails(
    packed: PackedRanks, refitted: list[BinArrays], *, sizes: Sequence[int], config: ScheduleConfig,
    num_microbatches: int,
) -> bool:
    """Whether :func:`_rehome` fails for certain, from the micro-batches' rooms and the homeless samples' sizes
    alone: its longest sample fits no micro-batch (rooms only shrink), or (packed tokens) the homeless samples
    outweigh all the room, or more of them are longer than ``t`` than there are micro-batches with room for
    ``t``, for some ``t`` over half the widest room (two such never share one).

    ``refitted``: each failing rank's refit micro-batches; its ``num_microbatches`` fullest (ties: the first)
    stay, the others' samples are homeless. ``packed``: the ranks' micro-batches (``None`` where one does not
    fit)."""
    cap, rows, size_array = config.token_cap, config.padded_rows, np.asarray(sizes, dtype=np.int64)
    collated = np.concatenate([bins.loads for bins in refitted]) if refitted else np.zeros(0, dtype=np.int64)
    counts = np.concatenate([bins.counts for bins in refitted]) if refitted else np.zeros(0, dtype=np.int64)
    per_rank = np.fromiter((len(bins.counts) for bins in refitted), dtype=np.int64, count=len(refitted))
    order = np.lexsort((-collated, np.repeat(np.arange(len(refitted)), per_rank)))  # by rank, fullest first
    stays = np.empty(len(order), dtype=bool)
    stays[order] = np.arange(len(order)) - np.repeat(np.cumsum(per_rank) - per_rank, per_rank) < num_microbatches
    members = np.concatenate([bins.members for bins in refitted]) if refitted else np.zeros(0, dtype=np.int64)
    homeless = size_array[members[~np.repeat(stays, counts)]]
    fit_counts, fills, longest = packed.figures(size_array)
    kept_longest = collated[stays] // np.maximum(counts[stays], 1) if rows else collated[stays]
    rooms = padding.rooms(counts=np.concatenate((counts[stays], fit_counts)),
                          fills=np.concatenate((collated[stays], fills)),
                          longest=np.concatenate((kept_longest, longest)), cap=cap, padded_rows=rows)
    return _surely_homeless(np.sort(homeless)[::-1], rooms, packed_tokens=not rows)


def _surely_homeless(left: np.ndarray, rooms: np.ndarray, *, packed_tokens: bool) -> bool:
    """:func:`_rehome_fails`' tests on the homeless sizes ``left`` (longest first) and the micro-batches' ``rooms``."""
    widest = int(rooms.max(initial=0))
    if not len(left) or int(left[0]) > widest:
        return bool(len(left))
    if not packed_tokens:
        return False
    if int(left.sum()) > int(np.maximum(rooms, 0).sum()):
        return True
    wide = left[2 * left > widest]  # at most one of these per micro-batch
    ascending = np.sort(rooms)
    room_for = len(ascending) - np.searchsorted(ascending, wide, side="left")  # micro-batches with room >= size
    return bool((np.arange(1, len(wide) + 1) > room_for).any())


def _rehome(
    homeless: list[int], bins_per_rank: list[RankPlan], loads: list[float], *,
    sizes: list[int], costs: list[float], config: ScheduleConfig,
) -> bool:
    """Each homeless sample (longest first) into the lightest rank with room (the first empty micro-batch, else
    the first with room); ``False`` if one fits nowhere. The micro-batches' fills, counts, longest samples and
    rooms come from NumPy (:func:`_bin_arrays`), rank by rank, and are then Python lists: each sample reads and
    updates a few entries, where NumPy's per-call cost would dominate."""
    cap, rows = config.token_cap, config.padded_rows
    first, counts, fills, longest = _bin_arrays(bins_per_rank, sizes)
    rooms = padding.rooms(counts=counts, fills=fills, longest=longest, cap=cap, padded_rows=rows)
    if not rows and sum(sizes[i] for i in homeless) > int(np.maximum(rooms, 0).sum()):
        return False  # not enough room left on all ranks together
    widest = padding.widest_rooms(rooms, first).tolist()
    counts, fills, longest, rooms = counts.tolist(), fills.tolist(), longest.tolist(), rooms.tolist()
    rank_loads = [float(load) for load in loads]
    for item in homeless:
        size = sizes[item]
        rank = min((r for r, wide in enumerate(widest) if wide >= size), key=rank_loads.__getitem__, default=None)
        if rank is None:
            return False
        a, z = first[rank], first[rank + 1]
        span = fills[a:z]  # the first empty micro-batch, else the first with room
        b = a + (span.index(0) if 0 in span else next(j for j, room in enumerate(rooms[a:z]) if room >= size))
        bins_per_rank[rank][b - a].append(item)
        counts[b], fills[b], longest[b] = counts[b] + 1, fills[b] + size, max(longest[b], size)
        rooms[b] = padding.room(count=counts[b], fill=fills[b], longest=longest[b], cap=cap, padded_rows=rows)
        widest[rank] = max(rooms[a:z])
        rank_loads[rank] += costs[item]
    return True


def _bin_arrays(
    bins_per_rank: list[RankPlan], sizes: list[int]
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """Where each rank's micro-batches start in the arrays, and each micro-batch's sample count, planned tokens
    and longest planned size (0 for an empty one)."""
    first = np.concatenate(([0], np.cumsum([len(bins) for bins in bins_per_rank]))).tolist()
    bins = list(chain.from_iterable(bins_per_rank))
    counts, _, fills, longest = padding.micro_batch_arrays(bins, np.asarray(sizes, dtype=np.int64))
    return first, counts, fills, longest
