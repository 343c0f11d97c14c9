"""The measured step-time benchmark (``scripts/bench_measured.py --quick``): real Megatron ``train_step`` on four
gloo processes (DP 2 x PP 2) under every plan, the plans taking turns step by step.

Checks the printed table's structure (a row per plan, the figures it promises, the skipped scheduler named) and,
from the step records the run kept, that every plan trained every sample exactly once, each step the samples its
plan gave that rank. No timing is asserted: the benchmark prints figures, it does not judge them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PLANS = ("project", "slime_kk", "verl", "nemo_rl", "megatron_lm_rl", "megatron_fixed")
HEADER = ("| setting | plan | micro-batches / rank | measured s | predicted s | measured / predicted | "
          "predicted on the cores s | measured / that | CPU s, all processes | simulated work s | "
          "project speed-up, measured | simulated | every sample once |")


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("bench_measured")
    env = {k: v for k, v in os.environ.items() if k != "DPSCHED_MEGATRON_LM_SRC"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_measured.py"), "--quick", "--out", str(out),
                           "--markdown", str(out / "table.md")], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, out


def test_table_has_a_row_per_plan_with_every_figure(quick) -> None:
    stdout, out = quick
    text = (out / "table.md").read_text()
    assert text.splitlines()[0] == HEADER and text in stdout
    rows = [line.split(" | ") for line in text.splitlines()[2:] if line.startswith("| dp2_pp2 |")]
    assert [row[1].split(" (")[0] for row in rows] == list(PLANS)
    for row in rows:
        measured, predicted, ratio = (float(row[i]) for i in (3, 4, 5))
        assert measured > 0 and predicted > 0 and ratio == pytest.approx(measured / predicted, rel=0.05)
        assert float(row[8]) > 0 and float(row[9]) > 0
        assert row[12].rstrip(" |") == "yes", row
    assert rows[0][10:12] == ["", ""] and all(row[10].endswith("x") and row[11].endswith("x") for row in rows[1:])
    assert "megatron_dp_balanced: skipped (no --megatron-lm-src checkout given)" in stdout
    for phrase in ("- dp2_pp2: per step, relative to the project's step, measured fastest ", "Kendall tau ",
                   "CPU share per pipeline stage ", "load average ", "Not trained: megatron_dp_balanced, skipped"):
        assert phrase in text, phrase


def test_every_plan_trained_each_of_its_samples_once_as_planned(quick) -> None:
    _, out = quick
    plans = json.loads((out / "dp2_pp2" / "plans.json").read_text())["plans"]
    assert sorted(plans) == sorted(PLANS)
    for name, plan in plans.items():
        records = [json.loads(line) for path in sorted((out / "dp2_pp2" / name).glob("rank*.jsonl"))
                   for line in path.read_text().splitlines()]
        first_stage = [r for r in records if r["pp_rank"] == 0]
        ids = sorted(i for r in first_stage for mb in r["micro_batch_ids"] for i in mb)
        assert ids == list(range(len(plan["lengths"]))), name
        offsets = [sum(plan["num_microbatches"][:step]) for step in range(len(plan["num_microbatches"]) + 1)]
        for r in first_stage:
            partition = plan["partitions"][r["dp_rank"]]
            planned = [[partition[p] for p in mb] for mb in
                       plan["micro_batch_indices"][r["dp_rank"]][offsets[r["step"]]:offsets[r["step"] + 1]]]
            assert r["micro_batches"] == len(planned), (name, r["dp_rank"], r["step"])
            assert [mb for mb in r["micro_batch_ids"] if mb] == [mb for mb in planned if mb], (name, r["dp_rank"])
