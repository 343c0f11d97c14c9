"""verl's dynamic batch size ("use_dynamic_bsz") with its driver-side DP balancing.

Read at volcengine/verl commit b178a3cd56f58b2d502255daba591e92833930a7:

- ``verl/trainer/ppo/ray_trainer.py``, ``RayPPOTrainer._balance_batch``: the driver splits the
  batch over DP ranks with Karmarkar-Karp on ``calculate_workload`` (``24576 * s + s**2``) with
  equal sample counts per rank, then orders each rank's samples by workload, ascending for the
  even positions and descending for the odd ones (``p[::2] + p[1::2][::-1]``).
- ``verl/utils/seqlen_balancing.py``, ``rearrange_micro_batches``, ``get_seqlen_balanced_partitions``,
  ``karmarkar_karp``: each rank asks for ``min(samples, ceil(tokens / max_token_len))``
  micro-batches, all-reduces the MAX over DP, rounds up to a multiple of
  ``microbatch_group_size_per_vp_stage`` with VPP (``num_batches_divided_by``), then splits its
  samples into that many parts by Karmarkar-Karp on the workload with no cap (so a part may
  hold more than ``max_token_len`` tokens), sorts the parts by workload descending and runs
  them as ``parts[::2][::-1] + parts[1::2]``: the lightest at both ends.

Where verl would stop, this plan goes on: verl asserts the batch divides by the DP size
(here the heavier runs of the equal-size split are one short), asserts every sample fits the cap
(here a longer sample is one more item to partition), and asserts a rank has at least as many
samples as micro-batches (here such a rank runs empty micro-batches after its samples). A
multiple of the group size is always a legal VPP count, so no further padding is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from megatron_dpsched.baselines.partition import karmarkar_karp, pad_to_legal, round_up
from megatron_dpsched.core.config import RankPlan, ScheduleConfig

WORKLOAD_PER_TOKEN = 24576
"""``calculate_workload``'s linear coefficient: ``12 * h**2 / (2 * h)`` with ``h = 4096`` (a 7B
model's FLOPs per token in units of its attention FLOPs per token pair)."""


def workload(length: int) -> int:
    """verl's estimate of a sample's compute: ``24576 * s + s**2``."""
    return WORKLOAD_PER_TOKEN * length + length * length


def verl_plan(
    step: list[int], *, sizes: Sequence[int], costs: Sequence[float], config: ScheduleConfig
) -> list[RankPlan]:
    """Karmarkar-Karp over DP ranks, then over each rank's micro-batches (module docstring)."""
    ranks = [
        _light_at_both_ends_samples([step[p] for p in part], sizes)
        for part in karmarkar_karp([workload(sizes[i]) for i in step], config.dp_size, equal_size=True)
    ]
    count = max(min(len(rank), math.ceil(sum(sizes[i] for i in rank) / config.token_cap)) for rank in ranks)
    if config.layout.interleaved:
        count = round_up(count, config.layout.group_size)
    return pad_to_legal([_micro_batches(rank, sizes, count) for rank in ranks], config.layout)


def _light_at_both_ends_samples(samples: list[int], sizes: Sequence[int]) -> list[int]:
    """The driver's order of a rank's samples: by workload, even positions up, odd ones down."""
    ordered = sorted(samples, key=lambda i: (workload(sizes[i]), i))
    return ordered[::2] + ordered[1::2][::-1]


def _micro_batches(samples: list[int], sizes: Sequence[int], count: int) -> RankPlan:
    """``rearrange_micro_batches`` on one rank: uncapped Karmarkar-Karp, lightest at both ends."""
    parts = min(count, len(samples))
    if parts == 0:
        return [[] for _ in range(count)]
    loads = [workload(sizes[i]) for i in samples]
    split = karmarkar_karp(loads, parts, equal_size=False)
    split.sort(key=lambda part: (sum(loads[p] for p in part), part[0]), reverse=True)
    ordered = split[::2][::-1] + split[1::2]
    return [[samples[p] for p in part] for part in ordered] + [[] for _ in range(count - parts)]
