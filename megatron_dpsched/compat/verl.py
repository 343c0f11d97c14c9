"""verl-style dynamic batching, planned once for the whole mini-batch on the driver.

verl (volcengine/verl, ``verl/utils/seqlen_balancing.py`` at commit
``b178a3cd56f58b2d502255daba591e92833930a7``; ``verl/workers/actor/megatron_actor.py``) plans per rank:
with ``use_dynamic_bsz`` every data-parallel rank calls ``rearrange_micro_batches(batch, max_token_len,
num_batches_divided_by=...)`` on its own share of the mini-batch (``ppo_mini_batch_size`` prompts times
``rollout.n``), takes ``ceil(tokens / max_token_len)`` micro-batches, agrees on the largest count over
the DP group (an all-reduce MAX, ``same_micro_num_in_dp``), rounds it up to a multiple of
``num_batches_divided_by`` (``microbatch_group_size_per_vp_stage`` under VPP), balances its own samples
over that count (``get_seqlen_balanced_partitions``), and returns the micro-batches with their index
lists. Which samples a rank gets is decided before that, without the token cap.

:func:`plan_mini_batch` plans the same mini-batch for all ranks at once with this package's planner:
which rank trains which sample, and each rank's micro-batches, balanced across ranks as well as within
them, with one shared count and no collective. Mapping of verl's parameters:

* ``max_token_len``: verl's ``max_token_len``, i.e. ``ppo_max_token_len_per_gpu`` (or
  ``log_prob_max_token_len_per_gpu``) times ``megatron.context_parallel_size``, as verl's Megatron actor
  computes it; every micro-batch holds at most this many tokens, or is one longer sample alone (verl
  refuses a sample longer than ``max_token_len``);
* ``num_batches_divided_by``: verl's argument of that name; the count is a multiple of it;
* ``use_dynamic_bsz_balance``: verl's argument of that name; ``True`` puts cheap micro-batches at both
  ends of each rank's list (pipeline warm-up and cool-down), ``False`` keeps the planner's order;
* ``same_micro_num_in_dp`` is always true (every rank runs ``num_micro_batches``); ``dp_group`` is not
  needed (the driver plans for all ranks).

The result gives per rank the mini-batch positions to dispatch to that rank (``rank_indices[r]``, in
micro-batch order: the driver's ``data.select_idxs(rank_indices[r])`` instead of ``data.chunk(dp_size)``)
and that rank's micro-batches as positions into its local batch (``micro_batch_indices[r]``: what
``rearrange_micro_batches`` returns as its second value on that rank, so ``restore_dynamic_batch`` works
unchanged). Ranks may get different sample counts. No micro-batch is empty (verl's partitioning asserts
that); a mini-batch with fewer samples than ``dp_size * num_micro_batches`` raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_dpsched.compat._fill import fill_empty_micro_batches
from megatron_dpsched.core import DPSchedule, ScheduleConfig, plan_schedule
from megatron_dpsched.core.cost import CostFunction
from megatron_dpsched.core.validation import require_bool, require_int, require_lengths

VERL_CONTRACT = "volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7:verl/utils/seqlen_balancing.py"
"""Where the parameter names and the per-rank return values come from."""


@dataclass(frozen=True, kw_only=True)
class MiniBatchPlan:
    """One mini-batch planned for every data-parallel rank."""

    rank_indices: tuple[tuple[int, ...], ...]
    """Per DP rank: positions in the mini-batch (``seqlen_list``) to send to that rank, in micro-batch order."""
    micro_batch_indices: tuple[tuple[tuple[int, ...], ...], ...]
    """Per DP rank: its micro-batches as positions into its local batch (``rank_indices[r]``)."""
    num_micro_batches: int
    """Micro-batches every rank runs (the same on every rank)."""
    max_token_len: int
    """The token cap of one micro-batch."""
    schedule: DPSchedule
    """The one-step plan (sample ids are mini-batch positions); ``to_dict()`` ships it."""

    def global_micro_batches(self, rank: int) -> tuple[tuple[int, ...], ...]:
        """Rank ``rank``'s micro-batches as positions in the mini-batch."""
        return self.schedule.rank_step_micro_batches(rank, 0)


def plan_mini_batch(
    seqlen_list: Sequence[int],
    *,
    dp_size: int,
    max_token_len: int,
    num_batches_divided_by: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    cost_model: CostFunction | None = None,
) -> MiniBatchPlan:
    """Plan one mini-batch (token counts ``seqlen_list``) for ``dp_size`` ranks (see the module docstring).

    ``cost_model`` (e.g. :class:`~megatron_dpsched.CostModel`) balances estimated FLOPs; ``None``
    balances tokens.
    """
    lengths = require_lengths(seqlen_list, name="seqlen_list")
    require_bool("use_dynamic_bsz_balance", use_dynamic_bsz_balance)
    config = ScheduleConfig(
        dp_size=require_int("dp_size", dp_size), global_batch_size=len(lengths),
        max_tokens_per_gpu=require_int("max_token_len", max_token_len), balance="tokens" if cost_model is None
        else "cost", microbatch_order="pipeline" if use_dynamic_bsz_balance else "none",
        **_divided_by(num_batches_divided_by),
    )
    planned = plan_schedule(lengths, config=config, cost_model=cost_model)
    try:
        schedule = fill_empty_micro_batches(planned)
    except ValueError as error:
        raise ValueError(f"seqlen_list: {error}") from None
    return MiniBatchPlan(
        rank_indices=schedule.partitions,
        micro_batch_indices=schedule.micro_batch_indices,
        num_micro_batches=schedule.num_microbatches[0],
        max_token_len=config.max_tokens_per_gpu,
        schedule=schedule,
    )


def _divided_by(num_batches_divided_by: int | None) -> dict[str, int]:
    """A count that is a multiple of ``G``: Megatron's interleaved rule with ``G`` stages and group ``G``."""
    if num_batches_divided_by is None:
        return {}
    group = require_int("num_batches_divided_by", num_batches_divided_by)
    if group == 1:
        return {}
    return {"pp_size": group, "vpp_size": 2, "microbatch_group_size_per_vp_stage": group}
