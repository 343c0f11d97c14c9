"""Cases of the plans of the planner before step 7 chose orders and tail counts.

Cases: the shipped length files, DP 8 and 64, caps 4096 and 16384, at PP=1 with a step-time model (no
sample past the cap: step 7 must keep today's plan) and without one at PP=1 and PP=4 (steps 1-6 are
unchanged).

``fixtures/plans_before_order.json`` holds their digests (:mod:`plan_digests` writes and checks it). They were
first recorded on the code before step 7 (452e471) and the planner of today reproduced every one of them
before the record was regenerated from it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from megatron_dpsched.core import StepTimeModel

SHIPPED = Path(__file__).resolve().parents[2] / "megatron_dpsched" / "data"
FILES = ("gsm8k_train", "mt_bench_answers")
FLOPS = 1e12


def workload(length: int) -> float:
    """verl's workload ``24576 L + L^2``."""
    return 24576.0 * length + float(length) * length


def cases() -> dict[str, tuple[list[int], dict[str, Any]]]:
    """``name -> (lengths, build_dp_schedule keyword arguments)``."""
    out = {}
    for name in FILES:
        pool = [int(line) for line in (SHIPPED / f"{name}.txt").read_text().split()]
        for dp in (8, 64):
            for cap in (4096, 16384):
                rng = random.Random(f"{name}-{dp}-{cap}")
                lengths = [rng.choice(pool) for _ in range(2 * 32 * dp)]
                base = dict(dp_size=dp, global_batch_size=32 * dp, max_tokens_per_gpu=cap, cost_model=workload)
                for overhead in (1.0, 0.1):
                    model = StepTimeModel(seconds_per_token=24576 / FLOPS, seconds_per_token_pair=1 / FLOPS,
                                          seconds_per_microbatch=overhead * workload(2048) / FLOPS)
                    out[f"{name} dp={dp} cap={cap} PP=1 o={overhead:g}"] = (lengths, {**base, "step_time_model": model})
                for pp in (1, 4):
                    out[f"{name} dp={dp} cap={cap} PP={pp} default"] = (lengths, {**base, "pp_size": pp})
    return out
