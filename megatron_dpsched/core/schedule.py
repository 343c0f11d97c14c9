"""Global data-parallel micro-batch schedule: the contract.

``build_dp_schedule`` plans every optimizer step of a stream of samples at once, from their
token counts (``lengths``) alone. It needs Python and NumPy only (no torch, no Megatron) and is deterministic:
every rank that calls it with the same inputs gets the same plan, so no collective is needed.
:meth:`DPSchedule.step_fingerprint` gives a 63-bit hash of one step that the Megatron layer
compares across ranks before the step runs.

Terms:

* cost: what ranks are balanced by, ``cost_model(length)`` or with ``balance="tokens"`` the
  length (:func:`build_dp_schedule`); always that of the real length
  (:func:`~megatron_dpsched.core.planning.plan_step_layout`).
* planned size: a sample's length rounded up to ``pad_multiple``; a micro-batch's collated
  size is the sum of its samples' planned sizes, or with ``padded_rows`` its sample count times
  its longest planned size (:mod:`~megatron_dpsched.core.padding`). With the defaults both are
  token counts.
* ``C = max_tokens_per_gpu * cp_size``: the token cap, on collated sizes.
* count: micro-batches per rank in one step; ``align(n)`` is the smallest count of at least
  ``n`` that Megatron's schedule accepts (:mod:`~megatron_dpsched.core.alignment`).

Steps, for every optimizer step (each step's detail lives with the code it names):

1. Cut: ``global_batch_size`` consecutive samples, or groups (in order of their first sample)
   with all of their samples; a trailing partial step is a smaller step, or with ``drop_last``
   goes to ``dropped`` (:func:`~megatron_dpsched.core.steps.split_steps`).
2. Lower bound ``M``: the fewest legal micro-batches per rank any plan of the step can run
   (:func:`~megatron_dpsched.core.planning.lower_bound_microbatches`).
3. Assign samples to ranks by cost, largest first, each rank holding at most the count's worth
   of micro-batches, ``M`` at first (:func:`~megatron_dpsched.core.balancing.lpt_assign`).
4. Pack each rank's samples into exactly the step's count of micro-batches under ``C``
   (:func:`~megatron_dpsched.core.packing.pack_into`, ``planning._assign_and_pack``).
5. Choose the count: the fewest from ``M`` up whose plan balances the ranks, at most ``U``,
   the count of one global packing of the step dealt to the ranks (with ``balance_growth``,
   ``align(U * (1 + balance_growth))``; without it, when the busiest rank still costs more than
   ``TAIL_IMBALANCE`` above ``max(mean rank cost, dearest sample)``, a tail past the cap, at
   most ``B`` of step 7); unbalanced plans are refined by moving single samples, and a step no
   count fits gets the global packing dealt to the ranks (``planning._plan_dynamic``).
6. Order each rank's micro-batches: with ``pp_size > 1`` the cheapest at both ends
   (:mod:`~megatron_dpsched.core.ordering`).
7. Only with a ``step_time_model``: of candidate plans at counts from ``M`` to ``B = max(M,
   align(n))``, ``n`` the most samples one rank holds, the one with the smallest simulated step
   time, ties going to fewer micro-batches; with ``pp_size > 1`` and order ``"pipeline"`` each rank
   runs the fastest simulated of four orders, step 6's unless another is faster; with
   ``pp_size > 1`` (no ``padded_rows``) each rank that can set the step time is also packed at
   the chosen count into micro-batches of near-equal cost (largest differencing,
   :mod:`~megatron_dpsched.core.kk`), kept only where the simulator runs it faster
   (:mod:`~megatron_dpsched.core.objective`).

Invariants (checked by :meth:`DPSchedule.check` for every accepted input; its errors start
with ``invariant N:``; ``docs/guarantees.md`` lists them as written here, rewritten by
``python tests/unit/test_stated_once.py --write``):

1. Every rank runs the same ``num_microbatches[s]`` micro-batches in step ``s``.
2. With ``max_tokens_per_gpu``, every micro-batch's collated size is at most ``C``, or the
   micro-batch is a single sample (which alone may exceed it). With ``micro_batch_size``, at
   most that many samples.
3. Flattening ``micro_batch_indices[r]`` gives ``range(len(partitions[r]))``; partitions are
   disjoint and their union is every sample not in ``dropped``.
4. ``num_microbatches[s]`` is legal for Megatron's schedule (interleaved rule with
   ``vpp_size > 1``) and at least ``M``. Without a ``step_time_model`` it is at most ``U``
   (step 5), or ``align(U * (1 + balance_growth))`` with ``balance_growth``, or ``B`` for a
   tail past the cap; with one it may exceed ``U`` when the simulated step time says more
   micro-batches are faster, but never ``B`` (step 7). The checker verifies the bounds it can
   derive from the plan alone: ``M``, and ``B`` for plans made with a ``step_time_model`` (a
   plan without one may be a shipped plan with empty micro-batches of its own).
5. Samples of one group are in the same step; steps follow the input order; every step but a
   trailing one holds exactly ``global_batch_size`` samples (groups); ``step_num_samples[s]``
   counts the samples of step ``s``; only a trailing partial step can be dropped, and only
   with ``drop_last``.
6. The plan is well formed: every length is an integer in ``1..2**31-1``, every cost a finite
   number > 0, ``pad_multiple`` an integer of at most ``C`` (checked when the config is
   built), sample ids, positions and counts are integers, there is at least one step, and
   every step trains at least one sample. Steps and ``dropped`` are exactly the cut of step 1
   (invariant 5).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.cost import DEFAULT_COST_MODEL, CostFunction, require_cost_model, sample_costs
from megatron_dpsched.core.padding import ArrayTuple, array_tuple
from megatron_dpsched.core.planning import StepLayout, plan_step_layout
from megatron_dpsched.core.steps import split_steps, step_ranges
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import ArgumentError, checked_lengths


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

    def step_stats(self, step: int) -> Any:
        """Figures of step ``step`` alone (:class:`~megatron_dpsched.core.stats.StepStats`)."""
        from megatron_dpsched.core.stats import step_stats

        return step_stats(self, step)

    def to_dict(self) -> dict[str, Any]:
        """A dict that ``json.dumps`` takes when group ids are strings, numbers or tuples of them
        (NumPy scalars are stored as Python numbers); :meth:`from_dict` rebuilds an equal schedule."""
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

    def step_fingerprint(self, step: int, *, first_sample: int = 0) -> int:
        """A 63-bit hash of step ``step`` that every rank of a job must share (see :mod:`.fingerprint`)."""
        from megatron_dpsched.core.fingerprint import step_fingerprint

        return step_fingerprint(self, step, first_sample=first_sample)

    @classmethod
    def from_dict(cls, data: Any) -> DPSchedule:
        """Rebuild a schedule from :meth:`to_dict` output (e.g. after a JSON round trip).

        Raises ``ValueError`` naming the key when ``data`` is not shaped like a plan; run
        :meth:`check` on the result to verify its invariants.
        """
        from megatron_dpsched.core.serialization import schedule_fields

        return cls(**schedule_fields(data))


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
    step_time_model: StepTimeModel | None = None,
    pad_multiple: int = 1,
    padded_rows: bool = False,
) -> DPSchedule:
    """Plan every step of ``lengths`` at once (see the module docstring for the rules).

    ``balance="cost"`` (the default) balances ``cost_model(length)`` per sample: a
    :class:`~megatron_dpsched.core.cost.CostModel` of the trained model, or any callable. Without
    ``cost_model`` it balances :data:`~megatron_dpsched.core.cost.DEFAULT_COST_MODEL`,
    ``s + s^2 / 49152`` (tokens plus attention, quadratic-aware, the shape of a dense GPT of width
    4096), not raw tokens; ``balance="tokens"`` balances token counts, ``balance="none"`` nothing
    (micro-batches dealt round-robin; costs still order them). ``pad_multiple`` and ``padded_rows``
    make the cap bound collated micro-batches (see the terms in the module docstring).
    """
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
        drop_last=drop_last,
        microbatch_order=microbatch_order,
        balance_growth=balance_growth,
        step_time_model=step_time_model,
        pad_multiple=pad_multiple,
        padded_rows=padded_rows,
    )
    return plan_schedule(lengths, config=config, groups=groups, cost_model=cost_model)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """CPython's cyclic garbage collector paused while the main thread plans, and restored after.

    A plan is up to millions of small lists and tuples of ints, none in a reference cycle, so reference
    counting frees them all, while every collection found nothing to free and walked them all again. The
    schedule a plan returns is a small share of those objects, so the first collection after the pause is
    short. The collector is process-wide, so a plan made beside training in another thread
    (``--dp-schedule-prefetch``) leaves it alone, and one already disabled (Megatron's ``--manual-gc``) stays
    disabled."""
    if not gc.isenabled() or threading.current_thread() is not threading.main_thread():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@_collector_paused()
def plan_schedule(
    lengths: Sequence[int],
    *,
    config: ScheduleConfig,
    groups: Sequence[Hashable] | None = None,
    cost_model: CostFunction | None = None,
) -> DPSchedule:
    """:func:`build_dp_schedule` with the options already gathered in a :class:`ScheduleConfig`; every way in
    plans here, on the main thread with the cyclic collector paused (:func:`_collector_paused`)."""
    lengths, length_array = checked_lengths(lengths)
    _check_static_layout(config, groups)
    if groups is None:  # consecutive ranges, never made lists
        steps, dropped = step_ranges(len(lengths), global_batch_size=config.global_batch_size,
                                     drop_last=config.drop_last)
    else:
        steps, dropped = split_steps(
            len(lengths), global_batch_size=config.global_batch_size, groups=groups, drop_last=config.drop_last
        )
    if not steps:
        raise ValueError(
            f"lengths holds {len(lengths)} samples, fewer than one global_batch_size="
            f"{config.global_batch_size} step, and drop_last=True would drop them all"
        )
    _check_plan_size(config, steps)
    steps = [range(step[0], step[-1] + 1) if step[-1] - step[0] + 1 == len(step) else step for step in steps]
    require_cost_model(cost_model)
    costs = sample_costs(lengths, _cost_function(config, cost_model), array=length_array)
    lengths = array_tuple(lengths, np.int64) if length_array is None else ArrayTuple(lengths, length_array)
    costs = array_tuple(costs, np.float64)  # one copy each while planning
    layouts = [plan_step_layout(step, lengths=lengths, costs=costs, config=config) for step in steps]
    lengths, costs = tuple(lengths), tuple(costs)  # the arrays freed before assembly
    return DPSchedule(
        config=config,
        lengths=lengths,
        costs=costs,
        groups=None if groups is None else tuple(_plain(g) for g in groups),
        **_assembled(layouts, dp_size=config.dp_size),
        dropped=tuple(dropped),
    )


def _cost_function(config: ScheduleConfig, cost_model: CostFunction | None) -> CostFunction | None:
    """What the plan balances: ``None`` (token counts), the given model, or the library default."""
    if config.balance == "tokens":
        return None
    return DEFAULT_COST_MODEL if cost_model is None else cost_model


MAX_SLOTS_PER_SAMPLE = 4
"""A plan may hold at most this many micro-batches per sample (plus a few thousand) before it is absurd."""


def _check_plan_size(config: ScheduleConfig, steps: list[list[int]]) -> None:
    """Fail fast on absurd sizes instead of allocating empty micro-batches for idle ranks."""
    largest = max(len(step) for step in steps)
    if config.dp_size > largest:
        raise ArgumentError(
            f"dp_size={config.dp_size} is larger than the {largest} samples of the largest step; "
            f"every data-parallel rank needs at least one sample (plan for fewer ranks or a larger step)",
            argument="dp_size",
        )
    layout = config.layout
    slots = len(steps) * config.dp_size * layout.align(1)
    samples = sum(len(step) for step in steps)
    if slots > MAX_SLOTS_PER_SAMPLE * samples + 4096:
        raise ArgumentError(
            f"pp_size={layout.pp_size}, vpp_size={layout.vpp_size} and microbatch_group_size_per_vp_stage="
            f"{layout.group_size} need at least {layout.align(1)} micro-batches per rank and step: {slots} for "
            f"{samples} samples, nearly all of them empty; check the pipeline layout",
            argument="pp_size",
        )


def _check_static_layout(config: ScheduleConfig, groups: Sequence[Hashable] | None) -> None:
    """Static batching without groups follows Megatron: each step fills every micro-batch."""
    mbs = config.micro_batch_size
    if mbs is None or groups is not None:
        return
    per_step = mbs * config.dp_size
    if config.global_batch_size % per_step:
        raise ArgumentError(
            f"global_batch_size={config.global_batch_size} must be a multiple of micro_batch_size * "
            f"dp_size = {mbs} * {config.dp_size} = {per_step} for static batching",
            argument="global_batch_size",
        )


def assemble_schedule(
    plans: list[list[RankPlan]],
    *,
    lengths: Sequence[int],
    costs: tuple[float, ...],
    groups: Sequence[Hashable] | None,
    config: ScheduleConfig,
    dropped: list[int],
) -> DPSchedule:
    """Turn per-step, per-rank micro-batches into the rank-major contract (micro-batch indices of the same span
    are one tuple, shared by the ranks: :class:`_Spans`)."""
    assert all(len(step_plan) == config.dp_size for step_plan in plans)
    partitions, micro_batch_indices = [], []
    step_num_samples = np.zeros(len(plans), dtype=np.int64)
    spans = _Spans(SPAN_WIDTH)
    for rank_steps in zip(*plans) if plans else [()] * config.dp_size:  # each rank's plan of every step
        step_counts = np.fromiter(map(len, rank_steps), dtype=np.int64, count=len(rank_steps))
        sizes = np.fromiter(map(len, chain.from_iterable(rank_steps)), dtype=np.int64, count=int(step_counts.sum()))
        ends = np.cumsum(sizes)
        step_num_samples += _per_step(ends, step_counts)
        filled = filter(None, chain.from_iterable(rank_steps))  # no iterator made for an empty micro-batch
        partitions.append(tuple(chain.from_iterable(filled)))
        micro_batch_indices.append(tuple(map(spans.__getitem__, ((ends - sizes) * spans.width + ends).tolist())))
    step_num_samples = tuple(step_num_samples.tolist())
    return DPSchedule(
        config=config,
        lengths=tuple(lengths),
        costs=costs,
        groups=None if groups is None else tuple(_plain(g) for g in groups),
        partitions=tuple(partitions),
        micro_batch_indices=tuple(micro_batch_indices),
        num_microbatches=tuple(len(step_plan[0]) for step_plan in plans),
        step_num_samples=step_num_samples,
        dropped=tuple(dropped),
    )


def _assembled(layouts: list[StepLayout], *, dp_size: int) -> dict[str, tuple[Any, ...]]:
    """:func:`assemble_schedule`'s rank-major fields from every step's :data:`StepLayout` (each let go as read),
    in NumPy: every micro-batch's sample count copied step by step into one array of a row per rank (its steps
    end to end), the samples put in rank-major order in one pass, then both cut per rank."""
    counts = np.fromiter((int(layout[0][0]) for layout in layouts), dtype=np.int64, count=len(layouts))
    rank_samples = np.stack([layout[1].reshape(dp_size, -1).sum(axis=1) for layout in layouts])  # step x rank
    fields = {"num_microbatches": tuple(counts.tolist()), "step_num_samples": tuple(rank_samples.sum(axis=1).tolist())}
    samples = _rank_major_samples(layouts, rank_samples)
    sizes = np.empty((dp_size, int(counts.sum())), dtype=np.int64)  # each rank's micro-batches' sample counts
    ends = np.cumsum(counts).tolist()
    for step, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
        sizes[:, start:end] = layouts[step][1].reshape(dp_size, -1)
        layouts[step] = None  # type: ignore[call-overload]  # its arrays freed as copied
    cuts = np.cumsum(rank_samples.sum(axis=0)).tolist()
    fields["partitions"] = tuple(tuple(samples[a:b].tolist()) for a, b in zip([0, *cuts[:-1]], cuts))
    del samples
    spans = _Spans(SPAN_WIDTH)
    fields["micro_batch_indices"] = tuple(_rank_spans(row, spans) for row in sizes)
    return fields


def _rank_major_samples(layouts: list[StepLayout], rank_samples: np.ndarray) -> np.ndarray:
    """Every step's samples (rank after rank) in rank-major order: each rank's samples of every step, its steps
    end to end. ``rank_samples``: each step's sample count per rank (step x rank)."""
    chunks = rank_samples.ravel()  # the steps' samples end to end: a chunk per step and rank, in that order
    rank_totals = rank_samples.sum(axis=0)
    targets = np.cumsum(rank_samples, axis=0) - rank_samples + (np.cumsum(rank_totals) - rank_totals)
    moves = targets.ravel() - (np.cumsum(chunks) - chunks)  # where each chunk goes, less where it is
    samples = np.empty(int(chunks.sum()), dtype=np.int64)
    samples[np.repeat(moves, chunks) + np.arange(len(samples))] = np.concatenate([layout[2] for layout in layouts])
    return samples


