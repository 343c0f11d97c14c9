"""Pipeline-aware step-time model: how long one step's forward-backward takes on Megatron's schedules.

A planner that balances cost per rank still pays pipeline bubbles, and with
pipeline parallelism a rank's time depends on the order of its micro-batches,
not only on their sum. This module predicts the forward-backward time of one
optimizer step from per-micro-batch sample lengths, by replaying Megatron's
pipeline schedule as a dataflow simulation. Python and NumPy, deterministic.

Rules:

1. One micro-batch of packed samples with lengths ``l_1 .. l_n`` (each its own
   sequence, so the attention term is per sample) takes the forward time
   ``F = a * sum(l_i) + b * sum(l_i ** 2) + c`` over the whole model, with
   ``a = seconds_per_token``, ``b = seconds_per_token_pair`` and
   ``c = seconds_per_microbatch``. An empty micro-batch (a dummy) runs as one
   one-token sample: ``F = a + b + c``. Its backward takes ``backward_factor * F``.
   From a :class:`~megatron_dpsched.core.cost.CostModel` at ``T`` FLOP/s,
   ``a = linear_flops_per_token / T`` and ``b = quadratic_flops_per_token_pair / T``
   (forward FLOPs: a third of the cost model's training FLOPs).
2. The model is split evenly over ``P = pp_size`` stages of ``V = vpp_size``
   chunks: chunk ``c`` of stage ``s`` is virtual stage ``k = c * P + s`` of
   ``K = P * V``, and every op of a micro-batch on one virtual stage takes
   ``F / K`` (forward, ``F``) or ``backward_factor * F / K`` (backward, ``B``).
3. Dependencies of micro-batch ``m``: ``F(m, k)`` after ``F(m, k - 1)``;
   ``B(m, K - 1)`` after ``F(m, K - 1)``; ``B(m, k)`` after ``B(m, k + 1)``. Each
   hop between virtual stages crosses to another physical stage and adds
   ``p2p_latency`` (default 0).
4. Every physical stage starts at 0 and runs its ops one at a time in
   Megatron's order (rule 5); an op starts at ``max(stage free, dependencies
   done)``. Blocking p2p hand-shakes, communication overlap and the
   data-parallel gradient reduction are not modelled.
5. Megatron's order on stage ``s`` of ``M`` micro-batches, ``G =
   microbatch_group_size_per_vp_stage`` (default ``P``):

   a. The table: micro-batches in groups ``[0, G), [G, 2G), ...``, the group
      that reaches ``M`` holding the rest (``M % G`` when that is not 0); each
      group lists chunk 0 for all of its micro-batches, then chunk 1, ... So
      ``P=2, V=2, G=3, M=5`` gives ``(0,0) (1,0) (2,0) (0,1) (1,1) (2,1) (3,0)
      (4,0) (3,1) (4,1)`` as ``(micro-batch, chunk)``. With ``V = 1`` it is
      ``(0,0) (1,0) ... (M-1,0)``.
   b. Warm-up ``w = min(M * V, P - s - 1)`` with ``V = 1``, else
      ``min(M * V, 2 * (P - s - 1) + (V - 1) * G)``.
   c. Forward ``j`` runs the micro-batch and chunk of table entry ``j``;
      backward ``j`` runs table entry ``j``'s micro-batch on chunk ``V - 1 -
      chunk`` (Megatron pops each chunk's inputs first in, first out, which
      is the same micro-batch).
   d. The stage runs forwards ``0 .. w-1``, then for ``j`` in ``0 .. M*V-w-1``
      forward ``w + j`` followed by backward ``j``, then the remaining
      backwards. With ``P = 1`` this is ``F0 B0 F1 B1 ...``
      (``forward_backward_no_pipelining``); with ``V = 1`` it is non-interleaved
      1F1B (``forward_backward_pipelining_without_interleaving``); otherwise
      ``forward_backward_pipelining_with_interleaving``.
6. A rank's makespan is the end of its last op; a stage's busy time is the sum
   of its op durations, ``(1 + backward_factor) * sum(F) / P`` on every stage.
   Data-parallel ranks run lock-stepped (the gradient reduction waits for the
   slowest), so a step takes the largest makespan over ranks.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Protocol

import numpy as np

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.validation import require_int, require_lengths

FLOPS_FIELDS = ("linear_flops_per_token", "quadratic_flops_per_token_pair")
"""What :meth:`StepTimeModel.from_cost_model` reads of a FLOPs model."""


class FlopsModel(Protocol):
    """Forward FLOPs of a GPT by term: what :class:`~megatron_dpsched.core.cost.CostModel` provides (this
    module reads the two figures only, so it does not import the cost module, which imports this one)."""

    @property
    def linear_flops_per_token(self) -> float:
        """Forward FLOPs per token that do not depend on the sequence length."""

    @property
    def quadratic_flops_per_token_pair(self) -> float:
        """Forward FLOPs per (query, key) pair over all layers."""


PipelineOp = tuple[str, int, int]
"""One op of a stage's schedule: ``(kind, micro-batch, chunk)`` with kind ``"F"`` or ``"B"``."""


