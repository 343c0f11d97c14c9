"""Digests of whole plans, recorded in ``fixtures/`` and checked by ``test_plan_digests.py``.

Each record pins the plans (SHA-256 of ``to_dict()`` as sorted JSON) of one set of cases: ``speed`` (the cases of
:mod:`plans_before_speed`) and ``order`` (those of :mod:`plans_before_order`). A change of the planner that
changes a plan fails the test, which names the cases. When the change of plan is intended, one command
re-records every set from the working tree, with the commit it was run on::

    python tests/unit/plan_digests.py --regenerate
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plans_before_order
import plans_before_speed

from megatron_dpsched import build_dp_schedule

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python tests/unit/plan_digests.py --regenerate"
Cases = dict[str, tuple[list[int], dict[str, Any]]]
CASE_SETS: dict[str, Callable[[], Cases]] = {"speed": plans_before_speed.cases, "order": plans_before_order.cases}


def digest(lengths: list[int], kwargs: dict[str, Any]) -> str:
    """SHA-256 of the plan's ``to_dict()`` as sorted JSON."""
    schedule = build_dp_schedule(lengths, **kwargs)
    return hashlib.sha256(json.dumps(schedule.to_dict(), sort_keys=True).encode()).hexdigest()


def digests(cases: Cases) -> dict[str, str]:
    """``name -> digest`` of every case."""
    return {name: digest(lengths, kwargs) for name, (lengths, kwargs) in cases.items()}


def fixture(set_name: str) -> Path:
    return FIXTURES / f"plans_before_{set_name}.json"


def recorded(set_name: str) -> dict[str, Any]:
    """The record of one set: ``commit`` and ``command`` it was written by, and its ``digests``."""
    return json.loads(fixture(set_name).read_text(encoding="utf-8"))


def changes(record: dict[str, Any], now: dict[str, str]) -> str | None:
    """What differs between a record and today's digests, for a person; ``None`` when nothing does."""
    then = record["digests"]
    lines = [f"{label}: {', '.join(names)}" for label, names in (
        ("changed plans", sorted(name for name in then.keys() & now.keys() if then[name] != now[name])),
        ("cases not recorded", sorted(now.keys() - then.keys())),
        ("recorded cases gone", sorted(then.keys() - now.keys()))) if names]
    if not lines:
        return None
    return "\n".join([*lines, f"(recorded at {record['commit']}). If the change of plan is intended, "
                      f"re-record every set with `{COMMAND}` and commit the fixtures."])


def commit() -> str:
    """The checkout's commit, ``+ uncommitted changes`` when the package differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--", "megatron_dpsched")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} + uncommitted changes" if dirty else head


def regenerate() -> None:
    """Write every set's record from the planner of this checkout."""
    head = commit()
    for set_name, cases in CASE_SETS.items():
        record = {"commit": head, "command": COMMAND, "digests": digests(cases())}
        fixture(set_name).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{fixture(set_name).relative_to(ROOT)}: {len(record['digests'])} plans")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regenerate", action="store_true", required=True,
                        help="re-record every set's digests from this checkout's planner")
    parser.parse_args()
    regenerate()
