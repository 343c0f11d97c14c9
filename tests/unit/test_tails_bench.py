"""Issue 28 point 2's check: ``scripts/bench_steptime.py`` judges plans in its own pipeline simulator (1F1B and
interleaved, written apart from ``core/steptime.py``) and prints each setting's worst ratio against every peer."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import pytest

from megatron_dpsched.core import StepTimeModel, simulate_step
from megatron_dpsched.core.alignment import PipelineLayout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_steptime  # noqa: E402

MODEL = StepTimeModel(seconds_per_token=1e-3, seconds_per_token_pair=1e-7, seconds_per_microbatch=0.05)


def test_one_f_one_b_by_hand():
    """PP 2, two micro-batches of forward 2 and 4 (per stage 1 and 2, backward twice that): stage 0 runs F0 (0-1),
    F1 (1-3), then waits for B0 from stage 1 (F0 on 1: 1-2, B0 on 1: 2-4; F1 on 1: 4-6, B1 on 1: 6-10), B0 (4-6),
    B1 (10-14). The step ends at 14."""
    forward = bench_steptime.np.array([[2.0, 4.0]])
    assert bench_steptime.independent_makespans(forward, pp=2, vpp=1, group=2, backward_factor=2.0).tolist() == [14.0]


@pytest.mark.parametrize("seed", range(40))
def test_the_independent_simulator_agrees_with_the_planners(seed):
    """Two simulators written apart give the same step time on random plans of every layout (the bench's judge is
    the model the planner optimises, not its code)."""
    rng = random.Random(seed)
    pp, vpp = rng.choice([(1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (4, 3)])
    group = pp if vpp == 1 or rng.random() < 0.6 else pp + rng.randint(1, 3)
    layout = PipelineLayout(pp_size=pp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group if vpp > 1 else None)
    count = next(c for c in range(rng.randint(1, 24), 200) if layout.is_legal(c))
    sizes = [rng.randint(1, 4000) for _ in range(3 * count * 2)]
    ids = iter(range(len(sizes)))
    plan = [[[next(ids) for _ in range(rng.randint(0, 2))] for _ in range(count)] for _ in range(3)]
    ours = bench_steptime.independent_seconds(plan, sizes, layout=layout, model=MODEL)
    times = [[bench_steptime.forward_seconds([sizes[i] for i in mb], MODEL) for mb in rank] for rank in plan]
    assert ours == pytest.approx(simulate_step(times, layout=layout, model=MODEL).seconds, rel=1e-12)


def row(**peers: tuple[float, ...]) -> bench_steptime.Row:
    return bench_steptime.Row(dataset="synthetic_bimodal", pp=4, vpp=2, dp=64, cap=4096, timing="o=1c(2048)",
                              seconds={"default": 2.0, "step-time": 1.0, "exhaustive": 1.0},
                              microbatches={"default": 8, "step-time": 8}, step_ratios=(1.0, 1.002),
                              default_ratios=(2.0, 2.0), peer_ratios=peers)


def test_each_setting_prints_its_worst_ratio_against_each_peer_and_misses_name_them():
    args = argparse.Namespace(strict=True, model="workload", samples_per_rank=32, steps=2, kk_reference=True,
                              tflops=400.0, overhead_ms=10.0)
    rows = [row(slime_kk=(0.98, 1.007), verl=(0.99,))]
    table = bench_steptime.markdown(rows)
    assert "worst / slime_kk | worst / verl |" in table and "| 1.007 | 0.990 |" in table
    text = bench_steptime.summary(rows, [], args)
    assert "slime_kk worst 1.007, 1 of 2 steps behind by > 0.5%" in text
    assert "verl worst 0.990, 0 of 1 steps behind by > 0.5%" in text
    missed = bench_steptime.misses(rows, [], args)
    assert missed == ["synthetic_bimodal PP=4 VPP=2 dp=64 cap=4096 o=1c(2048): step-time / slime_kk worst step "
                      "1.0070 > 1.005"]
