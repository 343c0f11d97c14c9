"""Cases of the plans of the planner before its hot paths moved to NumPy (issue 19, point 5).

The speed work must not change a plan, so the cases cover every path it touches: DP 1 to 64, caps from tight
to loose, ``pad_multiple``, ``padded_rows``, static ``micro_batch_size``, ``balance`` cost / tokens / none,
cost models that are not monotone in the length, groups, PP and VPP with and without a step-time model,
``balance_growth``, and lengths with many ties, all equal, a heavy tail past the cap and giants near it.

``fixtures/plans_before_speed.json`` holds their digests (:mod:`plan_digests` writes and checks it). They were
first recorded on the code before the speed work (c69506b) and the planner of today reproduced every one of
them before the record was regenerated from it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from megatron_dpsched.core import StepTimeModel

SHIPPED = Path(__file__).resolve().parents[2] / "megatron_dpsched" / "data"
FLOPS = 1e12


def workload(length: int) -> float:
    """verl's workload ``24576 L + L^2``."""
    return 24576.0 * length + float(length) * length


def bumpy(length: int) -> float:
    """A cost not monotone in the length: equal costs for unequal lengths, dearer short samples."""
    return float(length % 97 + 1)


def _shipped(name: str, count: int, rng: random.Random) -> list[int]:
    pool = [int(line) for line in (SHIPPED / f"{name}.txt").read_text().split()]
    return [rng.choice(pool) for _ in range(count)]


def length_sets(count: int, seed: str) -> dict[str, list[int]]:
    """Named length lists of ``count`` samples."""
    rng = random.Random(seed)
    return {
        "gsm8k": _shipped("gsm8k_train", count, rng),
        "mt_bench": _shipped("mt_bench_answers", count, rng),
        "ties": [rng.choice((64, 128, 128, 256, 512, 1000)) for _ in range(count)],
        "equal": [300] * count,
        "tail": [min(32768, int(rng.lognormvariate(7.0, 1.3)) + 1) for _ in range(count)],
        "giants": [rng.choice((3900, 4000, 4096)) if rng.random() < 0.05 else rng.randint(1, 900)
                   for _ in range(count)],
        "uniform": [rng.randint(1, 8000) for _ in range(count)],
    }


def _model(overhead: float) -> StepTimeModel:
    return StepTimeModel(seconds_per_token=24576 / FLOPS, seconds_per_token_pair=1 / FLOPS,
                         seconds_per_microbatch=overhead * workload(2048) / FLOPS)


def cases() -> dict[str, tuple[list[int], dict[str, Any]]]:
    """``name -> (lengths, build_dp_schedule keyword arguments)``."""
    out: dict[str, tuple[list[int], dict[str, Any]]] = {}
    for dp in (1, 3, 8, 64):
        sets = length_sets(24 * dp + 5, f"speed-{dp}")
        for set_name, lengths in sets.items():
            base = dict(dp_size=dp, global_batch_size=12 * dp)
            for cap in (4096, 16384):
                out[f"{set_name} dp={dp} cap={cap}"] = (lengths, {**base, "max_tokens_per_gpu": cap})
            out[f"{set_name} dp={dp} cap=4096 tokens"] = (lengths, {**base, "max_tokens_per_gpu": 4096,
                                                                    "balance": "tokens"})
            out[f"{set_name} dp={dp} cap=8192 none"] = (lengths, {**base, "max_tokens_per_gpu": 8192,
                                                                  "balance": "none"})
            out[f"{set_name} dp={dp} cap=4096 pad=64"] = (lengths, {**base, "max_tokens_per_gpu": 4096,
                                                                    "pad_multiple": 64})
            out[f"{set_name} dp={dp} cap=8192 rows"] = (lengths, {**base, "max_tokens_per_gpu": 8192,
                                                                  "padded_rows": True, "pad_multiple": 8})
            out[f"{set_name} dp={dp} cap=4096 bumpy"] = (lengths, {**base, "max_tokens_per_gpu": 4096,
                                                                   "cost_model": bumpy})
            out[f"{set_name} dp={dp} cap=4096 growth"] = (lengths, {**base, "max_tokens_per_gpu": 4096,
                                                                    "balance_growth": 0.25})
            out[f"{set_name} dp={dp} mbs=3"] = (lengths, {**base, "micro_batch_size": 3, "global_batch_size": 6 * dp})
            out[f"{set_name} dp={dp} mbs=2 none"] = (lengths, {**base, "micro_batch_size": 2,
                                                                "global_batch_size": 6 * dp, "balance": "none"})
        groups = [i // 3 for i in range(len(sets["gsm8k"]))]
        out[f"gsm8k dp={dp} cap=4096 groups"] = (sets["gsm8k"], {"dp_size": dp, "global_batch_size": 4 * dp,
                                                                 "max_tokens_per_gpu": 4096, "groups": groups})
    for dp in (8, 64):
        sets = length_sets(32 * dp, f"speed-pp-{dp}")
        for set_name in ("gsm8k", "ties", "tail", "giants"):
            lengths = sets[set_name]
            base = dict(dp_size=dp, global_batch_size=16 * dp, max_tokens_per_gpu=4096, cost_model=workload)
            for pp, vpp in ((1, 1), (4, 1), (4, 2)):
                layout = {"pp_size": pp, "vpp_size": vpp}
                out[f"{set_name} dp={dp} PP={pp}x{vpp} default"] = (lengths, {**base, **layout})
                for overhead in (1.0, 0.1):
                    out[f"{set_name} dp={dp} PP={pp}x{vpp} o={overhead:g}"] = (
                        lengths, {**base, **layout, "step_time_model": _model(overhead)})
            out[f"{set_name} dp={dp} PP=4x2 o=1 growth"] = (
                lengths, {**base, "pp_size": 4, "vpp_size": 2, "step_time_model": _model(1.0),
                          "balance_growth": 0.25})
            out[f"{set_name} dp={dp} PP=4x2 group=6 o=0.1 cap=16384"] = (
                lengths, {**base, "pp_size": 4, "vpp_size": 2, "microbatch_group_size_per_vp_stage": 6,
                          "step_time_model": _model(0.1), "max_tokens_per_gpu": 16384})
    for dp in (128, 256):
        sets = length_sets(40 * dp, f"speed-large-{dp}")
        for set_name in ("gsm8k", "ties", "equal", "tail", "uniform"):
            base = dict(dp_size=dp, global_batch_size=40 * dp)
            out[f"{set_name} dp={dp} large cap=16384"] = (sets[set_name], {**base, "max_tokens_per_gpu": 16384})
            out[f"{set_name} dp={dp} large cap=4096 pad=16"] = (sets[set_name], {**base, "max_tokens_per_gpu": 4096,
                                                                                "pad_multiple": 16})
            out[f"{set_name} dp={dp} large PP=4x2 o=1"] = (
                sets[set_name], {**base, "max_tokens_per_gpu": 16384, "pp_size": 4, "vpp_size": 2,
                                 "cost_model": workload, "step_time_model": _model(1.0)})
    return out
