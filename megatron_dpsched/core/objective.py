"""Step 7 of the contract: with a ``step_time_model``, the plan with the smallest simulated step time.

Balancing cost per rank at the fewest micro-batches leaves pipeline bubbles: with ``pp_size``
stages and ``M`` micro-batches, Megatron's 1F1B idles every stage for about ``(pp_size - 1) / M``
of a step. More, smaller micro-batches shrink the bubbles but pay a fixed cost each
(``seconds_per_microbatch``). The search here trades the two by replaying Megatron's schedule
(:mod:`megatron_dpsched.core.steptime`) on candidate plans, each packed by the machinery of steps
3-5 and ordered as it will run.

Only with a token cap and ``balance`` ``"cost"`` or ``"tokens"``. Steps 2-6 give the default plan at
count ``D``; the step runs whichever candidate has the smallest simulated step time: the slowest
rank's makespan (:func:`~megatron_dpsched.core.steptime.simulate_step`) on the candidate in run order
(:meth:`StepTimer.candidate`). The order is step 6's, except with ``pp_size > 1`` and order
``"pipeline"``: then each rank that can set the step time runs the fastest in the simulator of
:data:`~megatron_dpsched.core.ordering.PIPELINE_ORDERS` (step 6's cheapest at both ends, verl's,
descending, ascending), step 6's unless another is faster by more than :data:`ORDER_MARGIN`; the
plan records the order chosen. Candidates, all at legal counts of at most ``B``
(:func:`count_bound`; a default above ``B`` is repacked to ``B``):

* the default;
* plans of steps 3-4 at each legal count below ``D``, refined as in step 5 (:func:`_fewer_counts`);
* when the default's busiest rank, or that of the plan at the next fewer count, costs more than
  :data:`TAIL_IMBALANCE` above ``max(mean rank cost, dearest sample)`` (a tail past the cap kept step 5
  from balancing, or made it reach past ``U``, which it does by the busiest rank's cost alone and stops
  where more micro-batches cut it by less than its tolerance, short of the fastest count), plans of steps 3-4 at counts
  above ``D``, refined as in step 5, at most :data:`MAX_TAIL_COUNTS` (:func:`_tail_counts`);
* with ``pp_size > 1``, the ranks of the fastest candidate so far at ``D`` or above repacked (step 4)
  into more micro-batches (:func:`_more_counts`). With ``pp_size == 1`` a rank's time is the sum of its
  micro-batches' times, which more micro-batches of the same samples never lower.

Counts above ``D`` go up to ``B`` (each plan's own) and, with ``balance_growth > 0``, up to
``align(U * (1 + balance_growth))``. Of the candidates no slower than the default, :func:`choose` takes
the one with the fewest micro-batches within :data:`STEP_TIME_TOLERANCE` of the fastest. So with
``pp_size == 1``, no per-micro-batch time and costs proportional to the model's forward time, the plan is
the default plan whenever the default and the plan at the next fewer count are within :data:`TAIL_IMBALANCE`
of the least busiest-rank cost and
no count below ``D`` comes within :data:`STEP_TIME_TOLERANCE` of it (step 5 kept ``D`` only for a cut of
more than :data:`~megatron_dpsched.core.planning.BALANCE_TOLERANCE`).

Last, with ``pp_size > 1`` and no ``padded_rows`` (:func:`cost_equal`): at the chosen candidate's count,
each rank that can set the step time, from the slowest, is packed by
:func:`~megatron_dpsched.core.kk.differencing_pack` into micro-batches of near-equal forward time (step 4
evens tokens; a long sample's attention makes its micro-batch dearer) and runs that packing, in its
fastest order, where the simulator finds it faster by more than :data:`ORDER_MARGIN`; the step keeps
the result only when its step time is lower by that margin, else the candidate as it was (ties to it).
With ``pp_size == 1`` a rank's time is its micro-batches' sum, which no packing of its samples changes.

Then, where the result runs more than :data:`KK_SLACK` above :func:`ideal_seconds` (a floor: every rank the mean
work, the cheapest fill and drain; the time the lock-step or pipeline bound says is left on the table; with
``pp_size == 1``, where the floor is tight, more than :data:`KK_MARGIN`), :func:`kk_deals` deals the step's samples
to the ranks anew by Karmarkar-Karp (:func:`~megatron_dpsched.core.kk.kk_deal` on the samples' forward times, with
equal counts and plainly) and packs each rank at the chosen count and the :data:`KK_COUNTS` legal
counts above it (with ``pp_size > 1`` also below it, and each deal's own bound and the legal count below that,
:func:`_deal_counts`; cost-spread by :func:`~megatron_dpsched.core.kk.spread_pack`);
the fastest of these replaces the plan where it simulates faster by more than :data:`KK_MARGIN` (steps of at most
:data:`KK_MAX_SAMPLES` samples, no ``padded_rows``). Step 5 balances rank costs within its tolerance by moves; the
deal balances them further, and with a pipeline the micro-batches within each rank, as slime's and verl's
Karmarkar-Karp deals do.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import chain

import numpy as np

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.balancing import flat_ranks, peak_cost, rank_maxima, run_sums
from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.kk import differencing_pack, kk_deal, spread_pack
from megatron_dpsched.core.ordering import PIPELINE_ORDERS, arrange_rows, arrangements, order_micro_batches
from megatron_dpsched.core.packing import BinArrays, chunk_ranks, pack_ranks, split_owned
from megatron_dpsched.core.steptime import VECTOR_RANKS, StepTimeModel, rank_makespans, row_makespans

STEP_TIME_TOLERANCE = 0.005
"""Among candidates within this share of the fastest, the one with the fewest micro-batches wins (small: a plan
must stay within 1% of the fastest count's at PP=1 and a heavy tail's best count can be a few percent
faster than the next one down)."""
COUNT_GROWTH = 0.1
"""Counts above the default grow by at least this share per candidate (at least to the next legal count)."""
MAX_STALE_COUNTS = 2
"""A count search stops after this many candidates in a row brought no better plan: step 5's growing
count (the samples are too coarse to balance, e.g. ``dp_size + 1`` equal samples) and step 7's search
in each direction (not faster)."""
SEARCH_SPAN = 2.0
"""Step 7's upward search goes on past :data:`MAX_STALE_COUNTS` slower candidates until the count is this
many times the fastest count so far (packing granularity makes plateaus: equal samples run no faster at
11-15 micro-batches than at 11 until 16 halve them)."""
SCREEN_RANKS = 8
"""Upward candidates are timed on this many ranks with the most work and as many with the dearest sample only;
the winners are then timed in full."""
SCREEN_TOLERANCE = 0.02
"""Of the screened counts, the fewest within this share of the fastest is timed in full (the screened ranks
alone understate a larger count's time), and the fastest too when it screens more than :data:`STEP_TIME_TOLERANCE`
faster (where the screen does not understate, :func:`choose` then takes it)."""
ORDER_MARGIN = 1e-9
"""Another of :data:`~megatron_dpsched.core.ordering.PIPELINE_ORDERS` replaces step 6's order on a rank only
when it runs that rank faster by more than this share (the same times summed in another order differ in
their last bits)."""
TAIL_IMBALANCE = 0.05
"""Step 7 also times fresh plans at counts above the default's (:func:`_tail_counts`) when the default's
busiest rank costs more than this share above ``max(mean rank cost, dearest sample)``, the least any plan's
busiest rank can cost: the token cap kept step 5 from balancing (a sample past the cap fills one
micro-batch of a rank's capacity in step 3 however much it costs), and lock-stepped ranks all wait for
the busiest."""
COST_EQUAL_SAMPLES = 16384
""":func:`cost_equal` repacks the slowest ranks until it has repacked this many samples (at least
:data:`COST_EQUAL_RANKS` ranks): with many near-equal ranks each repacked rank lowers the step only to the next
one's time, so the step gains only when every rank above the new step time is repacked (DP 512 with 32
samples per rank: all of them); a bound on the planning time where ranks hold many samples."""
COST_EQUAL_RANKS = 16
"""The fewest ranks :func:`cost_equal` may repack, however many samples they hold."""
KK_SLACK = 0.001
""":func:`kk_deals` runs only where the chosen plan is more than this share above :func:`ideal_seconds` (with
``pp_size == 1``, where that is a floor, more than :data:`KK_MARGIN`)."""
KK_MARGIN = 0.0025
"""A KK-dealt plan (:func:`kk_deals`) replaces the chosen one only when faster by more than this share (half the
0.5% a step may trail a peer: the default plan stays where the deal gains little)."""
KK_COUNTS = 1
"""Legal counts on each side of the chosen one that :func:`kk_deals` also tries."""
KK_MAX_SAMPLES = 16384
""":func:`kk_deals` deals steps of at most this many samples (32 per rank on 512 ranks): a larger step holds enough
samples per rank for steps 3-5 to balance it, and dealing and packing it anew costs more than it pays."""
KK_PLAIN_LIMIT = 2**20
"""Samples times ranks up to which :func:`kk_deals` also deals plainly (one partial partition of ``dp_size`` parts
per sample)."""
MAX_TAIL_COUNTS = 12
"""At most this many fresh plans above the default's count are timed per step (:func:`_tail_counts`)."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One plan of a step at one count, ordered as it will run, with its simulated step time."""

    num_microbatches: int
    seconds: float
    plan: list[RankPlan]
    rank_seconds: list[float] | None = None
    """Each rank's simulated makespan in ``plan``'s order (``None`` where not simulated: a screen's candidate)."""
    settled: frozenset[int] = frozenset()
    """The ranks that run the fastest of the orders timed (:func:`_choose_orders`; with one order, every rank)."""


@dataclass(frozen=True, kw_only=True)
class StepTimer:
    """Orders and times candidate plans of one step (local sample ids)."""

    sizes: Sequence[int]
    costs: Sequence[float]
    config: ScheduleConfig

    def candidate(self, plan: list[RankPlan]) -> Candidate:
        """``plan`` in run order with the slowest rank's simulated makespan: step 6's order, or with
        ``pp_size > 1`` and order ``"pipeline"`` the fastest order of each rank (:func:`_choose_orders`). Where
        many ranks are timed at once (:meth:`_rows_apply`), ``plan``'s micro-batches are sorted in place and are
        the candidate's."""
        order = self.config.microbatch_order
        if order not in PIPELINE_ORDERS:
            ordered = [order_micro_batches(rank, self.costs, order) for rank in plan]
            spans = self._makespans(ordered)
            return Candidate(num_microbatches=len(plan[0]), seconds=max(spans), plan=ordered, rank_seconds=spans,
                             settled=frozenset(range(len(plan))))
        orders = PIPELINE_ORDERS if self.config.pp_size > 1 and order == PIPELINE_ORDERS[0] else (order,)
        if self._rows_apply(plan):
            return self._candidate_rows(plan, orders)
        arranged = [arrangements(rank, self.costs, orders) for rank in plan]
        times = self._batch_times([batches for batches, _ in arranged])
        flat = self._spans([tuple(map(rank_times.__getitem__, positions[k])) for k in range(len(orders))
                            for rank_times, (_, positions) in zip(times, arranged)])  # every order in one pass
        spans = [flat[k * len(plan):(k + 1) * len(plan)] for k in range(len(orders))]
        choice, chosen, settled = _choose_orders(spans)
        ordered = [[batches[b] for b in positions[k]] for k, (batches, positions) in zip(choice, arranged)]
        return Candidate(num_microbatches=len(plan[0]), seconds=max(chosen), plan=ordered, rank_seconds=chosen,
                         settled=settled)

    def _rows_apply(self, plan: list[RankPlan]) -> bool:
        """:meth:`_candidate_rows` applies: many ranks (or :data:`ROWS_MICRO_BATCHES` micro-batches) of one count,
        forward times exact in NumPy."""
        return ((len(plan) >= VECTOR_RANKS or len(plan) * len(plan[0]) >= ROWS_MICRO_BATCHES)
                and self._planned is not None and len(set(map(len, plan))) == 1)

    def _candidate_rows(self, plan: list[RankPlan], orders: Sequence[str]) -> Candidate:
        """:meth:`candidate` of many ranks of one count at once with NumPy, the same plan and times: each rank's
        micro-batches sorted by (Python's sum of their costs in sample order, first sample) in one sort, arranged
        in every order by index arithmetic, and every rank in every order simulated in one pass."""
        ranks, count = len(plan), len(plan[0])
        batches = list(chain.from_iterable(plan))
        lengths = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        items = np.fromiter(chain.from_iterable(batches), dtype=np.int64, count=int(lengths.sum()))
        items, batch_array = self._sort_batches(batches, items, lengths)
        filled = lengths > 0
        firsts = np.full(len(batches), -1, dtype=np.int64)  # an empty micro-batch sorts before any of equal cost
        firsts[filled] = items[(np.cumsum(lengths) - lengths)[filled]]
        keys = self._cost_sums(items, lengths, batches=batch_array)
        by_rank = np.lexsort((firsts.reshape(ranks, count), keys.reshape(ranks, count)), axis=1)
        ascending = by_rank + np.arange(0, ranks * count, count)[:, None]  # positions in ``batches``
        positions = np.stack([arrange_rows(ascending, order) for order in orders])
        times = self._flat_times(items, lengths)[positions.reshape(-1, count)]
        seconds = self._row_seconds(times, lengths.reshape(ranks, count), items, orders)
        choice, chosen, settled = _choose_orders([seconds[k * ranks:(k + 1) * ranks] for k in range(len(orders))])
        ordered = batch_array[positions[np.asarray(choice), np.arange(ranks)]].tolist()  # the lists themselves
        return Candidate(num_microbatches=count, seconds=max(chosen), plan=ordered, rank_seconds=chosen,
                         settled=settled)

    def makespans(self, ordered: list[RankPlan]) -> list[float]:
        """Each rank's simulated makespan, its micro-batches run in the given order."""
        return self._makespans(ordered)

    def sample_times(self, *, as_array: bool = False) -> Sequence[float]:
        """Each sample's forward time in the step-time model, without the per-micro-batch time (a micro-batch's
        is their sum plus that, without ``padded_rows``): a list, or with ``as_array`` the same values as a NumPy
        array where they are computed in NumPy (exact planned sizes)."""
        model = self.config.step_time_model
        assert model is not None
        a, b = model.seconds_per_token, model.seconds_per_token_pair
        if self._planned is None:
            return [a * size + b * size * size for size in self.sizes]
        with np.errstate(over="ignore", invalid="ignore"):  # as Python floats: inf and nan, no warning
            times = a * self._planned + b * self._planned * self._planned  # elementwise, as Python
        return times if as_array else times.tolist()

    def _batch_times(self, ranks: list[RankPlan]) -> list[list[float]]:
        """:meth:`_forward_time` of every micro-batch of every rank; with many ranks in one NumPy pass when its
        token and pair sums are exact in floating point (as Python's integer sums are)."""
        if len(ranks) < VECTOR_RANKS or self._planned is None:
            return [[self._forward_time(mb) for mb in rank] for rank in ranks]
        batches = list(chain.from_iterable(ranks))
        counts = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        items = np.fromiter(chain.from_iterable(batches), dtype=np.int64, count=int(counts.sum()))
        seconds = self._flat_times(items, counts).tolist()
        bounds = np.cumsum([len(rank) for rank in ranks]).tolist()
        return [seconds[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]

    @np.errstate(over="ignore", invalid="ignore")  # as Python floats: inf and nan, no warning
    def _flat_times(self, items: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The forward time of each micro-batch laid end to end in ``items`` (``counts``: their sample counts), in
        one NumPy pass (its sums of planned sizes and their squares are exact; with ``padded_rows`` its sample count
        times its longest planned size, and that times the longest again, exact too)."""
        model, planned = self.config.step_time_model, self._planned
        assert model is not None and planned is not None
        sizes = planned[items]
        if self.config.padded_rows:
            filled = counts > 0  # each filled one's samples run from its start to the next filled one's
            longest = np.zeros(len(counts))
            if len(sizes):
                longest[filled] = np.maximum.reduceat(sizes, (np.cumsum(counts) - counts)[filled])
            tokens = counts * longest
            pairs = tokens * longest
        else:
            owner = np.repeat(np.arange(len(counts)), counts)
            tokens = np.bincount(owner, weights=sizes, minlength=len(counts))
            pairs = np.bincount(owner, weights=sizes * sizes, minlength=len(counts))
        tokens[counts == 0] = pairs[counts == 0] = 1.0
        return model.seconds_per_token * tokens + model.seconds_per_token_pair * pairs + model.seconds_per_microbatch

    def _row_seconds(
        self, times: np.ndarray, lengths: np.ndarray, items: np.ndarray, orders: Sequence[str]
    ) -> list[float]:
        """The makespan of every row of ``times`` (each order's ranks, order by order). Where every rank holds one
        sample (``lengths``: per rank and micro-batch), its row is dummies but that sample's time at the same place
        in every rank, so a rank's makespan in an order is a function of the sample's planned size: those timed
        before, in this or an earlier step (:data:`_ONE_SAMPLE_SPANS`), are looked up, the rest simulated."""
        model = self.config.step_time_model
        assert model is not None and self._planned is not None
        layout, backward = self.config.layout, model.backward_factor
        ranks, count = lengths.shape
        if not (lengths.max(initial=0) <= 1 and bool((lengths.sum(axis=1) == 1).all())
                and self._planned[items].max(initial=0) < ONE_SAMPLE_LIMIT
                and self._cost_array[items].min(initial=1.0) > 0):  # the sample runs after the dummies
            return row_makespans(times, layout=layout, backward_factor=backward)
        sizes = self._planned[items].astype(np.int64)  # each rank's sample's, rank by rank
        table = _one_sample_table((layout, count, model, tuple(orders)), int(sizes.max()) + 1)
        spans = table[:, sizes]
        missing = np.flatnonzero(np.isnan(spans).any(axis=0))
        if len(missing):
            rows = times.reshape(len(orders), ranks, count)[:, missing].reshape(-1, count)
            found = np.array(row_makespans(rows, layout=layout, backward_factor=backward)).reshape(len(orders), -1)
            spans[:, missing] = table[:, sizes[missing]] = found
        return spans.ravel().tolist()

    @staticmethod
    def _sort_batches(
        batches: list[list[int]], items: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``items`` (the micro-batches' samples end to end) with each micro-batch's samples in index order, and the
        micro-batches (an object array): ``batches`` themselves, each sorted in place where one is out of order (a
        candidate's plan is its own: no list or number is made again)."""
        owners = np.repeat(np.arange(len(batches)), lengths)
        if bool(((items[1:] < items[:-1]) & (owners[1:] == owners[:-1])).any()):
            deque(map(list.sort, batches), maxlen=0)
            items = items[np.argsort(owners * (int(items.max()) + 1) + items, kind="stable")]
        return items, np.fromiter(batches, dtype=object, count=len(batches))

    def _cost_sums(self, items: np.ndarray, lengths: np.ndarray, *, batches: np.ndarray) -> np.ndarray:
        """Python's sum of each micro-batch's costs (its samples end to end in ``items``, in that order; ``batches``:
        the same micro-batches as lists): with at most one sample each its cost (``0 + cost``) or 0; in Python where
        there are few micro-batches for their widest (NumPy's pass per sample position would cost more); from the
        few costs taken where these are a small share of the step's Python floats."""
        width = int(lengths.max(initial=0))
        if self._float_costs and width <= 1:
            sums = np.zeros(len(lengths))
            sums[lengths > 0] = self._cost_array[items]
            return sums
        if len(lengths) < PYTHON_SUM_RUNS * width:
            get = self.costs.__getitem__
            return np.fromiter([sum(map(get, batch)) for batch in batches], dtype=np.float64, count=len(batches))
        if 4 * len(items) < len(self.costs) and self._float_costs:
            return run_sums(self._cost_array[items].tolist(), np.arange(len(items)), lengths)
        return run_sums(self.costs, items, lengths)

    @cached_property
    def _float_costs(self) -> bool:
        """Every cost is a Python float (:attr:`_cost_array` gives them back bit for bit)."""
        return set(map(type, self.costs)) == {float}

    @cached_property
    def _cost_array(self) -> np.ndarray:
        return np.asarray(self.costs, dtype=np.float64)

    def _makespans(self, ordered: list[RankPlan]) -> list[float]:
        """Each rank's simulated makespan, its micro-batches run in the given order."""
        return self._spans([tuple(times) for times in self._batch_times(ordered)])

    def _spans(self, times: list[tuple[float, ...]]) -> list[float]:
        """Each rank's simulated makespan from its micro-batches' forward times in run order."""
        model = self.config.step_time_model
        assert model is not None
        return rank_makespans(times, layout=self.config.layout, backward_factor=model.backward_factor)

    @np.errstate(over="ignore", invalid="ignore")  # as Python floats: inf and nan, no warning
    def busiest(self, plan: list[RankPlan]) -> list[RankPlan]:
        """The ranks of ``plan`` a larger count is screened on: the :data:`SCREEN_RANKS` with the most work
        (forward time of their samples) and the :data:`SCREEN_RANKS` with the dearest sample (ties: more work),
        each once. At many micro-batches a pipeline's fill and drain, set by a rank's largest micro-batch,
        outweigh its work: there the slowest rank holds the dearest sample, not the most work."""
        model = self.config.step_time_model
        assert model is not None
        a, b = model.seconds_per_token, model.seconds_per_token_pair
        planned = np.asarray(self.sizes, dtype=np.float64) if self._planned is None else self._planned
        values = a * planned + b * planned * planned
        counts, flat = flat_ranks(plan)
        loads = _python_sums(values, flat, counts)  # Python's sum of each rank's work, plan order
        dearest = rank_maxima(plan, values, flat=(counts, flat))
        by_work = sorted(range(len(plan)), key=lambda r: -loads[r])[:SCREEN_RANKS]
        by_sample = sorted(range(len(plan)), key=lambda r: (-dearest[r], -loads[r]))[:SCREEN_RANKS]
        return [plan[r] for r in dict.fromkeys(by_work + by_sample)]

    @cached_property
    def _planned(self) -> np.ndarray | None:
        """The planned sizes as floats, ``None`` when a sum of their squares might not be exact in floating point."""
        exact = max(self.sizes) ** 2 * len(self.sizes) < 2**53
        return np.asarray(self.sizes, dtype=np.float64) if exact else None

    @cached_property
    def _squares(self) -> list[int]:
        return [size * size for size in self.sizes]

    def _forward_time(self, micro_batch: Sequence[int]) -> float:
        """:meth:`StepTimeModel.forward_time` of the micro-batch's planned sizes, what runs (a dummy counts
        one token); with ``padded_rows`` every row as long as the longest."""
        model = self.config.step_time_model
        assert model is not None
        sizes = self.sizes
        if not micro_batch:
            tokens = pairs = 1
        elif self.config.padded_rows:
            longest = max(map(sizes.__getitem__, micro_batch))
            tokens, pairs = len(micro_batch) * longest, len(micro_batch) * longest * longest
        else:
            tokens = sum(map(sizes.__getitem__, micro_batch))
            pairs = sum(map(self._squares.__getitem__, micro_batch))
        return model.seconds_per_token * tokens + model.seconds_per_token_pair * pairs + model.seconds_per_microbatch


def _python_sums(values: np.ndarray, flat: np.ndarray, counts: np.ndarray) -> list[float]:
    """:func:`~megatron_dpsched.core.balancing.run_sums` of ``values`` (float64) as Python floats over the runs laid
    end to end in ``flat`` (``counts``: their lengths), made Python floats a block of runs at a time (about
    :data:`SUM_BLOCK` values: each run's sum is its own); in Python where there are few runs for the longest
    (:data:`PYTHON_SUM_RUNS`)."""
    ends = np.cumsum(counts)
    if len(flat) <= SUM_BLOCK and len(counts) < PYTHON_SUM_RUNS * int(counts.max(initial=0)):
        taken, stops = values[flat].tolist(), ends.tolist()
        return [sum(taken[a:b]) for a, b in zip([0, *stops[:-1]], stops)]
    cuts = np.unique(np.searchsorted(ends, np.arange(SUM_BLOCK, int(ends[-1]) if len(ends) else 0, SUM_BLOCK)))
    bounds = [0, *cuts.tolist(), len(counts)]
    sums: list[float] = []
    for a, b in zip(bounds, bounds[1:]):
        start, stop = int(ends[a - 1]) if a else 0, int(ends[b - 1]) if b else 0
        sums += run_sums(values[flat[start:stop]].tolist(), np.arange(stop - start), counts[a:b]).tolist()
    return sums


SUM_BLOCK = 1 << 17
""":func:`_python_sums` makes at most about this many values Python floats at once (4 MiB of floats)."""
PYTHON_SUM_RUNS = 32
""":meth:`StepTimer._cost_sums` sums in Python below this many micro-batches per sample of the widest one (NumPy
then costs more: about 40 Python micro-batch sums per NumPy pass over one sample position)."""
ROWS_MICRO_BATCHES = 256
""":meth:`StepTimer.candidate` times fewer than :data:`~megatron_dpsched.core.steptime.VECTOR_RANKS` ranks at once too
where they hold this many micro-batches (a long pipeline schedule)."""
ONE_SAMPLE_LIMIT = 2**16
""":meth:`StepTimer._row_seconds` keeps the makespans of ranks of one sample up to this planned size (a table is at
most this many floats wide per order: 512 KiB)."""
ONE_SAMPLE_TABLES = 8
"""How many layouts, counts, models and orders :data:`_ONE_SAMPLE_SPANS` keeps (the latest used)."""
_OneSampleKey = tuple[PipelineLayout, int, StepTimeModel, tuple[str, ...]]
_ONE_SAMPLE_SPANS: OrderedDict[_OneSampleKey, np.ndarray] = OrderedDict()
"""Per (layout, count, step-time model, orders): the makespan of a rank of one sample in each order by the
sample's planned size (NaN: not timed yet); shared by the steps of a schedule and by later schedules."""
_ONE_SAMPLE_LOCK = threading.Lock()


def _one_sample_table(key: _OneSampleKey, width: int) -> np.ndarray:
    """:data:`_ONE_SAMPLE_SPANS`' table for ``key``, at least ``width`` sizes wide (made or widened with NaN)."""
    with _ONE_SAMPLE_LOCK:
        table = _ONE_SAMPLE_SPANS.pop(key, None)
        if table is None or table.shape[1] < width:
            wider = np.full((len(key[3]), max(width, 0 if table is None else 2 * table.shape[1])), np.nan)
            if table is not None:
                wider[:, :table.shape[1]] = table
            table = wider
        _ONE_SAMPLE_SPANS[key] = table
        while len(_ONE_SAMPLE_SPANS) > ONE_SAMPLE_TABLES:
            _ONE_SAMPLE_SPANS.popitem(last=False)
        return table


def _choose_orders(spans: list[list[float]]) -> tuple[list[int], list[float], frozenset[int]]:
    """Which of the orders timed (``spans[k][rank]``: rank's makespan in order ``k``; order 0 step 6's) each rank
    runs, its makespan, and the ranks that run their fastest order: ranks from the slowest in order 0, each in the
    fastest order (order 0 unless another is faster by more than :data:`ORDER_MARGIN`), until the next rank's
    makespan cannot be the step time."""
    first = spans[0]
    choice, chosen = [0] * len(first), list(first)
    if len(spans) == 1:
        return choice, chosen, frozenset(range(len(first)))
    step, settled = 0.0, []
    for rank in sorted(range(len(first)), key=first.__getitem__, reverse=True):  # stable: ties in rank order
        if chosen[rank] <= step:
            break
        for k in range(1, len(spans)):
            if spans[k][rank] < chosen[rank] * (1 - ORDER_MARGIN):
                choice[rank], chosen[rank] = k, spans[k][rank]
        step = max(step, chosen[rank])
        settled.append(rank)
    return choice, chosen, frozenset(settled)


def count_bound(plan: list[RankPlan], *, config: ScheduleConfig, lower_bound: int, most: int | None = None) -> int:
    """``B = max(M, align(n))``, the most micro-batches a step-time plan may run: the aligned lower bound
    ``M``, or enough for the rank with the most samples (``n``, :func:`most_samples`; ``most`` where known) to
    run one per micro-batch (beyond that every rank would only add empty micro-batches)."""
    return max(lower_bound, config.layout.align(most_samples(plan) if most is None else most))


def most_samples(plan: list[RankPlan]) -> int:
    """The most samples one rank of ``plan`` holds."""
    return max(map(sum, map(partial(map, len), plan)))


def plan_for_step_time(
    default: list[RankPlan],
    sizes: Sequence[int],
    costs: Sequence[float],
    *,
    config: ScheduleConfig,
    replan: Callable[[int], list[RankPlan] | None],
    lower_bound: int,
    growth_limit: int | None = None,
) -> list[RankPlan]:
    """The fastest of the default plan, plans at fewer counts (``replan``), with a heavy tail plans at more
    counts (:data:`TAIL_IMBALANCE`) and, with pipelining, the fastest of these so far with its rank
    assignment repacked into more micro-batches; ties go to fewer micro-batches."""
    timer = StepTimer(sizes=sizes, costs=costs, config=config)
    most = most_samples(default)
    bound = count_bound(default, config=config, lower_bound=lower_bound, most=most)
    fitted = default if len(default[0]) <= bound else repack_ranks(default, sizes, config, bound)
    assert fitted is not None, "one sample per micro-batch always fits"
    # step 5 may have reached; with one sample a rank, no rank costs more than the dearest sample
    heavy = most > 1 and tail_heavy(fitted, costs)  # in the default's own order: the candidate sorts its lists
    base = timer.candidate(fitted)
    fewer = _fewer_counts(base, timer, replan=replan, lower_bound=lower_bound)
    candidates = [base, *fewer]
    limit = bound if growth_limit is None else max(base.num_microbatches, min(bound, growth_limit))
    if heavy or (fewer and tail_heavy(fewer[0].plan, costs)):
        candidates += _tail_counts(base, timer, replan=replan, limit=limit, lower_bound=lower_bound)
    if config.pp_size > 1:  # with one stage a rank's time is its micro-batches' sum: more never help
        seed = min((c for c in candidates if c.num_microbatches >= base.num_microbatches), key=lambda c: c.seconds)
        # the base holds the default's samples on each rank (repacked, reordered): the same bound
        own = bound if seed is base else count_bound(seed.plan, config=config, lower_bound=lower_bound)
        candidates += _more_counts(seed, timer, limit=max(seed.num_microbatches, min(limit, own)))
    chosen = cost_equal(choose(candidates, ceiling=base.seconds), timer)
    top = None if growth_limit is None else max(chosen.num_microbatches, growth_limit)
    dealt = min(kk_deals(chosen, timer, lower_bound=lower_bound, limit=top), key=lambda c: c.seconds, default=chosen)
    return (dealt if dealt.seconds < chosen.seconds * (1 - KK_MARGIN) else chosen).plan


def ideal_seconds(timer: StepTimer, count: int) -> float:
    """A floor of the step time at ``count`` micro-batches: the busiest rank holds at least the mean work (and the
    dearest sample), each micro-batch pays ``seconds_per_microbatch``, and with ``pp_size > 1`` the first stage
    also waits for the fill and drain of the cheapest micro-batch possible (a one-token dummy) over the other
    stages (``(pp_size - 1) / vpp_size`` of it). What the lock-step or pipeline bound leaves on the table is a
    plan's time above it (:func:`kk_deals`)."""
    config, model = timer.config, timer.config.step_time_model
    assert model is not None
    times = timer.sample_times()
    work = max(math.fsum(times) / config.dp_size, max(times)) + count * model.seconds_per_microbatch
    cheapest = model.seconds_per_token + model.seconds_per_token_pair + model.seconds_per_microbatch
    fill = (config.pp_size - 1) / config.vpp_size * cheapest
    return (1 + model.backward_factor) * (work + fill) / config.pp_size


def kk_deals(chosen: Candidate, timer: StepTimer, *, lower_bound: int, limit: int | None = None) -> list[Candidate]:
    """Where ``chosen`` runs more than :data:`KK_SLACK` above :func:`ideal_seconds` at the best of its count and the
    counts tried: the step's samples dealt to the ranks by largest differencing on their forward times
    (:func:`~megatron_dpsched.core.kk.kk_deal`), with equal counts and, within
    :data:`KK_PLAIN_LIMIT`, plainly (a tail past the cap wants fewer samples beside a giant), each rank packed
    (:func:`_pack_dealt`) at the chosen count and the :data:`KK_COUNTS` legal counts above it and, with
    ``pp_size > 1``, below it and near each deal's own bound (:func:`_deal_counts`), within that bound
    (:func:`count_bound`) and ``limit`` (``balance_growth``'s).
    Steps of at most :data:`KK_MAX_SAMPLES` samples and more than one per rank, without ``padded_rows`` (rows of
    the longest sample are step 4's)."""
    config = timer.config
    if config.padded_rows or not config.dp_size < len(timer.sizes) <= KK_MAX_SAMPLES:
        return []  # one sample per rank: every deal runs the same step
    counts = _neighbours(chosen.num_microbatches, config.layout, lower_bound=lower_bound if config.pp_size > 1
                         else chosen.num_microbatches)  # one stage: fewer counts are step 7's own search
    slack = KK_MARGIN if config.pp_size == 1 else KK_SLACK
    if chosen.seconds <= min(ideal_seconds(timer, count) for count in counts) * (1 + slack):
        return []
    times, found = timer.sample_times(), []
    deals = [True, False] if len(times) * config.dp_size <= KK_PLAIN_LIMIT else [True]
    for equal_counts in deals:
        ranks = kk_deal(range(len(times)), costs=times, num_parts=config.dp_size, equal_counts=equal_counts)
        bound = count_bound([[rank] for rank in ranks], config=config, lower_bound=lower_bound)
        bound = bound if limit is None else min(bound, limit)
        for count in (c for c in _deal_counts(counts, bound, config.layout) if c <= bound):
            plan = _pack_dealt(ranks, timer, count=count)
            if plan is not None:
                found.append(timer.candidate(plan))
    return found


def _deal_counts(counts: list[int], bound: int, layout: PipelineLayout) -> list[int]:
    """``counts`` and, with ``pp_size > 1``, a deal's own bound and the :data:`KK_COUNTS` legal counts below it (a
    pipeline's bubble shrinks with more micro-batches: the deal may win there where the chosen count's neighbours
    do not)."""
    if layout.pp_size == 1 or bound in counts:
        return counts
    near = _neighbours(bound, layout, lower_bound=max(counts) + 1)
    return counts + [c for c in near if c <= bound and c not in counts]


def _neighbours(count: int, layout: PipelineLayout, *, lower_bound: int) -> list[int]:
    """``count`` and the :data:`KK_COUNTS` legal counts on each side of it (none below ``lower_bound``), nearest
    first."""
    below, above, out = count, count, [count]
    for _ in range(KK_COUNTS):
        below = max((c for c in range(lower_bound, below) if layout.is_legal(c)), default=None) if below else None
        above = layout.next_legal(above)
        out += [c for c in (below, above) if c is not None]
    return out


def _pack_dealt(ranks: list[list[int]], timer: StepTimer, *, count: int) -> list[RankPlan] | None:
    """Each dealt rank in ``count`` micro-batches under the cap: with ``pp_size > 1`` by
    :func:`~megatron_dpsched.core.kk.spread_pack` on the samples' forward times (a pipeline's time depends on each
    micro-batch's), else (or where that finds no room) by step 4; ``None`` when a rank does not fit."""
    config = timer.config
    cap = config.token_cap
    assert cap is not None
    packed: list[RankPlan | None] = [None] * len(ranks)
    if config.pp_size > 1:
        packed = spread_pack(ranks, sizes=timer.sizes, costs=timer.sample_times(), cap=cap, num_bins=count)
    rest = [r for r, bins in enumerate(packed) if bins is None]
    for r, bins in zip(rest, pack_ranks([ranks[r] for r in rest], timer.sizes, cap, count, padded_rows=False)):
        packed[r] = bins
    return None if any(bins is None for bins in packed) else packed  # type: ignore[return-value]


def tail_heavy(plan: list[RankPlan], costs: Sequence[float]) -> bool:
    """The busiest rank of ``plan`` costs more than :data:`TAIL_IMBALANCE` above ``max(mean, dearest sample)``."""
    floor = max(sum(costs) / len(plan), max(costs))  # the plan holds every sample of the step
    return peak_cost(plan, costs) > floor * (1 + TAIL_IMBALANCE)


def choose(candidates: list[Candidate], *, ceiling: float, tolerance: float = STEP_TIME_TOLERANCE) -> Candidate:
    """Fewest micro-batches within ``tolerance`` of the fastest, never slower than ``ceiling``."""
    eligible = [c for c in candidates if c.seconds <= ceiling]
    fastest = min(c.seconds for c in eligible)
    near = [c for c in eligible if c.seconds <= fastest * (1 + tolerance)]
    return min(near, key=lambda c: (c.num_microbatches, c.seconds))


def _fewer_counts(
    base: Candidate, timer: StepTimer, *, replan: Callable[[int], list[RankPlan] | None], lower_bound: int
) -> list[Candidate]:
    """Plans at legal counts below the default's (``replan``), downward until one does not fit or
    :data:`MAX_STALE_COUNTS` in a row are not faster."""
    layout, found, best, stale = timer.config.layout, [], base.seconds, 0
    for count in range(base.num_microbatches - 1, lower_bound - 1, -1):
        if not layout.is_legal(count):
            continue
        plan = replan(count)
        if plan is None:
            break
        found.append(timer.candidate(plan))
        best, stale = (found[-1].seconds, 0) if found[-1].seconds < best else (best, stale + 1)
        if stale >= MAX_STALE_COUNTS:
            break
    return found


def _tail_counts(
    base: Candidate, timer: StepTimer, *, replan: Callable[[int], list[RankPlan] | None], limit: int,
    lower_bound: int,
) -> list[Candidate]:
    """Fresh plans (``replan``) at counts above the default's, up to ``limit`` and each count's own bound
    (:func:`count_bound`), at most :data:`MAX_TAIL_COUNTS`: counts growing by :data:`COUNT_GROWTH` until
    :data:`MAX_STALE_COUNTS` in a row are not faster, then the legal counts between the fastest one's
    neighbours in that sequence, nearest first."""
    layout, config, tried = timer.config.layout, timer.config, {}

    def attempt(count: int) -> Candidate | None:
        if count not in tried and len(tried) < MAX_TAIL_COUNTS:
            plan = replan(count)
            fits = plan is not None and count <= count_bound(plan, config=config, lower_bound=lower_bound)
            tried[count] = timer.candidate(plan) if fits else None  # type: ignore[arg-type]
        return tried.get(count)

    coarse, best, stale = [base.num_microbatches], base, 0
    while stale < MAX_STALE_COUNTS:
        count = max(layout.next_legal(coarse[-1]), layout.align(math.ceil(coarse[-1] * (1 + COUNT_GROWTH))))
        if count > limit:
            break
        coarse.append(count)
        found = attempt(count)
        best, stale = (found, 0) if found is not None and found.seconds < best.seconds else (best, stale + 1)
    at = coarse.index(best.num_microbatches)
    low, high = coarse[max(at - 1, 0)], coarse[min(at + 1, len(coarse) - 1)]
    between = [c for c in range(low + 1, high) if layout.is_legal(c) and c != best.num_microbatches]
    for count in sorted(between, key=lambda c: (abs(c - best.num_microbatches), c)):
        attempt(count)
    return [c for c in tried.values() if c is not None]


def _more_counts(base: Candidate, timer: StepTimer, *, limit: int) -> list[Candidate]:
    """The base plan's ranks repacked into more micro-batches, up to ``limit``: each count at least
    :data:`COUNT_GROWTH` above the last, until :data:`MAX_STALE_COUNTS` in a row are not faster and the
    count is :data:`SEARCH_SPAN` times the fastest so far. These are timed on the ranks with the most work
    and those with the dearest sample (:meth:`StepTimer.busiest`); the best of them (:func:`choose` with
    :data:`SCREEN_TOLERANCE`) on every rank, and the fastest of them too where its screen is faster by more than
    :data:`STEP_TIME_TOLERANCE`."""
    layout, config = timer.config.layout, timer.config
    screened: list[Candidate] = []
    repack: Callable[[int], list[RankPlan] | None] | None = None  # the busiest ranks', made at the first count
    best, best_count, stale, count = base.seconds, base.num_microbatches, 0, base.num_microbatches
    while stale < MAX_STALE_COUNTS or count < SEARCH_SPAN * best_count:
        count = max(layout.next_legal(count), layout.align(math.ceil(count * (1 + COUNT_GROWTH))))
        if count > limit:
            break
        if repack is None:
            repack = repacker(timer.busiest(base.plan), timer.sizes, config)
        subset = repack(count)
        if subset is None:
            stale += 1
            continue
        seconds = timer.candidate(subset).seconds  # a lower bound of the whole plan's: fewer ranks
        screened.append(Candidate(num_microbatches=count, seconds=seconds, plan=[]))
        if seconds < best:
            best, best_count, stale = seconds, count, 0
        else:
            stale += 1
    if not screened:
        return []
    near = choose([base, *screened], ceiling=base.seconds, tolerance=SCREEN_TOLERANCE)
    fastest = min(screened, key=lambda c: c.seconds)
    picks = [near, fastest] if fastest.seconds < near.seconds * (1 - STEP_TIME_TOLERANCE) else [near]  # else
    counts = dict.fromkeys(c.num_microbatches for c in picks if c.seconds < base.seconds)  # choose() keeps near
    plans = list(map(repacker(base.plan, timer.sizes, config), counts))
    return [timer.candidate(plan) for plan in plans if plan is not None]


def cost_equal(chosen: Candidate, timer: StepTimer) -> Candidate:
    """With ``pp_size > 1`` (and no ``padded_rows``): ``chosen`` with each rank that can set the step time,
    from the slowest, packed at the same count by :func:`~megatron_dpsched.core.kk.differencing_pack` on the
    samples' forward times where that runs the rank faster by more than :data:`ORDER_MARGIN` (each rank in
    its fastest order, :meth:`StepTimer.candidate`); the result only when its step is faster than
    ``chosen``'s by more than that margin, else ``chosen``. Ranks are repacked until
    :data:`COST_EQUAL_SAMPLES` samples are (at least :data:`COST_EQUAL_RANKS` ranks; the step is then the slowest
    of them and the ranks left as they were). A rank already in its fastest order with at most one sample per
    micro-batch is kept without repacking (:func:`_dealt_alike`: the packing would deal it the same micro-batches).
    With one stage a rank's time is the sum of its micro-batches', which no packing of the same samples changes."""
    config = timer.config
    if config.pp_size == 1 or config.padded_rows:
        return chosen
    plan = list(chosen.plan)
    spans = timer.makespans(plan) if chosen.rank_seconds is None else list(chosen.rank_seconds)
    times = timer.sample_times(as_array=True)  # the costs of the few ranks repacked
    step, budget = 0.0, COST_EQUAL_SAMPLES
    for count, rank in enumerate(sorted(range(len(plan)), key=spans.__getitem__, reverse=True)):
        if spans[rank] <= step or (count >= COST_EQUAL_RANKS and budget <= 0):
            break
        items = [i for mb in plan[rank] for i in mb]
        budget -= len(items)
        if rank in chosen.settled and _dealt_alike(plan[rank], times):
            step = max(step, spans[rank])
            continue
        dealt = differencing_pack(items, sizes=timer.sizes, costs=times, cap=config.token_cap,  # type: ignore[arg-type]
                                  num_bins=chosen.num_microbatches)
        if dealt is not None:
            trial = timer.candidate([dealt])
            if trial.seconds < spans[rank] * (1 - ORDER_MARGIN):
                plan[rank], spans[rank] = trial.plan[0], trial.seconds
        step = max(step, spans[rank])
    if max(spans) < chosen.seconds * (1 - ORDER_MARGIN):
        return Candidate(num_microbatches=chosen.num_microbatches, seconds=max(spans), plan=plan, rank_seconds=spans)
    return chosen


def _dealt_alike(rank: RankPlan, times: Sequence[float]) -> bool:
    """Each micro-batch of ``rank`` holds at most one sample, each of positive time: then
    :func:`~megatron_dpsched.core.kk.differencing_pack` leaves every sample alone as it is (a merge pairs the
    dearest parts with the empty ones while there are as many parts as samples), so the rank packed anew runs the
    same micro-batches, in the same fastest order (:func:`cost_equal` skips it where it is settled)."""
    return all(len(mb) <= 1 for mb in rank) and all(times[mb[0]] > 0 for mb in rank if mb)


def repacker(
    plan: list[RankPlan], sizes: Sequence[int], config: ScheduleConfig
) -> Callable[[int], list[RankPlan] | None]:
    """:func:`repack_ranks` of ``plan`` at any count; with ``padded_rows`` each rank's chunks, which do not depend on
    the count, are made once (:func:`~megatron_dpsched.core.packing.chunk_ranks`) and split on from one count to the
    next (:class:`_ChunkSplits`)."""
    if not config.padded_rows:
        return partial(repack_ranks, plan, sizes, config)
    assert config.token_cap is not None
    return _ChunkSplits(chunk_ranks([[i for mb in rank for i in mb] for rank in plan], sizes, config.token_cap), sizes)


class _ChunkSplits:
    """:func:`~megatron_dpsched.core.packing.split_chunks` of each rank's chunks at any count (``None`` where a rank's
    chunks are more), a count above the last one split on from where that one stopped: the fullest micro-batch is
    split first, by its collated size then position, whether the splits start from the chunks or from a smaller
    count's micro-batches, and a padded-rows split orders the samples it cuts itself (so the candidates may sort
    these micro-batches in place)."""

    def __init__(self, chunks: list[BinArrays], sizes: Sequence[int]) -> None:
        self.chunks, self.sizes = chunks, sizes
        self.fewest = max((len(bins.counts) for bins in chunks), default=0)
        self.count, self.ranks = 0, None

    def __call__(self, count: int) -> list[RankPlan] | None:
        if count < self.fewest:
            return None
        if self.ranks is None or count < self.count:
            self.ranks = [split_owned(bins.bins(), self.sizes, count, padded_rows=True, loads=bins.loads.tolist())
                          for bins in self.chunks]
        else:
            self.ranks = [split_owned(list(bins), self.sizes, count, padded_rows=True) for bins in self.ranks]
        self.count = count
        return list(self.ranks)


def repack_ranks(
    plan: list[RankPlan], sizes: Sequence[int], config: ScheduleConfig, count: int
) -> list[RankPlan] | None:
    """Every rank's samples packed into ``count`` micro-batches (step 4); ``None`` if one does not fit."""
    cap = config.token_cap
    assert cap is not None
    packed = pack_ranks([[i for mb in rank for i in mb] for rank in plan], sizes, cap, count,
                        padded_rows=config.padded_rows)
    return None if any(bins is None for bins in packed) else packed  # type: ignore[return-value]
