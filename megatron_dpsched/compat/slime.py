"""slime's ``build_dp_schedule``, backed by this planner.

Contract source: THUDM/slime, commit ``8a5397e251e62f965a59a5f9c1662fba8544cd84`` (the last commit
touching the file in the snapshot read, repository head ``624b824a898ab0ec1fcb4d373004c7f3852bf515``),
file ``slime/utils/dp_schedule.py``: the docstring of ``build_dp_schedule`` and of the module, and its
callers ``RolloutManager._split_train_data_by_dp`` (``slime/ray/rollout.py``), ``get_data_iterator`` /
``DataIterator`` (``slime/backends/megatron_utils/data.py``) and ``train`` (``slime/backends/megatron_utils/
model.py``). Only the contract was taken from there; the planning is :func:`megatron_dpsched.build_dp_schedule`.

Arguments, as slime passes them::

    partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
        args, train_parallel_config, total_lengths,
        global_batch_size=args.global_batch_size, rollout_indices=data["rollout_ids"])

* ``args``: a namespace; read by attribute: ``use_dynamic_batch_size`` (default False),
  ``max_tokens_per_gpu`` (the per-GPU token cap, needed with dynamic batching), ``micro_batch_size``
  (static batching), ``balance_data`` / ``balance_by_flops`` (balance a FLOPs model built from
  ``hidden_size``, ``num_layers``, ``num_attention_heads``, ``num_query_groups``, ``ffn_hidden_size``,
  ``padded_vocab_size``, ``swiglu`` where ``args`` has them), and ``pipeline_model_parallel_size``.
* ``train_parallel_config``: a mapping ``{"dp_size", "cp_size", "vpp_size",
  "microbatch_group_size_per_vp_stage"}`` (slime's actor builds it from ``mpu``: ``dp_size`` without
  context parallelism); an optional ``"pp_size"`` overrides ``args.pipeline_model_parallel_size``.
* ``total_lengths``: token count of every sample, in global order.
* ``global_batch_size``: rollouts (not samples) per optimizer step; ``num_rollouts // global_batch_size``
  steps are planned and the samples of trailing rollouts that do not fill a step are left out.
* ``rollout_indices``: the rollout id of every sample (``samples[i].index``); samples of one rollout
  stay in one step. Rollouts are taken in order of their first sample.

Slime makes ``global_batch_size`` and ``rollout_indices`` keyword-only; here they may also be passed by
position, as in ``build_dp_schedule(args, tp, total_lengths, global_batch_size, rollout_indices)``.

Returned, a tuple of lists as slime returns it:

* ``partitions[r]``: global sample indices data-parallel rank ``r`` trains, over all steps, in
  micro-batch order (what the rollout manager slices every per-sample field of ``rollout_data`` by);
* ``micro_batch_indices[r]``: rank ``r``'s micro-batches over all steps, each a list of positions into
  ``partitions[r]`` (what ``DataIterator`` reads, one micro-batch per ``get_next``); flattening it gives
  ``range(len(partitions[r]))``;
* ``num_microbatches[s]``: micro-batches every rank runs in step ``s`` (the same on every rank);
* ``global_batch_sizes[s]``: rollouts in step ``s`` (``global_batch_size`` for every step; slime's
  ``train_one_step`` scales the loss and steps the LR scheduler by it).

Every micro-batch holds at most ``max_tokens_per_gpu * cp_size`` tokens or is a single longer sample,
and every kept sample is placed exactly once (slime's documented invariants). Ranks are numbered as slime numbers
them: in every step rank 0 trains the heaviest set (the balanced load: FLOPs with ``balance_data``,
else tokens), then the next heaviest, as slime's Karmarkar-Karp partitioning orders its sets. Where it differs from
slime's own planner, on purpose:

* micro-batch counts follow Megatron's interleaved rule (``pp <= G <= M``, ``M % G == 0 or M % G >= pp``)
  with the real ``pp`` from ``args``; where ``pp`` is unknown, ``pp = G``, which is slime's "multiple of G";
* without ``balance_data`` ranks are balanced on tokens (slime deals micro-batches round-robin); with
  ``balance_by_flops`` the token cap still holds (slime's FLOPs packing may exceed it);
* the count per rank is the smallest legal one (not a multiple of ``dp_size`` micro-batches split out of
  one global first fit). slime's trainer needs every micro-batch non-empty, so where the planner leaves a
  rank an empty micro-batch (a rank with fewer samples than the step's count), the drop-in moves into
  it the cheapest sample of the micro-batch with the most samples of the busiest rank that has a
  multi-sample one (the cap still holds); a step with fewer samples than ``dp_size * num_microbatches``
  raises, as slime's splitting does;
* static batching raises where slime's static path raises: a step of ``n`` samples whose
  ``ceil(n / micro_batch_size)`` is not a multiple of ``dp_size`` (times ``G`` with VPP).

User errors raise :class:`SlimeScheduleError`, a ``ValueError`` naming the argument that is also an
``AssertionError`` where slime asserts or raises ``AssertionError`` (fewer rollouts than
``global_batch_size``, a step with fewer samples than ``dp_size``, dynamic batching without a cap, a static
step that does not split evenly), so callers written for slime keep working.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megatron_dpsched.compat._fill import fill_empty_micro_batches
from megatron_dpsched.core import CostModel, DPSchedule, ScheduleConfig, plan_schedule
from megatron_dpsched.core.schedule import assemble_schedule
from megatron_dpsched.core.steps import split_steps
from megatron_dpsched.core.validation import MAX_TOKENS, is_int, require_lengths, require_sequence

SLIME_CONTRACT = "THUDM/slime@8a5397e251e62f965a59a5f9c1662fba8544cd84:slime/utils/dp_schedule.py"
"""Where the argument and return contract comes from."""

SlimeTuple = tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]
"""``(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)``."""


class SlimeScheduleError(ValueError, AssertionError):
    """A bad argument: a ``ValueError`` naming it, and an ``AssertionError`` as slime's own checks raise."""