def _rank_spans(sizes: np.ndarray, spans: _Spans) -> tuple[tuple[int, ...], ...]:
    """One rank's ``micro_batch_indices`` from its micro-batches' sample counts (shared tuples of ``spans``)."""
    ends = np.cumsum(sizes)
    keys = (ends - sizes) * spans.width + ends
    return tuple(map(spans.__getitem__, keys.tolist()))


SPAN_WIDTH = 1 << 32
"""More than any rank's samples, and a micro-batch's start times it fits in an int64 (:class:`_Spans`)."""


def _per_step(ends: np.ndarray, step_counts: np.ndarray) -> np.ndarray:
    """A rank's samples in each step, from the running ends of its micro-batches (all steps end to end) and
    its micro-batch count in each step."""
    totals = np.concatenate(([0], ends))[np.cumsum(step_counts)]
    return np.diff(totals, prepend=0)


class _Spans(dict[int, tuple[int, ...]]):
    """``start * width + end`` (``end < width``) to ``tuple(range(start, end))``, made once."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def __missing__(self, key: int) -> tuple[int, ...]:
        value = self[key] = tuple(range(*divmod(key, self.width)))
        return value


def _plain(group_id: Hashable) -> Hashable:
    """NumPy scalars as the Python numbers they hold, so ``to_dict()`` stays JSON-serialisable."""
    item = getattr(group_id, "item", None)
    return item() if type(group_id).__module__ == "numpy" and callable(item) else group_id
