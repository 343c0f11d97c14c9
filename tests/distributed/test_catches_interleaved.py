"""The forward-backward hook's check of a step's micro-batch count against Megatron's interleaved schedule, on a
real PP 2 pipeline group, including model chunks whose group size is below PP (issue 27, "Tests that catch")."""

from __future__ import annotations

import pytest
from scenarios_catches import INTERLEAVED_CASES

pytestmark = pytest.mark.distributed

PP = 2


def megatron_accepts(count: int, group: int) -> bool:
    """The interleaved schedule's rule, written out: ``PP <= group <= count`` and ``count % group`` 0 or >= PP."""
    return PP <= group <= count and (count % group == 0 or count % group >= PP)


def test_the_interleaved_check_refuses_what_megatron_would(launches) -> None:
    results = launches.get("interleaved_counts")
    assert len(results) == 2
    for result in results:
        for group, count in INTERLEAVED_CASES:
            message = result["refused"][group, count]
            if megatron_accepts(count, group):
                assert message is None, (group, count, message)
            else:
                assert message == (f"dp-schedule planned {count} micro-batches, which the interleaved schedule "
                                   f"rejects with --microbatch-group-size-per-virtual-pipeline-stage={group} and "
                                   f"PP={PP}; the plan and the model config disagree"), (group, count)
        assert [result["refused"][1, count] is not None for count in (2, 4, 6)] == [True] * 3  # group below PP
