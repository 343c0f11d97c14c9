"""The pure half of the verl drop-in: verl's partition helpers and the capped per-rank micro-batch plan.

No torch: the index lists verl's workers use are planned here on plain token counts;
:mod:`megatron_dpsched.compat._verl_tensors` reads the counts off the batch and slices it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from megatron_dpsched.baselines.partition import karmarkar_karp
from megatron_dpsched.core.ordering import order_micro_batches
from megatron_dpsched.core.packing import pack_into, split_to_count
from megatron_dpsched.core.validation import MAX_TOKENS, is_int, is_real, require_sequence

VERL_WORKLOAD_LINEAR = 24576
"""verl's workload of a sample of ``s`` tokens is ``24576 * s + s**2`` (a 7B dense model, hidden 4096)."""


class VerlBalancingError(ValueError, AssertionError):
    """A bad argument: a ``ValueError`` naming it, and an ``AssertionError`` as verl's own checks raise."""


def ceildiv(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers (verl's ``ceildiv``)."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """The smallest multiple of ``b`` that is at least ``a`` (verl's ``roundup_divisible``)."""
    return ceildiv(a, b) * b


def calculate_workload(seqlen_list: Any) -> Any:
    """verl's workload estimate ``24576 * s + s**2``, elementwise on a tensor or array, or of one number."""
    return VERL_WORKLOAD_LINEAR * seqlen_list + seqlen_list**2


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``out[idx_map[i]] == i`` (verl's ``get_reverse_idx``)."""
    reverse = [-1] * len(idx_map)
    for position, index in enumerate(idx_map):
        if not is_int(index) or not 0 <= index < len(idx_map) or reverse[index] != -1:
            raise VerlBalancingError(f"idx_map must be a permutation of 0..{len(idx_map) - 1}; "
                                     f"idx_map[{position}] = {index!r}")
        reverse[index] = position
    return reverse


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[float], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """Split positions of ``seqlen_list`` into ``k_partitions`` non-empty parts of near-equal sum.

    verl's contract: heaviest part first, each part's indices sorted, ``equal_size`` gives every part
    ``len / k`` items. Largest differencing (Karmarkar-Karp), no cap: these are rank splits, not packings.
    """
    weights = _weights("seqlen_list", seqlen_list)
    k = _partition_count(k_partitions, len(weights))
    if equal_size and len(weights) % k:
        raise VerlBalancingError(f"equal_size needs len(seqlen_list) = {len(weights)} to be a multiple of "
                                 f"k_partitions = {k}")
    parts = karmarkar_karp(weights, k, equal_size=bool(equal_size))
    _fill_empty_parts(parts, weights)
    return parts


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], uid_list: Sequence[Hashable], k_partitions: int
) -> list[list[int]]:
    """``k_partitions`` sorted sample partitions that keep each run of equal uids together (verl's contract).

    Groups are runs of consecutive equal ``uid_list`` entries, weighed by the sum of their samples'
    :func:`calculate_workload`; every part gets the same number of groups (one more for some where the
    group count is not a multiple of ``k_partitions``).
    """
    lengths = _weights("seqlen_list", seqlen_list)
    require_sequence("uid_list", uid_list)
    if len(uid_list) != len(lengths):
        raise VerlBalancingError(f"seqlen_list and uid_list must have the same length, got {len(lengths)} "
                                 f"and {len(uid_list)}")
    groups: list[list[int]] = []
    for index, uid in enumerate(uid_list):
        if not groups or uid != uid_list[index - 1]:
            groups.append([])
        groups[-1].append(index)
    k = _partition_count(k_partitions, len(groups), what="uid groups")
    loads = [sum(calculate_workload(lengths[i]) for i in group) for group in groups]
    parts = karmarkar_karp(loads, k, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in parts]