def _is_sequence(value: object) -> bool:
    """A sized, indexable collection that is not text (lists, tuples, ranges, NumPy arrays)."""
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (str, bytes, dict))


def _require_seconds(name: str, value: object) -> float:
    """``value`` as a finite float >= 0, else ``ValueError`` naming ``name``."""
    real = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if not real or not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class StepTimeModel:
    """Forward time of one micro-batch over the whole model, and how much its backward costs (rule 1)."""

    seconds_per_token: float
    """Linear term: seconds per real token (a dummy micro-batch counts one token)."""
    seconds_per_token_pair: float = 0.0
    """Attention term: seconds per unit of ``sum(length ** 2)`` over the micro-batch's samples."""
    seconds_per_microbatch: float = 0.0
    """Fixed forward cost of every micro-batch (kernel launches, per-micro-batch pipeline work)."""
    backward_factor: float = 2.0
    """Backward time / forward time of the same micro-batch; > 0."""

    def __post_init__(self) -> None:
        _require_seconds("seconds_per_token", self.seconds_per_token)
        _require_seconds("seconds_per_token_pair", self.seconds_per_token_pair)
        _require_seconds("seconds_per_microbatch", self.seconds_per_microbatch)
        if _require_seconds("backward_factor", self.backward_factor) <= 0:
            raise ValueError(f"backward_factor must be > 0, got {self.backward_factor!r}")

    @classmethod
    def from_cost_model(
        cls,
        cost_model: FlopsModel,
        *,
        flops_per_second: float,
        seconds_per_microbatch: float = 0.0,
        backward_factor: float = 2.0,
    ) -> StepTimeModel:
        """Forward time = forward FLOPs of ``cost_model`` (a ``CostModel``) / ``flops_per_second`` +
        ``seconds_per_microbatch``."""
        if not all(hasattr(cost_model, name) for name in FLOPS_FIELDS):
            raise ValueError(f"cost_model must be a CostModel (with {' and '.join(FLOPS_FIELDS)}), "
                             f"got {type(cost_model).__name__}")
        throughput = _require_seconds("flops_per_second", flops_per_second)
        if throughput <= 0:
            raise ValueError(f"flops_per_second must be > 0, got {flops_per_second!r}")
        return cls(
            seconds_per_token=cost_model.linear_flops_per_token / throughput,
            seconds_per_token_pair=cost_model.quadratic_flops_per_token_pair / throughput,
            seconds_per_microbatch=seconds_per_microbatch,
            backward_factor=backward_factor,
        )

    def forward_time(self, lengths: Sequence[int]) -> float:
        """Forward seconds of one micro-batch of samples with these token counts; ``[]`` is a dummy."""
        if _is_sequence(lengths) and len(lengths) == 0:
            lengths = (1,)
        values = require_lengths(lengths)
        tokens = sum(values)
        pairs = sum(length * length for length in values)
        return self.seconds_per_token * tokens + self.seconds_per_token_pair * pairs + self.seconds_per_microbatch

    def backward_time(self, lengths: Sequence[int]) -> float:
        """Backward seconds of the same micro-batch: ``backward_factor`` x forward."""
        return self.backward_factor * self.forward_time(lengths)


