"""Layout scenarios: packed sequences, TP/SP/CP, the distributed optimizer, bf16.

Each trains Megatron's real ``train()`` like :func:`scenarios.run_training` and is
compared in ``test_layouts.py`` with the one-process whole-batch reference that has
the same model flags (``reference`` or ``reference_rope``).
"""

from __future__ import annotations

from typing import Any

from harness import Layout
from registry import scenario
from scenarios import FeedCase, run_training

ROPE = ("--position-embedding-type", "rope", "--no-rope-fusion")
"""Rotary embeddings (what packed-sequence models use); the fused kernel needs a GPU."""
ADAM = ("--optimizer", "adam", "--lr", "0.01", "--min-lr", "0.01", "--adam-eps", "1e-4")
"""Megatron's distributed optimizer takes Adam (not SGD); a small step keeps the comparison smooth."""
DISTRIBUTED_OPTIMIZER = (*ADAM, "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather")

LAYOUTS2: dict[str, Layout] = {
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
}
LAYOUTS4: dict[str, Layout] = {"dp2_tp2": Layout(tp=2), "dp2_cp2_thd": Layout(cp=2, collate="thd", extra=ROPE)}


@scenario(world_size=4, launch="layouts4", cases=LAYOUTS4, tags={"layout"})
@scenario(world_size=2, launch="layouts2", cases=LAYOUTS2, tags={"layout"})
def train_layout(layout: Layout) -> dict[str, Any]:
    """Tag ``layout``: compared with the whole-batch reference of the same model flags."""
    return run_training(FeedCase(layout=layout))


@scenario(world_size=1, launch="references", cases={"reference_rope": Layout(extra=ROPE),
                                                    "reference_adam": Layout(extra=ADAM),
                                                    "reference_bf16": Layout(extra=("--bf16",))})
def reference_layout(layout: Layout) -> dict[str, Any]:
    """One process, every step one micro-batch of all its samples, with ``layout``'s model flags."""
    return run_training(FeedCase(layout=layout, feed="whole_batch"))
