"""Every recorded plan is planned again, digest for digest (:mod:`plan_digests`): the NumPy hot paths of issue
19 (point 5) and step 7's choice of orders and tail counts changed no plan of these cases. A failure names the
cases whose plans changed; when that is intended, ``python tests/unit/plan_digests.py --regenerate`` re-records
them."""

from __future__ import annotations

import plan_digests
import pytest


@pytest.mark.parametrize("set_name", sorted(plan_digests.CASE_SETS))
def test_plans_are_the_recorded_ones(set_name: str) -> None:
    record = plan_digests.recorded(set_name)
    assert record["command"] == plan_digests.COMMAND and record["commit"]
    now = plan_digests.digests(plan_digests.CASE_SETS[set_name]())
    assert len(now) >= 32
    message = plan_digests.changes(record, now)
    assert message is None, f"plans_before_{set_name}: {message}"


def test_a_changed_plan_is_named_with_the_command_that_records_it() -> None:
    record = {"commit": "abc", "command": plan_digests.COMMAND, "digests": {"a": "1", "b": "2", "gone": "3"}}
    message = plan_digests.changes(record, {"a": "1", "b": "9", "new": "4"})
    assert message is not None
    assert "changed plans: b\n" in message and "cases not recorded: new\n" in message
    assert "recorded cases gone: gone\n" in message and "a," not in message
    assert "(recorded at abc)" in message and plan_digests.COMMAND in message
    assert plan_digests.changes(record, dict(record["digests"])) is None
