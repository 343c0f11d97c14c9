"""scripts/bench_baselines.py's comparison logic on hand-made rows: a baseline step that breaks the cap is
reported and never counted as a win (worst step, steps lost), as in bench_peers.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import bench_baselines  # noqa: E402


def _row(method: str, seconds: tuple[float, ...], violations: tuple[int, ...] | None = None) -> bench_baselines.Row:
    return bench_baselines.Row(setting=("set", 8, 4096, "pp1"), method=method, step_seconds=seconds, microbatches=2.0,
                               step_violations=violations or (0,) * len(seconds))


def test_a_baseline_wins_only_on_steps_that_keep_the_cap() -> None:
    ours = _row("dpsched", (1.0, 1.0, 1.0))
    mine = _row("dpsched+steptime", (1.0, 1.0, 1.0))
    breaking = _row("verl", (0.5, 1.1, 0.999), violations=(3, 0, 0))  # 2x faster on step 0, over the cap there
    capped = _row("slime_kk", (1.2, 0.98, 1.0))  # 2% faster on step 1 within the cap
    rows = [ours, mine, breaking, capped]
    assert bench_baselines.worst_step(breaking, ours) == 0.999
    assert bench_baselines.worst_step(capped, ours) == 0.98
    assert [line.split(":")[0] for line in bench_baselines.losses(rows, "dpsched")] == [
        "('set', 8, 4096, 'pp1') slime_kk"]
    assert bench_baselines.cap_breaking_wins(rows, "dpsched") == (1, 1)
    assert breaking.violations == 3


def test_a_baseline_over_the_cap_on_every_step_has_no_worst_step() -> None:
    ours = _row("dpsched", (1.0, 1.0))
    always = _row("verl", (0.5, 0.9), violations=(1, 2))
    assert math.isinf(bench_baselines.worst_step(always, ours))
    assert bench_baselines.fmt(bench_baselines.worst_step(always, ours)) == "-"
    assert bench_baselines.losses([ours, _row("dpsched+steptime", (1.0, 1.0)), always], "dpsched") == []
    assert bench_baselines.cap_breaking_wins([ours, always], "dpsched") == (2, 2)