@dataclass(frozen=True, kw_only=True)
class StepEvent:
    """One op of a rank's step on one pipeline stage: a bar of a Gantt chart."""

    stage: int
    """Physical pipeline stage (pipeline-parallel rank)."""
    chunk: int
    """Model chunk on that stage (virtual pipeline rank); 0 without interleaving."""
    microbatch: int
    """Micro-batch index, in the rank's run order."""
    kind: str
    """``"F"`` (forward) or ``"B"`` (backward)."""
    start: float
    """Seconds from the step's start."""
    end: float
    """Seconds from the step's start."""


Span = tuple[str, int, int, float, float]
"""One op as the simulation records it: ``(kind, micro-batch, chunk, start, end)``."""


@dataclass(frozen=True, kw_only=True)
class StepTimeline:
    """One data-parallel rank's simulated forward-backward of one step (rules 2-6)."""

    makespan: float
    """Seconds from the step's start until the last stage finishes its last backward."""
    busy_times: tuple[float, ...]
    """Per physical stage: the sum of its op durations (the makespan with no bubbles)."""
    spans: tuple[tuple[Span, ...], ...] = field(repr=False)
    """Per physical stage: its ops in run order (rule 5) as plain tuples; :attr:`events` names the fields."""

    @cached_property
    def events(self) -> tuple[tuple[StepEvent, ...], ...]:
        """Per physical stage: its ops in run order (Megatron's order, rule 5), built on first use."""
        return tuple(
            tuple(
                StepEvent(stage=stage, chunk=chunk, microbatch=microbatch, kind=kind, start=start, end=end)
                for kind, microbatch, chunk, start, end in spans
            )
            for stage, spans in enumerate(self.spans)
        )

    @property
    def busy_time(self) -> float:
        """The busiest stage's busy time: no schedule of these micro-batches can take less."""
        return max(self.busy_times)

    @property
    def bubble_fraction(self) -> float:
        """Share of the makespan the busiest stage spends idle (0 with no bubbles)."""
        return 1.0 - self.busy_time / self.makespan if self.makespan > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Lock-stepped data-parallel ranks: the step waits for the slowest rank (rule 6)."""

    seconds: float
    """The step's forward-backward time: the largest makespan over ranks."""
    rank_seconds: tuple[float, ...]
    """Makespan of every data-parallel rank."""
    rank_busy_seconds: tuple[float, ...]
    """Busiest stage's busy time of every rank (its makespan without bubbles)."""

    @property
    def slowest_rank(self) -> int:
        """The first rank whose makespan is the step time."""
        return self.rank_seconds.index(self.seconds)


def rank_forward_times(micro_batch_lengths: Sequence[Sequence[int]], *, model: StepTimeModel) -> list[float]:
    """Forward seconds of each of one rank's micro-batches (lists of sample lengths, in run order)."""
    _require_model(model)
    if not _is_sequence(micro_batch_lengths):
        raise ValueError(
            f"micro_batch_lengths must be a sequence of micro-batches, got {type(micro_batch_lengths).__name__}"
        )
    times = []
    for index, lengths in enumerate(micro_batch_lengths):
        try:
            times.append(model.forward_time(lengths))
        except ValueError as error:
            raise ValueError(f"micro_batch_lengths[{index}]: {error}") from None
    return times