@dataclass(frozen=True, kw_only=True)
class SlimeSchedule:
    """slime's four returned fields, and the plan they come from."""

    partitions: tuple[tuple[int, ...], ...]
    """Per DP rank: global sample indices, all steps, in micro-batch order."""
    micro_batch_indices: tuple[tuple[tuple[int, ...], ...], ...]
    """Per DP rank: micro-batches over all steps, as positions into ``partitions[r]``."""
    num_microbatches: tuple[int, ...]
    """Per step: micro-batches per rank (the same on every rank)."""
    global_batch_sizes: tuple[int, ...]
    """Per step: rollouts trained (slime's loss-scale and LR-scheduler increment)."""
    schedule: DPSchedule
    """The plan (sample ids are the global indices of ``total_lengths``); ``to_dict()`` ships it."""

    def as_slime(self) -> SlimeTuple:
        """The tuple of lists slime's ``build_dp_schedule`` returns."""
        return (
            [list(p) for p in self.partitions],
            [[list(mb) for mb in rank] for rank in self.micro_batch_indices],
            list(self.num_microbatches),
            list(self.global_batch_sizes),
        )


def build_dp_schedule(
    args: Any,
    train_parallel_config: Mapping[str, Any],
    total_lengths: Sequence[int],
    global_batch_size: int,
    rollout_indices: Sequence[Hashable],
) -> SlimeTuple:
    """slime's ``build_dp_schedule`` (see the module docstring for the contract)."""
    return plan_slime_schedule(
        args, train_parallel_config, total_lengths, global_batch_size=global_batch_size,
        rollout_indices=rollout_indices,
    ).as_slime()


def plan_slime_schedule(
    args: Any,
    train_parallel_config: Mapping[str, Any],
    total_lengths: Sequence[int],
    *,
    global_batch_size: int,
    rollout_indices: Sequence[Hashable],
) -> SlimeSchedule:
    """:func:`build_dp_schedule`, returning a :class:`SlimeSchedule` (the plan included)."""
    try:
        return _plan(args, train_parallel_config, total_lengths, global_batch_size=global_batch_size,
                     rollout_indices=rollout_indices)
    except SlimeScheduleError:
        raise
    except ValueError as error:  # the planner's own checks, named after its arguments
        raise SlimeScheduleError(str(error)) from None


