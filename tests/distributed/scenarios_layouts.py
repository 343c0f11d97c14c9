"""Layout scenarios: packed sequences, TP/SP/CP, the distributed optimizer, bf16.

Each trains Megatron's real ``train()`` like :func:`scenarios.run_training` and is
compared in ``test_layouts.py`` with the one-process whole-batch reference that has
the same model flags (``reference`` or ``reference_rope``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import Layout
from scenarios import run_training

ROPE = ("--position-embedding-type", "rope", "--no-rope-fusion")
"""Rotary embeddings (what packed-sequence models use); the fused kernel needs a GPU."""
ADAM = ("--optimizer", "adam", "--lr", "0.01", "--min-lr", "0.01", "--adam-eps", "1e-4")
"""Megatron's distributed optimizer takes Adam (not SGD); a small step keeps the comparison smooth."""
DISTRIBUTED_OPTIMIZER = (*ADAM, "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather")

LAYOUTS: dict[str, Layout] = {
    "thd_dp2": Layout(collate="thd", extra=ROPE),
    "bshd_dp2_rope": Layout(extra=ROPE),
    "thd_pp2": Layout(pp=2, collate="thd", extra=ROPE),
    "thd_pp2_vpp2": Layout(pp=2, vpp=2, collate="thd", extra=ROPE),
    "thd_tp2_sp": Layout(tp=2, sequence_parallel=True, collate="thd", extra=ROPE),
    "tp2": Layout(tp=2),
    "tp2_sp": Layout(tp=2, sequence_parallel=True),
    "cp2_bshd": Layout(cp=2, extra=ROPE),
    "cp2_thd": Layout(cp=2, collate="thd", extra=ROPE),
    "dp2_distributed_optimizer": Layout(extra=DISTRIBUTED_OPTIMIZER),
    "dp2_bf16": Layout(extra=("--bf16",)),
    "dp2_tp2": Layout(tp=2),
    "dp2_cp2_thd": Layout(cp=2, collate="thd", extra=ROPE),
}
"""Four processes: ``dp2_tp2`` and ``dp2_cp2_thd``; two for the others."""

REFERENCES: dict[str, Layout] = {"reference_rope": Layout(extra=ROPE), "reference_adam": Layout(extra=ADAM),
                                "reference_bf16": Layout(extra=("--bf16",))}

SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    **{name: (lambda layout=layout: run_training(layout)) for name, layout in LAYOUTS.items()},
    **{name: (lambda layout=layout: run_training(layout, reference=True)) for name, layout in REFERENCES.items()},
}