def stage_op_order(layout: PipelineLayout, *, num_microbatches: int, stage: int) -> tuple[PipelineOp, ...]:
    """The ops stage ``stage`` runs, in Megatron's order (rule 5)."""
    _require_layout(layout)
    count = require_int("num_microbatches", num_microbatches)
    if not layout.is_legal(count):
        raise ValueError(_illegal_count_message("num_microbatches", count, layout))
    if not 0 <= require_int("stage", stage, minimum=0) < layout.pp_size:
        raise ValueError(f"stage must be in [0, pp_size={layout.pp_size}), got {stage!r}")
    return _stage_op_order(layout, count, stage)


@lru_cache(maxsize=256)
def _stage_op_order(layout: PipelineLayout, count: int, stage: int) -> tuple[PipelineOp, ...]:
    chunks = layout.vpp_size
    table = _schedule_table(count, chunks, layout.group_size)
    forwards = [("F", microbatch, chunk) for microbatch, chunk in table]
    backwards = [("B", microbatch, chunks - 1 - chunk) for microbatch, chunk in table]
    warmup = min(len(table), _warmup_count(layout, stage))
    order = forwards[:warmup]
    for index in range(len(table) - warmup):
        order.append(forwards[warmup + index])
        order.append(backwards[index])
    order.extend(backwards[len(table) - warmup:])
    return tuple(order)


