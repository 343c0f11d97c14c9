"""Plan one input with every strategy and compare them step by step (pure Python, no torch).

Strategies: ``dpsched`` (this project's plan), ``megatron_fixed`` (Megatron's fixed micro-batches of
equal sample count, padded to their longest sample) and ``per_rank_first_fit`` (each rank packs its
own contiguous slice under the cap), see :mod:`megatron_dpsched.baselines`. Per step and strategy:

* micro-batches per rank;
* token fill: real tokens that fit the cap / (micro-batches x DP x cap), 1.0 = every micro-batch full;
* imbalance: the busiest DP rank's cost (the model's FLOPs or a cost-model file's sample cost, real tokens)
  / the mean rank's, minus 1;
* padding: tokens computed that are not real tokens (padding to the micro-batch's longest sample
  with ``bshd``; with ``thd`` only CP's rounding of each sample to a multiple of ``2 x CP``), and its
  share of the computed tokens;
* seconds: the step's forward-backward simulated by :func:`~megatron_dpsched.core.simulate_step`
  (Megatron's op order per pipeline stage; the slowest DP rank sets the step time).

The speedup over a baseline is its time / ``dpsched``'s time, per step and in total. Megatron fixed runs at
:func:`baseline_micro_batch_size` (or the size the user gives): the speed-ups name it.

Every strategy's figures of every step come from one pass over its plan in NumPy (:func:`_plan_arrays`):
the same sums as one micro-batch at a time, the pipeline simulated for all DP ranks of all steps of one
micro-batch count at once (:func:`~megatron_dpsched.core.steptime.rank_makespans`).
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from megatron_dpsched.baselines import build_baseline_schedule
from megatron_dpsched.baselines.megatron_schedulers import SchedulerRefused, StepPlan, build_scheduler_schedule
from megatron_dpsched.baselines.simple import fixed_micro_batch_size
from megatron_dpsched.core import (
    CostModel,
    DPSchedule,
    ScheduleConfig,
    StepTimeline,
    StepTimeModel,
    plan_schedule,
    simulate_rank,
    simulate_step,
)
from megatron_dpsched.core.cost import CostFunction, sample_costs
from megatron_dpsched.core.padding import pad_multiple_for, planned_sizes
from megatron_dpsched.core.steptime import VECTOR_RANKS, rank_makespans
from megatron_dpsched.core.validation import ArgumentError
from megatron_dpsched.options import NOMINAL_FLOPS_PER_GPU

OURS = "dpsched"
BASELINE_NAMES = ("megatron_fixed", "per_rank_first_fit")
LABELS = {OURS: "dp-schedule", "megatron_fixed": "Megatron fixed", "per_rank_first_fit": "per-rank packing",
          "megatron_dp_balanced": "DpBalancedScheduler", "megatron_hybrid_cp": "hybrid CP BalancedCPScheduler"}

Tick = Callable[[int], None]


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """How samples are costed and step times simulated: the parts of the layout the plan does not hold."""

    cost_model: CostFunction
    """What a sample costs (balances ``--balance cost``, gives the imbalance): a :class:`CostModel`'s FLOPs,
    which also time every strategy unless ``step_time_model`` is given, or a cost-model file's sample cost."""
    step_time_model: StepTimeModel | None = None
    """Measured step-time model (``--cost-model FILE``), used as it is: its coefficients are one rank's of the
    layout it was measured on. ``None``: ``cost_model``'s FLOPs at ``flops_per_gpu`` x TP x CP."""
    tp_size: int = 1
    """Tensor-parallel ranks: they split every micro-batch's FLOPs (communication not modelled)."""
    flops_per_gpu: float | None = NOMINAL_FLOPS_PER_GPU
    """FLOP/s one GPU achieves on this model; ``None`` with a measured ``step_time_model``."""
    seconds_per_microbatch: float = 0.0
    """Fixed forward cost of every micro-batch (launches, p2p hand-shakes); the measured model's own with one."""
    collate_format: str = "thd"
    """How the packed strategies lay out a micro-batch: ``thd`` (packed) or ``bshd`` (padded rows)."""

    def timing(self, *, cp_size: int) -> StepTimeModel:
        """The step-time model of every strategy: the measured one, else ``cost_model``'s FLOPs over the
        ``tp_size x cp_size`` GPUs of one micro-batch."""
        if self.step_time_model is not None:
            return self.step_time_model
        if not isinstance(self.cost_model, CostModel) or self.flops_per_gpu is None:
            raise ValueError("a simulation needs a step_time_model, or a CostModel and flops_per_gpu")
        return StepTimeModel.from_cost_model(
            self.cost_model, flops_per_second=self.flops_per_gpu * self.tp_size * cp_size,
            seconds_per_microbatch=self.seconds_per_microbatch)


