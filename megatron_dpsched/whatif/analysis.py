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

The speedup over a baseline is its time / ``dpsched``'s time, per step and in total.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

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
from megatron_dpsched.core.schedule import assemble_schedule
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

    @property
    def fixed_micro_batch_size(self) -> int | None:
        """The micro-batch size of Megatron fixed (None without a token cap: no baselines)."""
        if "megatron_fixed" not in self.schedules:
            return None
        return fixed_micro_batch_size(self.schedules[OURS].lengths, config=self.config)

    @property
    def slowest_step(self) -> int:
        """The step with the longest ``dpsched`` time (the first of equals)."""
        times = [step.strategies[OURS].seconds for step in self.steps]
        return times.index(max(times))


def plan_ours(
    lengths: Sequence[int], *, config: ScheduleConfig, cost_model: CostFunction, tick: Tick | None = None
) -> DPSchedule:
    """:func:`plan_schedule` a few steps at a time (``tick(steps)`` after each), merged into one plan.

    Steps are planned independently, so the result equals one ``plan_schedule`` call.
    """
    gbs, count = config.global_batch_size, len(lengths)
    chunk = gbs * max(1, math.ceil(count / gbs / 100))
    starts = list(range(0, count, chunk))
    if len(starts) > 1 and count - starts[-1] < gbs:  # a ragged tail is planned with the step before it
        starts.pop()
    plans: list = []
    dropped: list[int] = []
    for index, start in enumerate(starts):
        stop = starts[index + 1] if index + 1 < len(starts) else count
        part = plan_schedule(lengths[start:stop], config=config, cost_model=cost_model)
        plans.extend(_step_plans(part, offset=start))
        dropped.extend(i + start for i in part.dropped)
        if tick is not None:
            tick(part.num_steps)
    sizes = tuple(lengths)
    costs = sample_costs(sizes, None if config.balance == "tokens" else cost_model)
    return assemble_schedule(plans, lengths=sizes, costs=costs, groups=None, config=config, dropped=dropped)


def _step_plans(schedule: DPSchedule, *, offset: int) -> list[list[list[int]]]:
    """Per step, per rank: micro-batches as sample ids shifted by ``offset``."""
    return [
        [[[i + offset for i in mb] for mb in schedule.rank_step_micro_batches(rank, step)]
         for rank in range(schedule.dp_size)]
        for step in range(schedule.num_steps)
    ]


def plan_baselines(ours: DPSchedule, *, tick: Tick | None = None) -> dict[str, DPSchedule]:
    """With a token cap, each baseline's plan of the same samples (costs of ``ours`` for every plan)."""
    plans = {}
    if ours.config.token_cap is not None:
        for name in BASELINE_NAMES:
            plans[name] = build_baseline_schedule(name, ours.lengths, config=ours.config, costs=ours.costs)
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
    return {OURS: ours, **plan_baselines(ours)}


class _Timer:
    """Per-micro-batch computed lengths, forward times and FLOPs of one simulation."""

    def __init__(self, simulation: Simulation, config: ScheduleConfig) -> None:
        self.config, self.simulation = config, simulation
        self.model = simulation.timing(cp_size=config.cp_size)
        self.flops: dict[int, float] = {}
        self.cost_model = simulation.cost_model

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


def strategy_step(schedule: DPSchedule, step: int, *, timer: _Timer, padded: bool) -> StrategyStep:
    """The figures of one strategy's plan in one step."""
    lengths, dp = schedule.lengths, schedule.dp_size
    ranks = [[[lengths[i] for i in mb] for mb in schedule.rank_step_micro_batches(r, step)] for r in range(dp)]
    computed = [[timer.computed(mb, padded=padded) for mb in rank] for rank in ranks]
    rank_tokens = tuple(sum(map(sum, rank)) for rank in ranks)
    rank_padding = tuple(sum(map(sum, rank)) - tokens for rank, tokens in zip(computed, rank_tokens))
    rank_costs = [sum(timer.cost(n) for mb in rank for n in mb) for rank in ranks]
    times = [[timer.model.forward_time(mb) for mb in rank] for rank in computed]
    result = simulate_step(times, layout=schedule.config.layout, model=timer.model)
    count, cap = schedule.num_microbatches[step], schedule.config.token_cap
    fill = 0.0 if cap is None else sum(min(cap, sum(mb)) for rank in ranks for mb in rank) / (count * dp * cap)
    return StrategyStep(
        micro_batches=count, tokens=sum(rank_tokens), padding=sum(rank_padding), token_fill=fill,
        imbalance=max(rank_costs) * dp / sum(rank_costs) - 1.0, seconds=result.seconds,
        slowest_rank=result.slowest_rank, rank_tokens=rank_tokens, rank_padding=rank_padding,
    )


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
    (each sample rounded to the layout's multiple; with padded rows, rows x the longest row)."""
    timer = _Timer(simulation, schedule.config)
    lengths, largest = schedule.lengths, 0
    for rank in range(schedule.dp_size):
        partition = schedule.partitions[rank]
        for mb in schedule.micro_batch_indices[rank]:
            largest = max(largest, sum(timer.computed([lengths[partition[p]] for p in mb], padded=padded)))
    return largest


def is_padded(name: str, simulation: Simulation) -> bool:
    """Megatron's fixed micro-batches are padded rows; the packed strategies follow ``collate_format``."""
    return name == "megatron_fixed" or simulation.collate_format == "bshd"


def compare(
    schedules: Mapping[str, DPSchedule], *, simulation: Simulation, tick: Tick | None = None
) -> tuple[StepComparison, ...]:
    """Every step of every strategy (all plans cut the same steps)."""
    ours = schedules[OURS]
    timer = _Timer(simulation, ours.config)
    steps = []
    for step in range(ours.num_steps):
        rows = {name: strategy_step(plan, step, timer=timer, padded=is_padded(name, simulation))
                for name, plan in schedules.items()}
        steps.append(StepComparison(step=step, samples=ours.step_num_samples[step], tokens=rows[OURS].tokens,
                                    strategies=MappingProxyType(rows)))
        if tick is not None:
            tick(1)
    return tuple(steps)


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