def _schedule_table(count: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """Rule 5a: ``(micro-batch, chunk)`` of every forward, in run order."""
    table = []
    for first in range(0, count, group):
        members = range(first, min(first + group, count))
        table.extend((microbatch, chunk) for chunk in range(chunks) for microbatch in members)
    return table


def _warmup_count(layout: PipelineLayout, stage: int) -> int:
    """Rule 5b before the cap at ``M * V``."""
    later_stages = layout.pp_size - stage - 1
    if not layout.interleaved:
        return later_stages
    return 2 * later_stages + (layout.vpp_size - 1) * layout.group_size


def simulate_rank(
    forward_times: Sequence[float], *, layout: PipelineLayout, model: StepTimeModel, p2p_latency: float = 0.0
) -> StepTimeline:
    """Replay one data-parallel rank's step: ``forward_times[m]`` is micro-batch ``m``'s whole-model forward."""
    times = _require_forward_times("forward_times", forward_times, layout)
    _require_model(model)
    latency = _require_seconds("p2p_latency", p2p_latency)
    makespan, busy, events = _simulate(times, layout, model.backward_factor, latency, record=True)
    assert events is not None
    return StepTimeline(makespan=makespan, busy_times=busy, spans=tuple(tuple(stage) for stage in events))


def simulate_step(
    per_rank_forward_times: Sequence[Sequence[float]],
    *,
    layout: PipelineLayout,
    model: StepTimeModel,
    p2p_latency: float = 0.0,
) -> StepTime:
    """Step time of lock-stepped data-parallel ranks: the largest makespan (no events are kept)."""
    if not _is_sequence(per_rank_forward_times):
        raise ValueError(
            f"per_rank_forward_times must be a sequence of ranks, got {type(per_rank_forward_times).__name__}"
        )
    if len(per_rank_forward_times) == 0:
        raise ValueError("per_rank_forward_times is empty: there is no rank to simulate")
    _require_model(model)
    latency = _require_seconds("p2p_latency", p2p_latency)
    ranks = [
        _require_forward_times(f"per_rank_forward_times[{rank}]", times, layout)
        for rank, times in enumerate(per_rank_forward_times)
    ]
    if len({len(times) for times in ranks}) > 1:
        counts = [len(times) for times in ranks]
        raise ValueError(f"per_rank_forward_times: every rank runs the same micro-batch count, got {counts}")
    runs = [_simulate(times, layout, model.backward_factor, latency, record=False) for times in ranks]
    seconds = tuple(makespan for makespan, _, _ in runs)
    busy = tuple(max(stage_busy) for _, stage_busy, _ in runs)
    return StepTime(seconds=max(seconds), rank_seconds=seconds, rank_busy_seconds=busy)


def slowest_makespan(
    per_rank_forward_times: Sequence[tuple[float, ...]], *, layout: PipelineLayout, backward_factor: float
) -> float:
    """``simulate_step(...).seconds`` without ``p2p_latency``, for forward times the planner computed
    itself from valid micro-batches (so they are not validated again: the planner's fast path)."""
    return max(_simulate(tuple(times), layout, backward_factor, 0.0, record=False)[0]
               for times in per_rank_forward_times)


def rank_makespans(
    per_rank_forward_times: Sequence[tuple[float, ...]], *, layout: PipelineLayout, backward_factor: float
) -> list[float]:
    """Every rank's makespan, :func:`slowest_makespan`'s fast path without the maximum; from
    :data:`VECTOR_RANKS` ranks of one count on, all ranks at once (:func:`_simulate_ranks`)."""
    counts = {len(times) for times in per_rank_forward_times}
    if len(per_rank_forward_times) >= VECTOR_RANKS and len(counts) == 1:
        return _simulate_ranks(np.array(per_rank_forward_times, dtype=np.float64), layout, backward_factor)
    return [_simulate(tuple(times), layout, backward_factor, 0.0, record=False)[0] for times in per_rank_forward_times]


VECTOR_RANKS = 8
""":func:`rank_makespans` simulates this many ranks or more at once with NumPy."""


def row_makespans(times: np.ndarray, *, layout: PipelineLayout, backward_factor: float) -> list[float]:
    """:func:`rank_makespans` of ranks of one count given as the rows of a float array, all at once."""
    return _simulate_ranks(times, layout, backward_factor)


def _simulate_ranks(times: np.ndarray, layout: PipelineLayout, backward_factor: float) -> list[float]:
    """:func:`_simulate`'s makespans (no latency) of every row of ``times`` at once: ranks of one count share
    every op's stage and dependency, so the ops run in one order valid for all (:func:`_op_sequence`) with
    the same additions and maxima, rank by rank, as the one-rank simulation. Each op's end times go to a row
    of a small table, reused once the op's readers have run (:func:`_op_slots`). The rows run in blocks of about
    :data:`BLOCK_FLOATS` durations (each row's makespan is its own)."""
    rows = max(1, BLOCK_FLOATS // (2 * times.shape[1]))
    if len(times) <= rows:
        return _simulate_block(times, layout, backward_factor)
    return [span for start in range(0, len(times), rows)
            for span in _simulate_block(times[start:start + rows], layout, backward_factor)]


BLOCK_FLOATS = 1 << 20
""":func:`_simulate_ranks` simulates at most about this many durations (8 MiB) at once."""


@np.errstate(over="ignore", invalid="ignore")  # as Python floats: inf and nan, no warning
def _simulate_block(times: np.ndarray, layout: PipelineLayout, backward_factor: float) -> list[float]:
    """:func:`_simulate_ranks` of the rows of ``times`` in one pass."""
    count = times.shape[1]
    share = 1.0 / (layout.pp_size * layout.vpp_size)
    durations = np.empty((2 * count, times.shape[0]))  # forward then backward ops' durations, one row each
    np.multiply(times.T, share, out=durations[:count])
    np.multiply(times.T, backward_factor, out=durations[count:])
    durations[count:] *= share  # (backward_factor * time) * share, as the one-rank simulation
    steps, size, finals = _op_slots(layout, count)
    end = np.zeros((size, times.shape[0]))  # row 0: zeros, when a stage is free before its first op
    rows, spans, scratch = list(end), list(durations), np.empty(times.shape[0])
    add, maximum = np.add, np.maximum
    for into, previous, dependency, duration_index in steps:
        if dependency < 0:
            add(rows[previous], spans[duration_index], out=rows[into])
        else:
            add(maximum(rows[previous], rows[dependency], out=scratch), spans[duration_index], out=rows[into])
    return end[list(finals)].max(axis=0).tolist()


@lru_cache(maxsize=256)
def _op_slots(layout: PipelineLayout, count: int) -> tuple[tuple[tuple[int, int, int, int], ...], int, tuple[int, ...]]:
    """:func:`_op_sequence` with each op's end in a row (slot) of a table: every op as ``(its slot, the slot of
    its stage's previous op or 0, its dependency's slot or -1, duration index)``, the table's size and the slots
    of the stages' last ops. An op's slot is free again once the last op that reads it (its stage's next op or
    the op that depends on it) has run; slot 0 holds zeros."""
    sequence = _op_sequence(layout, count)
    last_read = [-1] * (2 * count * layout.pp_size * layout.vpp_size + 1)  # where each op is read last
    previous = [-1] * layout.pp_size
    for position, (stage, op, dependency, _) in enumerate(sequence):
        last_read[previous[stage]] = last_read[dependency] = position  # index -1: the spare last entry
        previous[stage] = op
    for op in previous:  # the stages' last ops are read at the end
        last_read[op] = len(sequence)
    slot, free, size, steps = [0] * len(last_read), [], 1, []
    previous = [-1] * layout.pp_size
    for position, (stage, op, dependency, duration_index) in enumerate(sequence):
        if free:
            slot[op] = free.pop()
        else:
            slot[op], size = size, size + 1
        before = previous[stage]
        steps.append((slot[op], slot[before] if before >= 0 else 0, slot[dependency] if dependency >= 0 else -1,
                      duration_index))
        if before >= 0 and last_read[before] == position:
            free.append(slot[before])
        if dependency >= 0 and dependency != before and last_read[dependency] == position:
            free.append(slot[dependency])
        previous[stage] = op
    return tuple(steps), size, tuple(slot[op] for op in previous)


def _op_sequence(layout: PipelineLayout, count: int) -> tuple[tuple[int, int, int, int], ...]:
    """Every op as ``(stage, op id, dependency's op id or -1, duration index)`` in the order :func:`_simulate`
    runs them (which depends on the dependencies only, not on the durations). Not kept: :func:`_op_slots`, its
    one reader, keeps its own result (and :func:`_stage_steps`' is made anew here, not kept either)."""
    plans = _stage_steps.__wrapped__(layout, count)
    done = [False] * (2 * count * layout.pp_size * layout.vpp_size)
    waiting = [-1] * len(done)
    position, awake, out = [0] * layout.pp_size, list(range(layout.pp_size)), []
    while awake:
        stage = awake.pop()
        plan = plans[stage]
        while position[stage] < len(plan):
            op, dependency, _, duration_index = plan[position[stage]]
            if dependency >= 0 and not done[dependency]:
                waiting[dependency] = stage
                break
            out.append((stage, op, dependency, duration_index))
            done[op] = True
            if waiting[op] >= 0:
                awake.append(waiting[op])
            position[stage] += 1
    return tuple(out)


_Step = tuple[int, int, bool, int]
"""One op prepared for the simulation: ``(op id, dependency's op id or -1, dependency on another stage,
index into the durations)``."""


@lru_cache(maxsize=256)
def _stage_steps(layout: PipelineLayout, count: int) -> tuple[tuple[_Step, ...], ...]:
    """Every stage's ops (rule 5) with their dependencies (rule 3) as flat indices.

    Op ``(kind, virtual stage k, micro-batch m)`` has id ``(is_backward * K + k) * M + m``; its duration
    is ``durations[is_backward * M + m]``.
    """
    stages, virtual_stages = layout.pp_size, layout.pp_size * layout.vpp_size
    last = virtual_stages - 1
    plans = []
    for stage in range(stages):
        steps = []
        for kind, microbatch, chunk in _stage_op_order(layout, count, stage):
            virtual = chunk * stages + stage
            if kind == "F":  # after the previous virtual stage's forward
                op = virtual * count + microbatch
                steps.append((op, op - count if virtual else -1, virtual > 0, microbatch))
            else:  # after its own forward on the last virtual stage, else after the next virtual stage's backward
                op = (virtual_stages + virtual) * count + microbatch
                dependency = virtual * count + microbatch if virtual == last else op + count
                steps.append((op, dependency, virtual != last, count + microbatch))
        plans.append(tuple(steps))
    return tuple(plans)

def _simulate(
    times: tuple[float, ...], layout: PipelineLayout, backward_factor: float, latency: float, *, record: bool
) -> tuple[float, tuple[float, ...], list[list[Span]] | None]:
    """Rules 2-4: run every stage's ops as soon as its order and the dependencies allow.

    A stage runs ops until one needs an op not yet run, then waits for that op's stage to wake it:
    every op is visited once. Returns the makespan, the per-stage busy times and (with ``record``)
    the per-stage spans.
    """
    stages, count = layout.pp_size, len(times)
    share = 1.0 / (stages * layout.vpp_size)
    durations = [t * share for t in times] + [backward_factor * t * share for t in times]
    plans = _stage_steps(layout, count)
    orders = [_stage_op_order(layout, count, stage) for stage in range(stages)]
    end: list[float | None] = [None] * (len(durations) * stages * layout.vpp_size)
    waiting = [-1] * len(end)  # waiting[op]: the stage blocked until op runs
    free, busy, position = [0.0] * stages, [0.0] * stages, [0] * stages
    spans: list[list[Span]] | None = [[] for _ in range(stages)] if record else None
    awake = list(range(stages))
    while awake:
        stage = awake.pop()
        plan, time, stage_busy = plans[stage], free[stage], busy[stage]
        while position[stage] < len(plan):
            op, dependency, crosses, duration_index = plan[position[stage]]
            ready = 0.0 if dependency < 0 else end[dependency]
            if ready is None:  # every op has one dependent op, so one stage at most waits for it
                waiting[dependency] = stage
                break
            start = max(time, ready + latency if crosses else ready)
            duration = durations[duration_index]
            time, stage_busy = start + duration, stage_busy + duration
            end[op] = time
            if waiting[op] >= 0:
                awake.append(waiting[op])
            if spans is not None:
                spans[stage].append((*orders[stage][position[stage]], start, time))
            position[stage] += 1
        free[stage], busy[stage] = time, stage_busy
    assert all(done == len(plan) for done, plan in zip(position, plans)), "Megatron's order deadlocked"
    return max(free), tuple(busy), spans


def _require_layout(layout: object) -> None:
    if not isinstance(layout, PipelineLayout):
        raise ValueError(f"layout must be a PipelineLayout, got {type(layout).__name__}")
    layout.validate()


def _require_model(model: object) -> None:
    if not isinstance(model, StepTimeModel):
        raise ValueError(f"model must be a StepTimeModel, got {type(model).__name__}")


def _require_forward_times(name: str, forward_times: Sequence[float], layout: PipelineLayout) -> tuple[float, ...]:
    """Finite non-negative seconds, as many as ``layout`` accepts micro-batches."""
    _require_layout(layout)
    if not _is_sequence(forward_times):
        raise ValueError(f"{name} must be a sequence of seconds, got {type(forward_times).__name__}")
    if len(forward_times) == 0:
        raise ValueError(f"{name} is empty: a step runs at least one micro-batch")
    times = tuple(_require_seconds(f"{name}[{index}]", value) for index, value in enumerate(forward_times))
    if not layout.is_legal(len(times)):
        raise ValueError(_illegal_count_message(f"len({name})", len(times), layout))
    return times


def _illegal_count_message(name: str, count: int, layout: PipelineLayout) -> str:
    return (
        f"{name}={count} micro-batches is not legal for Megatron's interleaved schedule with "
        f"pp_size={layout.pp_size}, microbatch_group_size_per_vp_stage={layout.group_size} (needs "
        f"group <= M and M % group == 0 or >= pp_size; the next legal count is {layout.align(count)})"
    )
