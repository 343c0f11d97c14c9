"""scripts/bench_planning_speed.py: each case planned in its own process, its row printed, the docs section
written at the end of the page without touching what comes before it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_planning_speed.py"


def test_bench_prints_a_row_per_case_and_writes_its_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Table\n\nfigures of another script\n\n## Planning speed\n\nold rows\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cases", "uniform", "pp4_vpp2_steps", "--samples", "3000",
                           "--markdown", str(page)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| uniform") or line.startswith("| pp4")]
    assert len(rows) == 4  # each row as it comes, then the table
    assert "| uniform | 3,000 | 1024 | 1 |" in rows[0]
    assert "| pp4_vpp2_steps | 3,000 | 512 | 6 |" in rows[1]
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Table\n\nfigures of another script\n\n## Planning speed\n")
    assert "old rows" not in text and text.count("## Planning speed") == 1
    assert "| uniform | 3,000 |" in text and "python scripts/bench_planning_speed.py --markdown" in text