@dataclass(frozen=True, kw_only=True)
class StrategyStep:
    """One strategy's figures for one step."""

    micro_batches: int
    """Micro-batches per rank."""
    tokens: int
    """Real tokens of the step."""
    padding: int
    """Computed tokens that are not real tokens."""
    token_fill: float
    """Real tokens that fit the cap / (micro-batches x DP x cap); 0 without a cap."""
    imbalance: float
    """Busiest rank's FLOPs / mean rank's, minus 1 (0 = balanced)."""
    seconds: float
    """Simulated forward-backward time of the step."""
    slowest_rank: int
    """The DP rank whose pipeline finishes last."""
    rank_tokens: tuple[int, ...]
    """Real tokens per DP rank."""
    rank_padding: tuple[int, ...]
    """Padding tokens per DP rank."""

    @property
    def padding_share(self) -> float:
        """Padding / computed tokens."""
        return self.padding / (self.tokens + self.padding)


@dataclass(frozen=True, kw_only=True)
class StepComparison:
    """Every strategy's figures for one step."""

    step: int
    samples: int
    tokens: int
    strategies: Mapping[str, StrategyStep]

    def speedup(self, baseline: str) -> float:
        """``baseline``'s simulated time / ``dpsched``'s."""
        return self.strategies[baseline].seconds / self.strategies[OURS].seconds


@dataclass(frozen=True, kw_only=True)
class StrategyTotal:
    """One strategy over all steps."""

    micro_batches: int
    """Micro-batches per rank, summed over steps."""
    token_fill: float
    """Over all steps: real tokens that fit the cap / total capacity."""
    imbalance: float
    """Mean over steps of the per-step imbalance."""
    padding_share: float
    """All padding / all computed tokens."""
    seconds: float
    """Sum of the simulated step times."""


@dataclass(frozen=True, kw_only=True)
class PlanWarning:
    """Something a person should know before training this plan."""

    kind: str
    """``ragged_step`` (Megatron refuses the step), ``over_cap`` (samples longer than the cap), ``dropped``, or
    ``refused`` (one of Megatron's own schedulers refuses a step: it is not compared)."""
    message: str
    step: int | None = None
    ids: tuple[int, ...] = ()
    count: int = 0


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """Everything ``megatron-dpsched plan`` prints, writes and plots."""

    config: ScheduleConfig
    simulation: Simulation
    schedules: Mapping[str, DPSchedule]
    steps: tuple[StepComparison, ...]
    warnings: tuple[PlanWarning, ...]
    fixed_micro_batch_size: int | None = None
    """Megatron fixed's micro-batch size (``None``: not compared, no token cap)."""
    fixed_size_given: bool = False
    """Whether the user gave ``fixed_micro_batch_size`` (``--baseline-micro-batch-size``) or the default rule
    (:func:`baseline_micro_batch_size`) chose it."""

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategies compared, ``dpsched`` first."""
        return tuple(self.schedules)

    def total(self, name: str) -> StrategyTotal:
        """Strategy ``name`` over all steps."""
        rows = [step.strategies[name] for step in self.steps]
        capacity = sum(row.micro_batches for row in rows)
        tokens = sum(row.tokens for row in rows)
        return StrategyTotal(
            micro_batches=capacity,
            token_fill=sum(row.token_fill * row.micro_batches for row in rows) / capacity,
            imbalance=sum(row.imbalance for row in rows) / len(rows),
            padding_share=sum(row.padding for row in rows) / (tokens + sum(row.padding for row in rows)),
            seconds=sum(row.seconds for row in rows),
        )

    def total_speedup(self, baseline: str) -> float:
        """Sum of ``baseline``'s step times / sum of ``dpsched``'s."""
        return self.total(baseline).seconds / self.total(OURS).seconds

    def label(self, name: str) -> str:
        """Strategy ``name`` as the report names it: Megatron fixed with its micro-batch size."""
        if name == "megatron_fixed" and self.fixed_micro_batch_size is not None:
            return f"{LABELS[name]}, mbs {self.fixed_micro_batch_size}"
        return LABELS[name]

    @property
    def slowest_step(self) -> int:
        """The step with the longest ``dpsched`` time (the first of equals)."""
        times = [step.strategies[OURS].seconds for step in self.steps]
        return times.index(max(times))


Meanwhile = Callable[[tuple[int, ...], tuple[float, ...]], None]
"""Work for this process while the workers plan: called with the samples' lengths and costs (those of the plan)."""


