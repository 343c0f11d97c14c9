"""``scripts/bench_whatif_speed.py`` runs ``megatron-dpsched plan`` as a user does and prints each size's time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_benchmark_prints_a_row_per_size_layout_and_jobs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_whatif_speed.py"), "--sizes", "3000",
                           "--layouts", "pp4", "--jobs", "1", "2", "--phases"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"\d+ cores, load average [\d.]+", lines[0])
    assert lines[1].split() == ["samples", "layout", "jobs", "wall", "s", "CPU", "s", "target", "s", "met", "(wall)"]
    rows = [line.split() for line in lines[2:4]]
    assert [row[:3] for row in rows] == [["3000", "pp4", "1"], ["3000", "pp4", "2"]]
    assert all(row[5] == "10" and row[6] in ("yes", "NO") for row in rows)
    assert lines[4].startswith("    CPU s: read input ") and "dp-schedule planner (core)" in lines[4]
    assert list(tmp_path.iterdir()) == []  # the length files lived in a temporary folder


def test_targets_by_size() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import bench_whatif_speed as bench
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert [bench.target(n) for n in (1, 1_000_000, 1_000_001, 5_000_000, 5_000_001)] == [10.0, 10.0, 60.0, 60.0,
                                                                                           None]