def _plan(
    args: Any,
    train_parallel_config: Mapping[str, Any],
    total_lengths: Sequence[int],
    *,
    global_batch_size: int,
    rollout_indices: Sequence[Hashable],
) -> SlimeSchedule:
    lengths = require_lengths(total_lengths, name="total_lengths")
    rollouts = _rollout_ids(rollout_indices, len(lengths))
    gbs = _positive_int("global_batch_size", global_batch_size)
    balance, cost_model = _balance(args)
    config = ScheduleConfig(global_batch_size=gbs, drop_last=True, balance=balance,
                            **_layout(args, train_parallel_config), **_batching(args))
    steps = _check_steps(rollouts, global_batch_size=gbs, dp_size=config.dp_size)
    if config.micro_batch_size is not None:
        _check_static_steps(steps, micro_batch_size=config.micro_batch_size, align=_slime_alignment(config))
    schedule = plan_schedule(lengths, config=config, groups=rollouts, cost_model=cost_model)
    try:
        schedule = heaviest_rank_first(fill_empty_micro_batches(schedule))
    except ValueError as error:
        raise SlimeScheduleError(f"{error}; give each step more rollouts (global_batch_size)") from None
    return SlimeSchedule(
        partitions=schedule.partitions,
        micro_batch_indices=schedule.micro_batch_indices,
        num_microbatches=schedule.num_microbatches,
        global_batch_sizes=(gbs,) * schedule.num_steps,
        schedule=schedule,
    )


def heaviest_rank_first(schedule: DPSchedule) -> DPSchedule:
    """``schedule`` with the ranks of every step reordered by descending load, as slime numbers them.

    slime's Karmarkar-Karp partitioning hands rank 0 the heaviest set of a step, then the next heaviest
    (load: the balanced cost; ties: more samples first, then the original rank order). Moving whole
    rank plans between ranks keeps every micro-batch, cap and count as planned.
    """
    plans = []
    for step in range(schedule.num_steps):
        ranks = [schedule.rank_step_micro_batches(r, step) for r in range(schedule.dp_size)]
        loads = [(sum(schedule.costs[i] for mb in rank for i in mb), sum(len(mb) for mb in rank)) for rank in ranks]
        order = sorted(range(schedule.dp_size), key=lambda r: (-loads[r][0], -loads[r][1], r))
        plans.append([[list(mb) for mb in ranks[r]] for r in order])
    ordered = assemble_schedule(plans, lengths=schedule.lengths, costs=schedule.costs, groups=schedule.groups,
                                config=schedule.config, dropped=list(schedule.dropped))
    ordered.check()
    return ordered


def _positive_int(name: str, value: object) -> int:
    if not is_int(value) or value < 1:
        raise SlimeScheduleError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _rollout_ids(rollout_indices: Sequence[Hashable], count: int) -> tuple[Hashable, ...]:
    require_sequence("rollout_indices", rollout_indices)
    if len(rollout_indices) != count:
        raise SlimeScheduleError(
            f"rollout_indices must hold one rollout id per sample: got {len(rollout_indices)} ids for "
            f"{count} total_lengths"
        )
    for index, rollout in enumerate(rollout_indices):
        try:
            hash(rollout)
        except TypeError:
            raise SlimeScheduleError(f"rollout_indices[{index}] = {rollout!r} is not hashable") from None
    return tuple(rollout_indices)


