"""What only a job shows, on one launch of 2 gloo processes (``catches2``, no training step), each against a one-line
bug the rest of the suite let through (issue 27, "Tests that catch"): the forward-backward hook's check of a step's
micro-batch count against Megatron's interleaved schedule on a real PP 2 group (model chunks whose group size is below
PP included), and ``--dp-schedule-over-cap refuse`` counting the samples training will read."""

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


def test_over_cap_refuse_counts_the_samples_training_reads(launches) -> None:
    """Three samples of 50, 60 and 70 tokens past a cap of 40 at positions 16-18: two steps of 8 never read
    them; a run that reads 17 samples meets the first; one that reads all (no count given) meets the three."""
    for result in launches.get("over_cap_read"):
        assert result["16"] is None
        assert result["17"].startswith("--dp-schedule-over-cap refuse: 1 sample(s) of the train dataset are over the "
                                       "token cap of 40 (--dp-schedule-max-tokens-per-gpu x --context-parallel-size), "
                                       "the longest 50 tokens: id 16 (50 tokens);")
        assert result["None"].startswith("--dp-schedule-over-cap refuse: 3 sample(s) of the train dataset are over "
                                         "the token cap of 40 (--dp-schedule-max-tokens-per-gpu x "
                                         "--context-parallel-size), the longest 70 tokens: id 18 (70 tokens), id 17 "
                                         "(60 tokens), id 16 (50 tokens);")