def plan_ours(
    lengths: Sequence[int], *, config: ScheduleConfig, cost_model: CostFunction, tick: Tick | None = None,
    jobs: int = 1, meanwhile: Meanwhile | None = None,
) -> DPSchedule:
    """:func:`plan_schedule`; with ``tick``, or ``jobs`` > 1 processes (forked, where the platform forks), a few
    steps at a time (``tick(steps)`` after each), merged into one plan. ``meanwhile(lengths, costs)`` runs here
    while the workers plan (with one process: before planning).

    Steps are planned independently, so the result equals one ``plan_schedule`` call.
    """
    if tick is None and jobs <= 1 and meanwhile is None:
        return plan_schedule(lengths, config=config, cost_model=cost_model)
    sizes = tuple(lengths)
    costs = sample_costs(sizes, None if config.balance == "tokens" else cost_model)
    chunks = []
    for chunk in _planned_chunks(lengths, config=config, cost_model=cost_model, jobs=jobs,
                                 meanwhile=None if meanwhile is None else partial(meanwhile, sizes, costs)):
        chunks.append(chunk)
        if tick is not None:
            tick(len(chunk.num_microbatches))
    return _merged(chunks, lengths=sizes, costs=costs, config=config)


def _merged(chunks: Sequence[Chunk], *, lengths: tuple[int, ...], costs: tuple[float, ...],
            config: ScheduleConfig) -> DPSchedule:
    """The plan of all chunks, as ``assemble_schedule`` makes it from their steps: each rank's samples over all
    steps, its micro-batches as positions into them (one tuple per distinct span, shared by the ranks)."""
    dp = config.dp_size
    ids = np.concatenate([chunk.ids for chunk in chunks])
    counts = np.concatenate([chunk.counts for chunk in chunks], axis=1)  # [rank, micro-batch over all steps]
    ranks = np.concatenate([np.repeat(np.arange(dp), chunk.counts.sum(axis=1)) for chunk in chunks])
    ids = ids[np.argsort(ranks, kind="stable")].tolist()  # rank by rank, each in run order
    ends = np.cumsum(counts, axis=1)
    stops = np.cumsum(counts.sum(axis=1)).tolist()
    spans = _Spans()
    return DPSchedule(
        config=config, lengths=lengths, costs=costs, groups=None,
        partitions=tuple(tuple(ids[start:stop]) for start, stop in zip([0, *stops[:-1]], stops)),
        micro_batch_indices=tuple(tuple(map(spans.__getitem__, zip((row - size).tolist(), row.tolist())))
                                  for row, size in zip(ends, counts)),
        num_microbatches=tuple(count for chunk in chunks for count in chunk.num_microbatches),
        step_num_samples=tuple(count for chunk in chunks for count in chunk.step_num_samples),
        dropped=tuple(sample for chunk in chunks for sample in chunk.dropped))


class _Spans(dict[tuple[int, int], tuple[int, ...]]):
    """``(start, end)`` to ``tuple(range(start, end))``, made once."""

    def __missing__(self, key: tuple[int, int]) -> tuple[int, ...]:
        value = self[key] = tuple(range(*key))
        return value


PARALLEL_SAMPLES = 100_000
"""``megatron-dpsched plan --jobs`` plans in several processes from this many samples on (below, starting them
costs more than it saves)."""
_CHUNK_INPUT: tuple | None = None
"""``(lengths, config, cost_model)`` of the chunks being planned, inherited by forked workers (nothing pickled)."""


