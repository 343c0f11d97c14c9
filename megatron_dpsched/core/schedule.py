"""Global data-parallel micro-batch schedule: the specification.

``build_dp_schedule`` plans every optimizer step of a stream of samples at
once, from their token counts alone. It is pure Python (no torch, no
Megatron), deterministic, and every rank that calls it with the same inputs
gets the same plan, so no collective is needed.

Every sample has a cost: ``cost_model(length)``, or without a ``cost_model``
the library default ``s + s^2 / 49152`` (:data:`~megatron_dpsched.core.cost.DEFAULT_COST_MODEL`:
tokens plus attention, shaped like a dense GPT layer of width 4096); with
``balance="tokens"`` it is the token count. Steps 3-6 balance and order by it.

Planned sizes. What the cap bounds is what collate builds. A sample's planned
size is its length rounded up to ``pad_multiple`` (the multiple collate pads every
sequence to: ``2 * CP``, times TP with sequence parallelism, the FP8 alignment); a
micro-batch's collated size is the sum of its samples' planned sizes (packed
``thd``), or with ``padded_rows`` (padded ``bshd``: one row per sample, each as long
as the longest) its sample count times its longest planned size. Steps 2-5 and 7
count planned sizes wherever they count tokens: the lower bound, rank capacities,
packing, the global packing, overflow repair and refinement moves, and the step-time
model's micro-batch times (what runs; with ``padded_rows`` ``rows x longest`` tokens and
``rows x longest^2`` attention pairs). With ``pad_multiple=1`` and no ``padded_rows``
(the defaults) planned sizes are the lengths. Costs stay those of the real lengths:
a cost is a property of one sample, while the padding a sample carries under
``padded_rows`` depends on which samples share its micro-batch, which step 3 does not
know yet; per-sequence padding adds fewer than ``pad_multiple`` tokens to a sample (and
packed attention runs on the real ``cu_seqlens``); and the lengths are what the plan
stores, fingerprints and checks against the data.

Steps (per optimizer step; 1 here, 2-6 in :mod:`megatron_dpsched.core.planning`, 7 in
:mod:`megatron_dpsched.core.objective`):

1. Cut the samples into steps: ``global_batch_size`` consecutive samples, or
   ``global_batch_size`` groups (in order of their first sample) with all of
   their samples. A trailing partial step is a smaller step, or with
   ``drop_last`` is reported in ``dropped``.
2. Lower bound: with a token cap ``C = max_tokens_per_gpu * cp_size`` the step
   needs at least ``L = oversize + max(ceil(tokens / C), #samples > C/2)``
   micro-batches (planned sizes; with ``padded_rows``, ``L`` is the count of the
   chunking of step 4 over the whole step, which is the fewest possible),
   so each rank runs at least ``M = align(ceil(L / dp_size))``,
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
   samples than ``M``. With ``padded_rows`` a sample of size ``s`` joins a
   micro-batch of ``k`` samples whose longest is ``m`` only if
   ``(k + 1) * max(m, s) <= C``; a rank's samples are chunked in decreasing size,
   each micro-batch taking as many as its first (longest) allows, ``C // m`` (the
   fewest micro-batches), and the largest micro-batches are split into their longer
   and their shorter samples until there are ``M``. A rank whose samples need more
   than ``M`` hands the samples of its emptiest micro-batches to the least-loaded
   ranks with room.
5. Otherwise (a rank overflowed, or the cap kept ranks from balancing: heavy
   tails at high fill), retry with the next legal ``M``, up to ``U``, the count
   of one global packing (the better of best-fit decreasing and first fit in
   arrival order, so never more than a global first fit; with ``padded_rows`` the
   chunking of step 4, the fewest), or with
   ``balance_growth`` up to ``U * (1 + balance_growth)``. A larger ``M`` is
   kept only if it cuts the busiest rank's cost by more than 2%; the search
   stops after two larger counts in a row bring nothing. If no count
   up to ``U`` fits, the global micro-batches are split to ``U * dp_size`` and
   dealt to ranks by LPT, which always works. A plan that is not yet balanced
   is first refined: single samples move off the busiest rank into a lighter
   rank's micro-batch with room, while that lowers the busiest rank's cost.
   ``balance="none"`` goes straight to this, dealing micro-batches round-robin.
6. Order each rank's micro-batches: with ``pp_size > 1`` the cheapest at both
   ends (pipeline warm-up and cool-down), the dearest in the middle.
7. Only with a ``step_time_model`` (token cap and ``balance`` ``"cost"`` or
   ``"tokens"``): steps 2-6 give the default plan at count ``D``; the step runs
   whichever candidate has the smallest simulated step time (the slowest
   rank's makespan, :func:`~megatron_dpsched.core.steptime.simulate_step`, on
   the candidate ordered as in step 6). Candidates, all at legal counts of at
   most ``B = max(M, align(n))`` with ``n`` the most samples a rank holds
   (beyond ``B`` every rank would only add empty micro-batches; a default above
   ``B`` is repacked to ``B``): the default; plans of steps 3-4 at each legal
   count below ``D`` (refined as in step 5), downward until one does not fit or
   two in a row are not faster; and with ``pp_size > 1`` the default's ranks
   repacked (step 4) into more micro-batches, each count at least 10% above
   the last, until two in a row are not faster and the count is twice the
   fastest so far, up to ``B`` and, with ``balance_growth > 0``, up to
   ``align(U * (1 + balance_growth))``; these are timed on the 8 ranks with the
   most work, and the best of them (by the rule below) on every rank. (With
   ``pp_size == 1`` a rank's time is the sum of its micro-batches' times, which
   more micro-batches of the same samples never lower.) Of the candidates no
   slower than the default, the one with the fewest micro-batches within 2% of
   the fastest is chosen. So with ``pp_size == 1``, no per-micro-batch time and
   costs proportional to the model's forward time, the plan is the default
   plan whenever no count below ``D`` comes within 2% of it (step 5 kept ``D``
   only for a cut of more than 2%).

Invariants (checked by :meth:`DPSchedule.check`, for every accepted input):

1. Every rank runs the same ``num_microbatches[s]`` micro-batches in step ``s``.
2. With ``max_tokens_per_gpu``, every micro-batch's collated size is at most
   ``C = max_tokens_per_gpu * cp_size``, or the micro-batch is a single sample
   (which alone may exceed it). The collated size is the sum over its samples of
   their lengths rounded up to ``pad_multiple``; with ``padded_rows``, its sample
   count times the longest of those rounded lengths (so with the defaults it is the
   token count). With ``micro_batch_size``, at most that many samples.
3. Flattening ``micro_batch_indices[r]`` gives ``range(len(partitions[r]))``;
   partitions are disjoint and their union is every sample not in ``dropped``.
4. ``num_microbatches[s]`` is legal for Megatron's schedule (interleaved rule
   with ``vpp_size > 1``) and at least the aligned lower bound ``M`` of step 2.
   Without a ``step_time_model`` it is also at most ``U`` (the count of one
   global packing, step 5; ``align(U * (1 + balance_growth))`` with
   ``balance_growth``); with one it may exceed ``U`` when the simulated step
   time says more micro-batches are faster (step 7), but never ``B = max(M,
   align(n_s))``, ``n_s`` the most samples one rank trains in step ``s``. The
   checker verifies the bounds it can derive from the plan alone: ``M``, and
   ``B`` for plans made with a ``step_time_model``.
5. Samples of one group are in the same step; steps follow the input order;
   every step but a trailing one holds exactly ``global_batch_size`` samples
   (groups); ``step_num_samples[s]`` counts the samples of step ``s``; only a
   trailing partial step can be dropped, and only with ``drop_last``.
6. The plan is well formed: every length is an integer in ``1..2**31-1``,
   every cost a finite number > 0, ``pad_multiple`` an integer of at most ``C``
   (checked when the config is built), sample ids, positions and counts are
   integers, there is at least one step, and every step trains at least one
   sample. Steps and ``dropped`` are exactly the cut of step 1 (invariant 5).

Every rank of a job that calls the planner with the same inputs gets the same
plan; :meth:`DPSchedule.step_fingerprint` gives a 63-bit hash of one step that
the Megatron layer compares across ranks before the step runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from megatron_dpsched.core.config import RankPlan, ScheduleConfig
from megatron_dpsched.core.cost import DEFAULT_COST_MODEL, CostFunction, require_cost_model, sample_costs
from megatron_dpsched.core.planning import plan_step
from megatron_dpsched.core.steps import split_steps
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import ArgumentError, require_lengths


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
    make the cap bound collated micro-batches (see "Planned sizes" in the module docstring).
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
    _check_plan_size(config, steps)
    require_cost_model(cost_model)
    costs = sample_costs(sizes, _cost_function(config, cost_model))
    plans = [plan_step(step, sizes=sizes, costs=costs, config=config) for step in steps]
    return assemble_schedule(plans, sizes=sizes, costs=costs, groups=groups, config=config, dropped=dropped)


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
        groups=None if groups is None else tuple(_plain(g) for g in groups),
        partitions=tuple(tuple(p) for p in partitions),
        micro_batch_indices=tuple(tuple(mbs) for mbs in micro_batch_indices),
        num_microbatches=tuple(len(step_plan[0]) for step_plan in plans),
        step_num_samples=tuple(sum(len(mb) for rank in step for mb in rank) for step in plans),
        dropped=tuple(dropped),
    )


def _plain(group_id: Hashable) -> Hashable:
    """NumPy scalars as the Python numbers they hold, so ``to_dict()`` stays JSON-serialisable."""
    item = getattr(group_id, "item", None)
    return item() if type(group_id).__module__ == "numpy" and callable(item) else group_id