def log_seqlen_unbalance(seqlen_list: Sequence[float], partitions: Sequence[Sequence[int]], prefix: str) -> dict:
    """verl's balance metrics: token sums of equal consecutive chunks (``min``, ``max``, ``minmax_diff``),
    of ``partitions`` (``balanced_min``, ``balanced_max``), and the mean per partition, keyed ``prefix/...``."""
    chunk = max(1, len(seqlen_list) // max(1, len(partitions)))
    chunks = [sum(seqlen_list[start:start + chunk]) for start in range(0, len(seqlen_list), chunk)] or [0]
    balanced = [sum(seqlen_list[i] for i in part) for part in partitions] or [0]
    return {
        f"{prefix}/min": min(chunks),
        f"{prefix}/max": max(chunks),
        f"{prefix}/minmax_diff": max(chunks) - min(chunks),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(chunks) / max(1, len(partitions)),
    }


def local_micro_batch_count(
    seqlen_list: Sequence[int], *, max_token_len: int, min_num_micro_batch: int | None = None
) -> int:
    """This rank's count before the DP agreement: verl's ``min(samples, ceil(tokens / max_token_len))``
    (at least ``min_num_micro_batch``), raised to the fewest micro-batches the packer fits under the cap."""
    lengths, cap = _capped_lengths(seqlen_list, max_token_len)
    count = min(len(lengths), ceildiv(sum(lengths), cap))
    if min_num_micro_batch is not None:
        count = max(count, _positive("min_num_micro_batch", min_num_micro_batch))
    _check_count(count, len(lengths), name="min_num_micro_batch")
    while pack_into(range(len(lengths)), lengths, cap, count) is None:
        count += 1  # ends at len(lengths): one sample per micro-batch always fits
    return count


def plan_micro_batches(
    seqlen_list: Sequence[int],
    *,
    max_token_len: int,
    num_micro_batches: int,
    use_dynamic_bsz_balance: bool = True,
) -> list[list[int]]:
    """Exactly ``num_micro_batches`` non-empty micro-batches (positions into ``seqlen_list``), each holding
    at most ``max_token_len`` tokens; run order as verl's (``use_dynamic_bsz_balance``: light ones at both ends).

    ``num_micro_batches`` at or above :func:`local_micro_batch_count` always fits.
    """
    lengths, cap = _capped_lengths(seqlen_list, max_token_len)
    count = _positive("num_micro_batches", num_micro_batches)
    _check_count(count, len(lengths), name="num_micro_batches")
    items = range(len(lengths))
    bins = pack_into(items, lengths, cap, count)
    if bins is None:
        fewest = local_micro_batch_count(lengths, max_token_len=cap)
        if fewest > count:
            raise VerlBalancingError(f"num_micro_batches={count} cannot hold these samples under max_token_len="
                                     f"{cap}; at least {fewest} are needed")
        bins = split_to_count(pack_into(items, lengths, cap, fewest) or [], lengths, count)
    assert len(bins) == count and all(bins), bins
    workloads = [calculate_workload(length) for length in lengths]
    order = "pipeline" if use_dynamic_bsz_balance else "none"
    return order_micro_batches(bins, workloads, order)


def _capped_lengths(seqlen_list: Sequence[int], max_token_len: int) -> tuple[list[int], int]:
    """Planning sizes (a fully masked row plans as 1 token) and the cap; ``VerlBalancingError`` for a
    sample over the cap (verl asserts ``max_token_len`` covers the longest sample)."""
    require_sequence("seqlen_list", seqlen_list)
    if not len(seqlen_list):
        raise VerlBalancingError("the batch is empty: there is nothing to split into micro-batches")
    cap = _positive("max_token_len", max_token_len)
    lengths = []
    for index, length in enumerate(seqlen_list):
        if not is_int(length) or not 0 <= length <= MAX_TOKENS:
            raise VerlBalancingError(f"seqlen_list[{index}] must be a token count >= 0, got {length!r}")
        if length > cap:
            raise VerlBalancingError(f"max_token_len must be at least the sequence length: max_token_len={cap}, "
                                     f"sample {index} has {length} tokens")
        lengths.append(max(1, int(length)))
    return lengths, cap


def _check_count(count: int, num_samples: int, *, name: str) -> None:
    if count > num_samples:
        raise VerlBalancingError(f"{name}: {count} micro-batches for {num_samples} samples; every micro-batch "
                                 f"needs a sample (num_micro_batches <= batch size)")


def _positive(name: str, value: object) -> int:
    if not is_int(value) or value < 1:
        raise VerlBalancingError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _weights(name: str, values: Sequence[float]) -> list[float]:
    """``values`` as a list of numbers >= 0 (a tensor or array through its ``tolist()``)."""
    tolist = getattr(values, "tolist", None)
    values = tolist() if callable(tolist) else values
    require_sequence(name, values)
    for index, value in enumerate(values):
        if not is_real(value) or not value >= 0:
            raise VerlBalancingError(f"{name}[{index}] must be a number >= 0, got {value!r}")
    return list(values)


def _partition_count(k_partitions: int, num_items: int, *, what: str = "items") -> int:
    k = _positive("k_partitions", k_partitions)
    if num_items < k:
        raise VerlBalancingError(f"number of {what} ({num_items}) < k_partitions ({k}): every partition "
                                 f"needs one")
    return k


def _fill_empty_parts(parts: list[list[int]], weights: Sequence[float]) -> None:
    """Give an empty part (possible with zero weights) the lightest item of the part with the most items."""
    for part in parts:
        if not part:
            donor = max(parts, key=len)
            lightest = min(donor, key=lambda i: (weights[i], i))
            donor.remove(lightest)
            part.append(lightest)  # the only item: still sorted