class Chunk(NamedTuple):
    """One chunk's plan in arrays (what a worker sends back)."""

    ids: np.ndarray
    """Every rank's samples (ids of the whole input) in run order, rank after rank."""
    counts: np.ndarray
    """``[rank, micro-batch]``: the samples of each micro-batch, in run order."""
    num_microbatches: list[int]
    """Per step of the chunk: micro-batches per rank."""
    step_num_samples: list[int]
    """Per step of the chunk: samples trained."""
    dropped: list[int]
    """Samples the chunk dropped (``drop_last``: the input's trailing partial step)."""


def _planned_chunks(lengths: Sequence[int], *, config: ScheduleConfig, cost_model: CostFunction,
                    jobs: int, meanwhile: Callable[[], None] | None = None) -> Iterator[Chunk]:
    """About 100 runs of whole steps (a ragged tail joins the run before it), planned in order, by ``jobs``
    forked processes where there are several; ``meanwhile()`` runs here once the workers have their runs (first
    with one process)."""
    gbs, count = config.global_batch_size, len(lengths)
    chunk = gbs * max(1, math.ceil(count / gbs / 100))
    starts = list(range(0, count, chunk))
    if len(starts) > 1 and count - starts[-1] < gbs:  # a ragged tail is planned with the step before it
        starts.pop()
    bounds = list(zip(starts, [*starts[1:], count]))
    global _CHUNK_INPUT
    _CHUNK_INPUT = (lengths, config, cost_model)
    try:
        if jobs <= 1 or len(bounds) == 1 or "fork" not in multiprocessing.get_all_start_methods():
            if meanwhile is not None:
                meanwhile()
            yield from map(_plan_chunk, bounds)
            return
        with multiprocessing.get_context("fork").Pool(min(jobs, len(bounds))) as pool:
            outcomes = pool.imap(_plan_chunk_reporting, bounds)
            if meanwhile is not None:
                meanwhile()
            for outcome in outcomes:
                yield _raised(outcome)
    finally:
        _CHUNK_INPUT = None


def _plan_chunk(bounds: tuple[int, int]) -> Chunk:
    """Steps ``lengths[start:stop]`` of :data:`_CHUNK_INPUT`, planned; sample ids of the whole input."""
    assert _CHUNK_INPUT is not None, "set by _planned_chunks"
    lengths, config, cost_model = _CHUNK_INPUT
    start, stop = bounds
    part = plan_schedule(lengths[start:stop], config=config, cost_model=cost_model)
    ids, counts = _flat_micro_batches(part)
    return Chunk(ids=ids + start, counts=counts.reshape(part.dp_size, -1),
                 num_microbatches=list(part.num_microbatches), step_num_samples=list(part.step_num_samples),
                 dropped=[i + start for i in part.dropped])


def _plan_chunk_reporting(bounds: tuple[int, int]) -> Chunk | tuple[str, str | None]:
    """:func:`_plan_chunk` in a worker: a planner error comes back as ``(message, argument)`` (an
    :class:`ArgumentError`'s ``argument`` does not survive pickling)."""
    try:
        return _plan_chunk(bounds)
    except ArgumentError as error:
        return str(error), error.argument
    except ValueError as error:
        return str(error), None


def _raised(outcome: Chunk | tuple[str, str | None]) -> Chunk:
    """A worker's chunk, or its error raised here as the planner raised it."""
    if isinstance(outcome[0], str):
        message, argument = outcome
        raise ValueError(message) if argument is None else ArgumentError(message, argument=argument)
    return outcome


