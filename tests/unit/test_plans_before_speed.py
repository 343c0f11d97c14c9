"""The NumPy hot paths of issue 19 (point 5) plan exactly what the code before them planned: digests recorded
by running that code (:mod:`plans_before_speed`)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import plans_before_speed
import pytest

RECORDED = Path(__file__).parent / "fixtures" / "plans_before_speed.json"


@cache
def _cases() -> dict[str, tuple[list[int], dict[str, Any]]]:
    return plans_before_speed.cases()


@cache
def _recorded() -> dict[str, str]:
    return json.loads(RECORDED.read_text())


@pytest.mark.parametrize("name", sorted(plans_before_speed.cases()))
def test_plan_is_the_one_recorded_before_the_speed_work(name: str) -> None:
    lengths, kwargs = _cases()[name]
    assert plans_before_speed.digest(lengths, kwargs) == _recorded()[name]
