"""Scenarios of the tests that catch one-line bugs only a job shows (``test_catches_*.py``): one cheap launch of
2 processes, ``catches2``, and no training step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import harness
from harness import Layout
from registry import scenario

INTERLEAVED_CASES = ((1, 2), (1, 4), (1, 6), (2, 2), (2, 3), (2, 4), (2, 5), (3, 5), (3, 4))
"""``(--microbatch-group-size-per-virtual-pipeline-stage, micro-batch count)`` pairs checked on PP 2, VPP 2."""


@scenario(world_size=2, launch="catches2")
def interleaved_counts() -> dict[str, Any]:
    """PP 2 x VPP 2 on the job's real pipeline group: what the forward-backward hook's check of the interleaved
    schedule says of each count, with model chunks whose config holds the group size of the case."""
    from megatron_dpsched.megatron.hooks import check_interleaved_count

    args = harness.parse_megatron_args(harness.base_argv() + Layout(pp=2, vpp=2).argv())
    harness.initialize(args)
    try:
        refused: dict[tuple[int, int], str | None] = {}
        for group, count in INTERLEAVED_CASES:
            chunks = [SimpleNamespace(config=SimpleNamespace(microbatch_group_size_per_vp_stage=group))] * 2
            try:
                check_interleaved_count(count, chunks)
                refused[group, count] = None
            except ValueError as error:
                refused[group, count] = str(error)
        return {"refused": refused}
    finally:
        harness.teardown()


OVER_CAP_LENGTHS = (*harness.LENGTHS[:16], 50, 60, 70)
"""16 samples under the cap of 40 (two steps of 8), then three over it that two steps never read."""


class _Lengths(list):
    """A dataset of :data:`OVER_CAP_LENGTHS` (the feed only reads ``lengths`` before training)."""

    lengths = OVER_CAP_LENGTHS


@scenario(world_size=2, launch="catches2")
def over_cap_read() -> dict[str, Any]:
    """``--dp-schedule-over-cap refuse`` on the samples training will read: ``build_feed``'s message (or
    ``None``) when Megatron asks for 16, 17 and all samples."""
    from megatron_dpsched.megatron.provider import build_feed

    args = harness.parse_megatron_args(harness.base_argv(train_iters=2, extra=["--dp-schedule-over-cap", "refuse"]))
    harness.initialize(args)
    try:
        dataset = _Lengths(harness.make_sample(i % len(harness.LENGTHS)) for i in range(len(OVER_CAP_LENGTHS)))
        messages: dict[str, str | None] = {}
        for needed in (16, 17, None):
            try:
                build_feed(dataset, args=args, role="train", num_samples=needed).close()
                messages[str(needed)] = None
            except ValueError as error:
                messages[str(needed)] = str(error)
        return messages
    finally:
        harness.teardown()