def baseline_micro_batch_size(lengths: Sequence[int], *, config: ScheduleConfig) -> int:
    """Megatron fixed's default micro-batch size: the size a Megatron user runs with this layout. The largest
    that Megatron accepts (``global_batch_size`` a multiple of size x DP), whose padded micro-batch of the
    longest sample fits the cap, and that leaves every rank at least ``pp_size`` micro-batches per step (a
    pipeline of fewer micro-batches than stages idles them; a count the interleaved schedule accepts is
    preferred); 1 when none does."""
    per_rank, pp = config.global_batch_size // config.dp_size, config.pp_size
    if config.global_batch_size % config.dp_size or per_rank < pp:
        return 1
    limit = min(fixed_micro_batch_size(lengths, config=config), per_rank // pp)
    sizes = [size for size in range(limit, 0, -1) if per_rank % size == 0]
    return next((size for size in sizes if config.layout.is_legal(per_rank // size)), sizes[0])


def check_baseline_micro_batch_size(size: int, *, config: ScheduleConfig) -> None:
    """``ValueError`` unless Megatron accepts micro-batch size ``size`` with this global batch and DP size."""
    unit = size * config.dp_size
    if config.global_batch_size % unit:
        raise ValueError(f"--baseline-micro-batch-size {size}: Megatron needs --global-batch-size "
                         f"{config.global_batch_size} to be a multiple of micro-batch size x --dp-size = "
                         f"{size} x {config.dp_size} = {unit}")


def plan_baselines(
    lengths: Sequence[int], *, costs: Sequence[float], config: ScheduleConfig, micro_batch_size: int | None = None,
    tick: Tick | None = None,
) -> dict[str, DPSchedule]:
    """With a token cap, each baseline's plan of the same samples (``costs``: those of ``dpsched``'s plan, for
    every plan); Megatron fixed at ``micro_batch_size`` (default :func:`baseline_micro_batch_size`)."""
    plans = {}
    if config.token_cap is not None:
        size = micro_batch_size or baseline_micro_batch_size(lengths, config=config)
        for name in BASELINE_NAMES:
            plans[name] = build_baseline_schedule(name, lengths, config=config, costs=costs,
                                                  micro_batch_size=size if name == "megatron_fixed" else None)
            if tick is not None:
                tick(1)
    return plans


def plan_megatron_schedulers(
    ours: DPSchedule, plans: Mapping[str, StepPlan]
) -> tuple[dict[str, DPSchedule], tuple[PlanWarning, ...]]:
    """Megatron's own schedulers' plans of the same samples (``plans``: name -> its code's step plan), and a
    ``refused`` warning for each one Megatron's code or arguments refuse at some step (the job would stop there:
    it is left out of the comparison)."""
    schedules, refusals = {}, []
    for name, plan in plans.items():
        try:
            schedules[name] = build_scheduler_schedule(plan, ours.lengths, config=ours.config, costs=ours.costs)
        except SchedulerRefused as refusal:
            refusals.append(PlanWarning(
                kind="refused", message=f"{LABELS[name]} (Megatron's own code) refuses {refusal}; the job stops "
                                        "there, so it is left out of the comparison"))
    return schedules, tuple(refusals)


def plan_strategies(
    lengths: Sequence[int], *, config: ScheduleConfig, cost_model: CostFunction
) -> dict[str, DPSchedule]:
    """``dpsched`` first, then the baselines that apply."""
    ours = plan_ours(lengths, config=config, cost_model=cost_model)
    return {OURS: ours, **plan_baselines(ours.lengths, costs=ours.costs, config=config)}


class _Timer:
    """Per-micro-batch computed lengths, forward times and FLOPs of one simulation."""

    def __init__(self, simulation: Simulation, config: ScheduleConfig) -> None:
        self.config, self.simulation = config, simulation
        self.model = simulation.timing(cp_size=config.cp_size)
        self.flops: dict[int, float] = {}
        self.cost_model = simulation.cost_model
        self._samples: tuple[Sequence[int], np.ndarray, np.ndarray] | None = None

    def sample_arrays(self, lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Every sample's length (int64) and cost (:meth:`cost`), made once for the plans of the same samples
        (the baselines share ``dpsched``'s ``lengths``)."""
        if self._samples is None or self._samples[0] is not lengths:
            array = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
            distinct, inverse = np.unique(array, return_inverse=True)
            costs = np.array([self.cost(n) for n in distinct.tolist()], dtype=np.float64)[inverse]
            self._samples = (lengths, array, costs)
        return self._samples[1], self._samples[2]

    def computed(self, lengths: list[int], *, padded: bool) -> list[int]:
        """What the GPUs compute for a micro-batch: padded rows (``bshd``) or CP-rounded packed samples."""
        multiple = pad_multiple_for(tensor_parallel_size=self.simulation.tp_size,
                                    context_parallel_size=self.config.cp_size, sequence_parallel=False)
        sizes = list(planned_sizes(lengths, pad_multiple=multiple))
        return [max(sizes)] * len(sizes) if padded and sizes else sizes

    def cost(self, length: int) -> float:
        value = self.flops.get(length)
        if value is None:
            value = self.flops[length] = self.cost_model(length)
        return value


@dataclass(frozen=True, kw_only=True)
class _PlanArrays:
    """One plan's micro-batches as ``[rank, micro-batch over all steps]`` arrays (every rank runs as many)."""

    tokens: np.ndarray
    """Real tokens (int64)."""
    computed: np.ndarray
    """Tokens the GPUs compute, padding included (int64; 0 for an empty micro-batch)."""
    forward: np.ndarray
    """Forward seconds (an empty micro-batch is a dummy of one token)."""
    costs: np.ndarray
    """``[rank, step]``: the sum of the samples' costs, in run order."""


def _plan_arrays(schedule: DPSchedule, *, timer: _Timer, padded: bool) -> _PlanArrays:
    """Every micro-batch's sums at once: :meth:`_Timer.computed` and the model's forward time of each."""
    dp, (lengths, sample_cost) = schedule.dp_size, timer.sample_arrays(schedule.lengths)
    ids, counts = _flat_micro_batches(schedule)
    owner = np.repeat(np.arange(counts.size), counts)
    real = lengths[ids]
    multiple = pad_multiple_for(tensor_parallel_size=timer.simulation.tp_size,
                                context_parallel_size=timer.config.cp_size, sequence_parallel=False)
    sizes = -(-real // multiple) * multiple
    if padded:
        longest = np.zeros(counts.size, dtype=np.int64)
        starts = np.cumsum(counts) - counts
        if sizes.size:
            longest[counts > 0] = np.maximum.reduceat(sizes, starts[counts > 0])
        computed, pairs = counts * longest, counts * longest.astype(np.float64) ** 2  # floats: no int64 overflow
    else:
        computed = np.bincount(owner, weights=sizes, minlength=counts.size).astype(np.int64)
        pairs = np.bincount(owner, weights=sizes.astype(np.float64) ** 2, minlength=counts.size)
    dummy = counts == 0
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range figures: inf, refused by the caller
        forward = (timer.model.seconds_per_token * np.where(dummy, 1, computed).astype(np.float64)
                   + timer.model.seconds_per_token_pair * np.where(dummy, 1.0, pairs)
                   + timer.model.seconds_per_microbatch)
    cost = sample_cost[ids]
    steps = np.repeat(np.arange(schedule.num_steps), schedule.num_microbatches)  # each column's step
    key = np.repeat((np.arange(dp)[:, None] * schedule.num_steps + steps[None, :]).ravel(), counts)
    shape = (dp, -1)
    return _PlanArrays(
        tokens=np.bincount(owner, weights=real, minlength=counts.size).astype(np.int64).reshape(shape),
        computed=computed.reshape(shape), forward=forward.reshape(shape),
        costs=np.bincount(key, weights=cost, minlength=dp * schedule.num_steps).reshape(shape))


def _flat_micro_batches(schedule: DPSchedule) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's micro-batches over all steps, rank by rank in run order: their sample ids end to end (the
    partitions themselves: a rank's micro-batch indices flatten to ``range(len(partition))``, invariant 3), and
    the sample count of each."""
    counts = [np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
              for batches in schedule.micro_batch_indices]
    ids = np.fromiter(chain.from_iterable(schedule.partitions), dtype=np.int64,
                      count=sum(map(len, schedule.partitions)))
    return ids, np.concatenate(counts)


def _strategy_steps(schedule: DPSchedule, *, timer: _Timer, padded: bool) -> list[StrategyStep]:
    """The figures of one strategy's plan in every step: the per-rank sums of all steps at once, the pipelines of
    all steps of one micro-batch count in one simulation (:func:`_step_makespans`)."""
    arrays = _plan_arrays(schedule, timer=timer, padded=padded)
    dp, cap, counts = schedule.dp_size, schedule.config.token_cap, schedule.num_microbatches
    starts = np.cumsum(counts) - np.asarray(counts)
    assert all(counts), "every step runs at least one micro-batch"
    tokens = np.add.reduceat(arrays.tokens, starts, axis=1).T.tolist()
    padding = (np.add.reduceat(arrays.computed, starts, axis=1) - np.add.reduceat(arrays.tokens, starts, axis=1))
    filled = (np.zeros(len(counts), dtype=np.int64) if cap is None
              else np.add.reduceat(np.minimum(arrays.tokens, cap).sum(axis=0), starts))
    seconds = _step_makespans(arrays.forward, schedule, backward_factor=timer.model.backward_factor)
    rows = []
    for count, rank_tokens, rank_padding, rank_costs, times, fit in zip(
            counts, tokens, padding.T.tolist(), arrays.costs.T.tolist(), seconds, filled.tolist()):
        slowest = max(times)
        rows.append(StrategyStep(
            micro_batches=count, tokens=sum(rank_tokens), padding=sum(rank_padding),
            token_fill=0.0 if cap is None else fit / (count * dp * cap),
            imbalance=max(rank_costs) * dp / sum(rank_costs) - 1.0, seconds=slowest,
            slowest_rank=times.index(slowest), rank_tokens=tuple(rank_tokens), rank_padding=tuple(rank_padding)))
    return rows


def _step_makespans(forward: np.ndarray, schedule: DPSchedule, *, backward_factor: float) -> list[list[float]]:
    """Per step, every DP rank's simulated makespan (:func:`rank_makespans`) of ``forward`` (``[rank, micro-batch
    over all steps]`` seconds): the steps of one micro-batch count are simulated together, as ranks of one step
    (each rank's pipeline on its own: the same figures as step by step)."""
    counts = np.asarray(schedule.num_microbatches)
    starts, dp = np.cumsum(counts) - counts, schedule.dp_size
    makespans: list[list[float]] = [[] for _ in range(counts.size)]
    for count in np.unique(counts).tolist():
        steps = np.flatnonzero(counts == count)
        columns = starts[steps][:, None] + np.arange(count)  # [step, micro-batch]
        block = forward[:, columns].transpose(1, 0, 2).reshape(-1, count)  # rows: step by step, rank by rank
        rows = block if len(block) >= VECTOR_RANKS else block.tolist()  # one rank at a time: Python floats
        spans = rank_makespans(rows, layout=schedule.config.layout, backward_factor=backward_factor)
        for step, position in zip(steps.tolist(), range(0, len(spans), dp)):
            makespans[step] = spans[position:position + dp]
    return makespans


def rank_timeline(
    schedule: DPSchedule, step: int, rank: int, *, simulation: Simulation, padded: bool
) -> StepTimeline:
    """The simulated pipeline of one rank in one step (the Gantt chart's events)."""
    timer = _Timer(simulation, schedule.config)
    lengths = schedule.lengths
    micro_batches = schedule.rank_step_micro_batches(rank, step)
    times = [timer.model.forward_time(timer.computed([lengths[i] for i in mb], padded=padded))
             for mb in micro_batches]
    return simulate_rank(times, layout=schedule.config.layout, model=timer.model)


def rank_seconds(schedule: DPSchedule, step: int, *, simulation: Simulation, padded: bool) -> tuple[float, ...]:
    """The simulated forward-backward time of every DP rank in one step (the step waits for the largest)."""
    timer = _Timer(simulation, schedule.config)
    lengths = schedule.lengths
    times = [[timer.model.forward_time(timer.computed([lengths[i] for i in mb], padded=padded))
              for mb in schedule.rank_step_micro_batches(rank, step)] for rank in range(schedule.dp_size)]
    return simulate_step(times, layout=schedule.config.layout, model=timer.model).rank_seconds


def largest_collated(schedule: DPSchedule, *, simulation: Simulation, padded: bool) -> int:
    """The most tokens one collated micro-batch holds over the plan, padding counted as collate adds it
    (each sample rounded to the layout's multiple; with padded rows, rows x the longest row): the largest of
    :func:`_plan_arrays`' computed tokens."""
    arrays = _plan_arrays(schedule, timer=_Timer(simulation, schedule.config), padded=padded)
    return int(arrays.computed.max(initial=0))


def is_padded(name: str, simulation: Simulation) -> bool:
    """Megatron's fixed micro-batches are padded rows; the packed strategies follow ``collate_format``."""
    return name == "megatron_fixed" or simulation.collate_format == "bshd"


def compare(
    schedules: Mapping[str, DPSchedule], *, simulation: Simulation, tick: Tick | None = None
) -> tuple[StepComparison, ...]:
    """Every step of every strategy (all plans cut the same steps); ``tick(1)`` after each strategy."""
    return step_comparisons(schedules[OURS], strategy_rows(schedules, simulation=simulation, tick=tick))


StrategyRows = dict[str, list[StrategyStep]]
"""Strategy -> its figures in every step."""


def strategy_rows(
    schedules: Mapping[str, DPSchedule], *, simulation: Simulation, tick: Tick | None = None
) -> StrategyRows:
    """Each plan's figures in every step (:func:`compare`'s columns, a strategy at a time); ``tick(1)`` after
    each."""
    rows, timer = {}, None
    for name, plan in schedules.items():
        timer = timer or _Timer(simulation, plan.config)
        rows[name] = _strategy_steps(plan, timer=timer, padded=is_padded(name, simulation))
        if tick is not None:
            tick(1)
    return rows


def step_comparisons(ours: DPSchedule, rows: StrategyRows) -> tuple[StepComparison, ...]:
    """:func:`strategy_rows`' figures step by step (``rows`` in the report's order, ``dpsched`` first)."""
    return tuple(
        StepComparison(step=step, samples=ours.step_num_samples[step], tokens=rows[OURS][step].tokens,
                       strategies=MappingProxyType({name: column[step] for name, column in rows.items()}))
        for step in range(ours.num_steps))


def plan_warnings(schedule: DPSchedule) -> tuple[PlanWarning, ...]:
    """Steps Megatron refuses, samples over the cap, dropped samples."""
    return (*_ragged_steps(schedule), *_over_cap(schedule), *_dropped(schedule))


def _ragged_steps(schedule: DPSchedule) -> list[PlanWarning]:
    config = schedule.config
    unit = (config.micro_batch_size or 1) * config.dp_size
    warnings = []
    for step, samples in enumerate(schedule.step_num_samples):
        if samples % unit:
            warnings.append(PlanWarning(
                kind="ragged_step", step=step, count=samples,
                message=f"step {step} trains {samples} samples, not a multiple of micro_batch_size x dp = "
                        f"{config.micro_batch_size or 1} x {config.dp_size} = {unit}: Megatron's sample "
                        "accounting cannot count it and training stops there (use --drop-last, or a "
                        "global batch size that divides the sample count)",
            ))
    return warnings


def _over_cap(schedule: DPSchedule) -> list[PlanWarning]:
    cap = schedule.config.token_cap
    if cap is None:
        return []
    ids = tuple(i for i, n in enumerate(schedule.lengths) if n > cap)
    if not ids:
        return []
    longest = max(schedule.lengths[i] for i in ids)
    return [PlanWarning(
        kind="over_cap", ids=ids, count=len(ids),
        message=f"{len(ids)} sample(s) longer than the token cap of {cap} (max_tokens_per_gpu x cp_size), "
                f"the longest {longest} tokens: {_id_list(ids)}; each runs alone in a micro-batch over the "
                "cap, which may not fit in memory",
    )]


def _dropped(schedule: DPSchedule) -> list[PlanWarning]:
    ids = schedule.dropped
    if not ids:
        return []
    return [PlanWarning(
        kind="dropped", ids=tuple(ids), count=len(ids),
        message=f"--drop-last dropped {len(ids)} sample(s) of the trailing partial step: {_id_list(ids)}; "
                "they are not trained",
    )]


def _id_list(ids: Sequence[int], *, limit: int = 10) -> str:
    """``ids 3, 8, 12`` / ``ids 100-148`` (consecutive) / the first ``limit`` and a count of the rest."""
    if len(ids) > 2 and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"ids {ids[0]}-{ids[-1]}"
    shown = ", ".join(map(str, ids[:limit]))
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return f"id{'s' if len(ids) > 1 else ''} {shown}{more}"
