"""pytest collects tests/unit and tests/distributed together (rootdir-relative imports, no packages): two
test modules with one basename stop the whole collection ("import file mismatch")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_its_own_basename() -> None:
    names = Counter(path.name for path in TESTS.rglob("*.py") if path.name != "conftest.py"
                    and "__pycache__" not in path.parts)
    assert not [name for name, count in names.items() if count > 1], names
