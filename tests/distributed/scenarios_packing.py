"""This planner behind Megatron-LM's own ``wrap_data_iterator`` (a Megatron-LM main checkout on the path).

Each rank hands Megatron's real ``wrap_data_iterator`` an iterator of unpacked samples whose tokens all hold
the sample's id; Megatron gathers the lengths, asks the registered ``dpsched`` scheduler for the groups, moves
the samples with all-to-all and packs them as THD. The result per rank: the ids and sizes of the sequences of
every packed micro-batch it received (split at ``cu_seqlens_padded``), the micro-batch count and the FLOPs
sums Megatron returned. Megatron is imported inside the scenario: other launches never import it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from registry import scenario

PACKING_SCHEDULER_LAUNCH = "packing_scheduler2"
"""The launch of these scenarios: a Megatron-LM checkout on ``PYTHONPATH`` (``DPSCHED_MEGATRON_LM_SRC``)."""
CAP = 96
"""``max_seqlen_per_dp_cp_rank``."""
PAD = 8
"""Each sample's padded length is its length rounded up to this."""
SAMPLES_PER_RANK = 12


def sample_lengths(rank: int) -> list[int]:
    """The real lengths of rank ``rank``'s samples: short and long ones, one over the cap per rank."""
    return [(rank * 37 + i * 53) % 90 + 3 for i in range(SAMPLES_PER_RANK - 1)] + [CAP + 5 + rank]


def sample_id(rank: int, index: int) -> int:
    """The token value of rank ``rank``'s sample ``index`` (what identifies it after packing)."""
    return 1000 * (rank + 1) + index


def padded(length: int) -> int:
    return -(-length // PAD) * PAD


def _samples(rank: int) -> list[dict[str, torch.Tensor]]:
    samples = []
    for index, length in enumerate(sample_lengths(rank)):
        size = padded(length)
        tokens = torch.full((size,), sample_id(rank, index), dtype=torch.int64)
        samples.append({"tokens": tokens, "labels": tokens + 1, "position_ids": torch.arange(size),
                        "loss_mask": (torch.arange(size) < length).float(),
                        "original_seq_len": torch.tensor([length]), "padded_seq_len": torch.tensor([size])})
    return samples


def _groups(*, cp: int) -> SimpleNamespace:
    """Process groups of a 2-rank job: DP 2 (``cp=1``) or CP 2 (``cp=2``); TP = PP = 1."""
    rank = dist.get_rank()
    world = dist.new_group([0, 1])
    singles = [dist.new_group([r]) for r in range(2)]  # every rank creates every group
    return SimpleNamespace(dp=singles[rank] if cp == 2 else world, dp_cp=world, tp=singles[rank], pp=singles[rank])


def _received(cp: int) -> dict[str, Any]:
    from megatron.core.datasets import data_schedule
    from megatron.core.rerun_state_machine import RerunDataIterator

    from megatron_dpsched.megatron.packing_scheduler import register_packing_scheduler

    register_packing_scheduler()
    register_packing_scheduler()  # a second call changes nothing
    data_rank = dist.get_rank() // cp  # the CP ranks of one DP rank read the same samples
    config = SimpleNamespace(max_seqlen_per_dp_cp_rank=CAP, sequence_packing_scheduler="dpsched",
                             virtual_pipeline_model_parallel_size=None, microbatch_group_size_per_vp_stage=None)
    iterator = RerunDataIterator(iter(_samples(data_rank)))
    packed, count, token_sum, square_sum = data_schedule.wrap_data_iterator(
        iterator, config, SAMPLES_PER_RANK, pg_collection=_groups(cp=cp))
    micro_batches = []
    for _ in range(count):
        batch = next(packed)
        bounds = batch["cu_seqlens_padded"].tolist()
        micro_batches.append([(int(batch["tokens"][start]), end - start) for start, end in zip(bounds, bounds[1:])])
    return {"num_microbatches": count, "micro_batches": micro_batches, "token_sum": token_sum,
            "square_sum": square_sum,
            "registered": {key.value: cls.__name__ for key, cls in data_schedule.scheduler_map.items()}}


@scenario(world_size=2, launch=PACKING_SCHEDULER_LAUNCH, cases={"packing_dp2": 1, "packing_cp2": 2})
def packed_by_megatron(cp: int) -> dict[str, Any]:
    """Megatron's ``wrap_data_iterator`` with ``sequence_packing_scheduler="dpsched"``: DP 2 or CP 2."""
    return _received(cp)
