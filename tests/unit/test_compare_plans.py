"""``scripts/compare_plans.py``: two checkouts' plans on random cases, each case named where they differ."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compare_plans.py"


def compare(base: Path, head: Path, *, cases: int = 40) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(base), str(head), "--cases", str(cases), "--seed", "3"],
                          capture_output=True, text=True, timeout=300)


def test_a_checkout_against_itself_differs_nowhere() -> None:
    done = compare(REPO, REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("40 cases (seed 3): ") and done.stdout.rstrip().endswith("; 0 differ")


def test_a_planner_that_balances_differently_is_named_case_by_case(tmp_path: Path) -> None:
    shutil.copytree(REPO / "megatron_dpsched", tmp_path / "megatron_dpsched",
                    ignore=shutil.ignore_patterns("__pycache__"))
    planning = tmp_path / "megatron_dpsched" / "core" / "planning.py"
    text = planning.read_text()
    assert "\nBALANCE_TOLERANCE = 0.02\n" in text
    planning.write_text(text.replace("\nBALANCE_TOLERANCE = 0.02\n", "\nBALANCE_TOLERANCE = 0.5\n"))
    done = compare(REPO, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    differ = int(done.stdout.splitlines()[0].rsplit("; ", 1)[1].split()[0])
    assert differ > 0 and len([line for line in done.stdout.splitlines() if line.startswith("  case ")]) == differ
