"""verl's sequence-balancing API (``verl/utils/seqlen_balancing.py``), backed by this planner, at two levels.

Contract source: volcengine/verl, commit ``b178a3cd56f58b2d502255daba591e92833930a7``,
``verl/utils/seqlen_balancing.py`` (signatures, docstrings, return shapes and orders), its tests
``tests/utils/test_seqlen_balancing.py``, and its callers (``verl/workers/actor/megatron_actor.py``,
``dp_actor.py``, the critics, ``verl/trainer/ppo/ray_trainer.py``). Only the contract was taken from there.

**Level 1, per rank (change an import).** The names verl's workers, trainer and tests import, with
verl's signatures and return values: :func:`rearrange_micro_batches`, :func:`prepare_dynamic_batch`,
:func:`restore_dynamic_batch`, :func:`get_reverse_idx`, :func:`ceildiv`, :func:`roundup_divisible`,
:func:`calculate_workload`, :func:`get_seqlen_balanced_partitions`, :func:`get_group_balanced_partitions`
and :func:`log_seqlen_unbalance`. ``rearrange_micro_batches`` (and ``prepare_dynamic_batch`` over it)
packs with this package's packer, so no micro-batch of two or more samples ever holds more than
``max_token_len`` tokens (verl's Karmarkar-Karp split has no cap and goes over it). The count is verl's
(``min(samples, ceil(tokens / max_token_len))``, at least ``min_num_micro_batch``, the MAX over
``dp_group`` with ``same_micro_num_in_dp``, rounded up to ``num_batches_divided_by``) except where the
samples do not fit under the cap in that many: then it is the fewest that fit (before the MAX, so every
rank still runs the same count). The tensor functions import torch when called; this module imports none.

**Level 2, on the driver (change the dispatch).** :func:`plan_mini_batch` plans a whole mini-batch for
every data-parallel rank at once: which rank trains which sample (balanced across ranks, not only within
them) and each rank's micro-batches, with one shared count and no collective; ranks may get different
sample counts, so the driver dispatches ``rank_indices[r]`` to rank ``r`` instead of equal chunks.

verl's per-rank planning: with ``use_dynamic_bsz`` every data-parallel rank calls
``rearrange_micro_batches(batch, max_token_len, num_batches_divided_by=...)`` on its own share of the
mini-batch, agrees on the largest count over the DP group (``same_micro_num_in_dp``), balances its own
samples over that count and returns the micro-batches with their index lists. Which samples a rank gets
is decided before that, without the token cap. Mapping of :func:`plan_mini_batch`'s parameters:

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
unchanged). No micro-batch is empty (verl's partitioning asserts that); a mini-batch with fewer samples
than ``dp_size * num_micro_batches`` raises ``ValueError``.

User errors at level 1 raise :class:`VerlBalancingError`, a ``ValueError`` naming the argument that is
also an ``AssertionError`` where verl asserts, so callers written for verl keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_dpsched.compat._fill import fill_empty_micro_batches
from megatron_dpsched.compat._verl_partitions import (
    VerlBalancingError,
    calculate_workload,
    ceildiv,
    get_group_balanced_partitions,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    local_micro_batch_count,
    log_seqlen_unbalance,
    plan_micro_batches,
    roundup_divisible,
)
from megatron_dpsched.compat._verl_tensors import (
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
    select_rows,
)
from megatron_dpsched.core import DPSchedule, ScheduleConfig, plan_schedule
from megatron_dpsched.core.cost import CostFunction
from megatron_dpsched.core.validation import require_bool, require_int, require_lengths

__all__ = [
    "VERL_CONTRACT",
    "MiniBatchPlan",
    "VerlBalancingError",
    "calculate_workload",
    "ceildiv",
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "local_micro_batch_count",
    "log_seqlen_unbalance",
    "plan_micro_batches",
    "plan_mini_batch",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
    "roundup_divisible",
    "select_rows",
]

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
