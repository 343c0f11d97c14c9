"""Run-time trust checks in real Megatron ``train()`` on gloo: lying lengths and ranks with different plans.

Every case must stop every rank with a ``ValueError`` that names what is wrong, before a
single micro-batch of the affected step trains (weights unchanged), never a hang and never
a tensor-size error. See ``scenarios.py`` (``lying_*``, ``*_ranks_*``) for what the ranks run.
"""

from __future__ import annotations

import re

import pytest
from harness import LENGTHS
from scenarios import LYING_LENGTHS

pytestmark = pytest.mark.distributed

LENGTH_ERROR = re.compile(r"dp-schedule step 0, data-parallel rank (\d+): sample (\d+) has (\d+) tokens, "
                          r"but the plan was made with length (\d+) \((.+?)\)")


def _assert_nothing_trained(result: dict) -> None:
    assert result["error"] is not None, "the job trained without an error"
    assert result["records"] == [], "a micro-batch was read before the error"
    assert result["unchanged"], "weights changed before the error"


@pytest.mark.parametrize(("scenario", "planned", "source"), [
    ("lying_shorter", LYING_LENGTHS["shorter"], "the dataset's lengths"),
    ("lying_longer", LYING_LENGTHS["longer"], "the dataset's lengths"),
    ("lying_shipped_plan", LYING_LENGTHS["shorter"], "the shipped plan's lengths"),
])
def test_lying_lengths_fail_at_the_first_micro_batch_naming_the_sample(launches, scenario, planned, source) -> None:
    results = launches.get(scenario)
    assert len(results) == 2
    for result in results:
        _assert_nothing_trained(result)
        match = LENGTH_ERROR.search(result["error"])
        assert match, result["error"]
        rank, sample, actual, expected = (int(g) for g in match.groups()[:4])
        assert rank == result["dp_rank"]
        assert sample in result["first_micro_batch"], "the error must come from the rank's first micro-batch"
        assert actual == LENGTHS[sample] and expected == planned[sample] != actual
        assert match.group(5) == source


@pytest.mark.parametrize("scenario", ["dp2_ranks_reordered", "dp2_ranks_larger", "pp2_ranks_reordered"])
def test_ranks_with_different_plans_all_stop_in_the_first_step(launches, scenario) -> None:
    results = launches.get(scenario)
    assert len(results) == 2
    messages = {result["error"] for result in results}
    assert len(messages) == 1, "every rank must raise the same message"
    (message,) = messages
    for result in results:
        _assert_nothing_trained(result)
    assert "the ranks hold different plans for train step 0" in message
    assert re.search(r"ranks 0 step 0 fingerprint 0x[0-9a-f]{16}; ranks 1 step 0 fingerprint 0x[0-9a-f]{16}", message)
    assert "size" not in message.lower()


def test_a_nan_loss_stops_the_first_step_on_every_rank(launches) -> None:
    results = launches.get("nan_loss")
    assert len(results) == 2
    for result in results:
        assert result["error"] and result["error"].startswith("RuntimeError"), result["error"]
        assert "found NaN in local forward loss calculation" in result["error"], result["error"]
        assert result["unchanged"], "an update was applied after the NaN"
