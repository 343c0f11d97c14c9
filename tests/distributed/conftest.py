"""Runs the multi-process launches once per session and hands their per-rank results to tests.

Scenarios, their world sizes and launches are declared once, with ``@scenario`` (``registry.py``).
"""

from __future__ import annotations

import pytest
from registry import REPO, LaunchResults

__all__ = ["REPO", "LaunchResults", "launches"]


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> LaunchResults:
    return LaunchResults(tmp_path_factory.mktemp("dp_schedule_launches"))