def _config_int(config: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if not is_int(value) or value < 1:
        raise SlimeScheduleError(f"train_parallel_config[{key!r}] must be an integer >= 1, got {value!r}")
    return int(value)


def _layout(args: Any, train_parallel_config: Mapping[str, Any]) -> dict[str, Any]:
    """Planner layout options from slime's ``train_parallel_config`` (and ``args`` for the pipeline size)."""
    if not isinstance(train_parallel_config, Mapping):
        raise SlimeScheduleError(
            f"train_parallel_config must be a mapping with 'dp_size', got {type(train_parallel_config).__name__}"
        )
    if "dp_size" not in train_parallel_config:
        raise SlimeScheduleError("train_parallel_config has no 'dp_size'")
    vpp = _config_int(train_parallel_config, "vpp_size", 1)
    group = _config_int(train_parallel_config, "microbatch_group_size_per_vp_stage", None)
    pp = _config_int(train_parallel_config, "pp_size", getattr(args, "pipeline_model_parallel_size", None))
    if pp is None:
        pp = (group or 2) if vpp > 1 else 1  # unknown: G stages make Megatron's rule slime's "multiple of G"
    return {
        "dp_size": _config_int(train_parallel_config, "dp_size", None),
        "cp_size": _config_int(train_parallel_config, "cp_size", 1),
        "pp_size": pp,
        "vpp_size": vpp,
        "microbatch_group_size_per_vp_stage": group if vpp > 1 else None,
    }


def _batching(args: Any) -> dict[str, int]:
    """``max_tokens_per_gpu`` with ``args.use_dynamic_batch_size``, else ``micro_batch_size``."""
    if getattr(args, "use_dynamic_batch_size", False):
        cap = getattr(args, "max_tokens_per_gpu", None)
        if not is_int(cap) or not 1 <= cap <= MAX_TOKENS:
            raise SlimeScheduleError(
                f"args.max_tokens_per_gpu must be an integer in 1..{MAX_TOKENS} with "
                f"args.use_dynamic_batch_size, got {cap!r}"
            )
        return {"max_tokens_per_gpu": int(cap)}
    mbs = getattr(args, "micro_batch_size", None)
    if not is_int(mbs) or mbs < 1:
        raise SlimeScheduleError(
            f"args.micro_batch_size must be an integer >= 1 without args.use_dynamic_batch_size, got {mbs!r}"
        )
    return {"micro_batch_size": int(mbs)}


def _balance(args: Any) -> tuple[str, CostModel | None]:
    """``balance="cost"`` with a FLOPs model of ``args``'s GPT under ``balance_data``, else tokens."""
    if not (getattr(args, "balance_data", False) or getattr(args, "balance_by_flops", False)):
        return "tokens", None
    try:
        model = CostModel.from_megatron_args(args)
    except AttributeError:  # args without the model's shape: balance tokens
        return "tokens", None
    return "cost", model


def _check_steps(
    rollouts: tuple[Hashable, ...], *, global_batch_size: int, dp_size: int
) -> list[list[int]]:
    """slime's preconditions: at least one full step, and every step has a sample per DP rank; the steps."""
    steps, _ = split_steps(len(rollouts), global_batch_size=global_batch_size, groups=rollouts, drop_last=True)
    if not steps:
        raise SlimeScheduleError(
            f"global_batch_size={global_batch_size} is more than the {len(set(rollouts))} rollouts "
            f"(num_rollouts) of rollout_indices; a step needs global_batch_size rollouts"
        )
    for number, step in enumerate(steps):
        if len(step) < dp_size:
            raise SlimeScheduleError(
                f"step {number} has {len(step)} samples, fewer than train_parallel_config['dp_size']="
                f"{dp_size}; every data-parallel rank needs at least one sample per step"
            )
    return steps


def _slime_alignment(config: ScheduleConfig) -> int:
    """What slime's micro-batch count per step must be a multiple of: ``dp_size``, times ``G`` with VPP."""
    group = config.microbatch_group_size_per_vp_stage if config.vpp_size > 1 else None
    return config.dp_size * (group or 1)


def _check_static_steps(steps: list[list[int]], *, micro_batch_size: int, align: int) -> None:
    """slime's static path: a step of ``n`` samples is ``ceil(n / micro_batch_size)`` micro-batches, which
    must split evenly over the ranks (and VPP groups); slime raises ``AssertionError`` otherwise."""
    for number, step in enumerate(steps):
        count = -(-len(step) // micro_batch_size)
        if count % align:
            raise SlimeScheduleError(
                f"step {number} has {len(step)} samples: {count} micro-batches of args.micro_batch_size="
                f"{micro_batch_size}, not a multiple of {align} (train_parallel_config['dp_size'], times "
                f"'microbatch_group_size_per_vp_stage' with VPP) as slime's static batching needs; give every "
                f"step a multiple of dp_size * micro_batch_size samples (or use args.use_dynamic_batch_size)"
            )
