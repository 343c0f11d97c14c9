"""A 63-bit fingerprint of one step of a plan: what every rank of a job must agree on.

Two ranks that will train a step together must hold the same plan for it: the
same samples, with the same lengths, in the same micro-batches on the same
data-parallel ranks, under the same options. A rank that read its lengths in
another order, or from another file, plans differently, and Megatron would then
train some samples twice and others never, or hang in a pipeline transfer.
Comparing one integer per rank (min and max over the job) finds that before the
step runs.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import asdict
from operator import itemgetter
from typing import TYPE_CHECKING

from megatron_dpsched.core.validation import is_int, require_int

if TYPE_CHECKING:
    from megatron_dpsched.core.schedule import DPSchedule

FINGERPRINT_BITS = 63
"""Fingerprints are non-negative and fit a signed 64-bit integer, so ``-fingerprint`` fits too."""


def step_fingerprint(schedule: DPSchedule, step: int, *, first_sample: int = 0) -> int:
    """Hash of step ``step``: options, counts, and every rank's micro-batches (sizes, sample ids, lengths).

    ``first_sample`` is the position of the plan's sample 0 in a larger stream (a feed that
    plans one step at a time from a position in its dataset passes that position), so
    the same samples planned from different positions give different fingerprints.
    """
    if not is_int(step) or not 0 <= step < schedule.num_steps:
        raise ValueError(f"step must be in 0..{schedule.num_steps - 1}, got {step!r}")
    require_int("first_sample", first_sample, minimum=0, maximum=2**62)
    values = array("q", [first_sample, schedule.dp_size, schedule.num_microbatches[step],
                         schedule.step_num_samples[step]])
    lengths = schedule.lengths
    positions = schedule.step_micro_batch_range(step)
    for rank in range(schedule.dp_size):
        batches = schedule.micro_batch_indices[rank][positions.start : positions.stop]
        ids = [schedule.partitions[rank][p] for mb in batches for p in mb]
        values.append(-1)
        values.extend(len(mb) for mb in batches)
        values.extend(ids)
        values.extend(itemgetter(*ids)(lengths) if len(ids) > 1 else [lengths[i] for i in ids])
    digest = hashlib.blake2b(values.tobytes(), digest_size=8)
    digest.update(json.dumps(asdict(schedule.config), sort_keys=True).encode())
    return int.from_bytes(digest.digest(), "little") >> (64 - FINGERPRINT_BITS)
