"""The step-time model runs every stage's ops in the order Megatron's schedules do (rule 5 of core/steptime.py).

Single process, no torch.distributed: the order is rebuilt from megatron-core's own pure helpers
(``get_pp_rank_microbatches`` for the warm-up, ``get_schedule_table`` for the micro-batch / chunk table)
and the loop structure of ``forward_backward_pipelining_with_interleaving`` (warm-up forwards, then
forward-then-backward pairs, then the cool-down backwards; a backward pops its chunk's oldest input,
first in, first out), so only the loop, not the numbers, is restated here.
"""

from __future__ import annotations

from collections import deque

import pytest
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import schedules

from megatron_dpsched.core import PipelineLayout, stage_op_order

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

_STATE = ("_MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", "_MPU_PIPELINE_MODEL_PARALLEL_RANK",
          "_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE")


@pytest.fixture
def pipeline_rank(monkeypatch: pytest.MonkeyPatch):
    """Sets Megatron's pipeline sizes and rank through its setters; restores them afterwards."""
    for name in _STATE:
        monkeypatch.setattr(parallel_state, name, getattr(parallel_state, name))

    def set_rank(*, pp: int, vpp: int, stage: int) -> None:
        parallel_state.set_pipeline_model_parallel_world_size(pp)
        parallel_state.set_pipeline_model_parallel_rank(stage)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)

    return set_rank


def megatron_order(count: int, *, pp: int, vpp: int, group: int, stage: int) -> list[tuple[str, int, int]]:
    """``(kind, micro-batch, chunk)`` in the order Megatron's schedule for this rank runs them."""
    total, _, warmup, remaining = schedules.get_pp_rank_microbatches(count, vpp, group)
    if vpp == 1 and pp > 1:  # forward_backward_pipelining_without_interleaving computes its own
        assert warmup == min(pp - stage - 1, count)
    table = schedules.get_schedule_table(count, vpp, group)
    inputs = [deque() for _ in range(vpp)]  # input_tensors[chunk]

    def forward(k: int) -> tuple[str, int, int]:
        microbatch, chunk = table[k]
        inputs[chunk].append(microbatch)
        return ("F", microbatch, chunk)

    def backward(k: int) -> tuple[str, int, int]:
        chunk = vpp - 1 - table[k][1]  # get_model_chunk_id(k, forward=False)
        return ("B", inputs[chunk].popleft(), chunk)

    order = [forward(k) for k in range(warmup)]
    for k in range(remaining):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(remaining, total)]
    return order


def _cases() -> list[tuple[int, int, int | None, int]]:
    cases = []
    for pp in range(1, 7):
        for vpp in range(1, 5) if pp > 1 else (1,):
            for group in [None, *range(pp, pp + 5)] if vpp > 1 else (None,):
                layout = PipelineLayout(pp_size=pp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group)
                cases += [(pp, vpp, group, m) for m in range(1, 3 * layout.group_size + pp + 3) if layout.is_legal(m)]
    return cases


CASES = _cases()


def test_the_cases_cover_every_schedule_and_short_last_groups():
    assert len(CASES) > 800  # layouts x micro-batch counts; each checked on every stage
    assert any(pp == 1 for pp, _, _, _ in CASES)
    assert any(vpp == 1 and pp > m for pp, vpp, _, m in CASES)  # fewer micro-batches than stages
    assert any(vpp > 1 and m % (group or pp) != 0 for pp, vpp, group, m in CASES)  # a short last group


def test_pp1_is_forward_backward_no_pipelining(pipeline_rank):
    pipeline_rank(pp=1, vpp=1, stage=0)
    expected = [op for m in range(5) for op in (("F", m, 0), ("B", m, 0))]  # its loop: forward_step, backward_step
    assert megatron_order(5, pp=1, vpp=1, group=1, stage=0) == expected
    assert list(stage_op_order(PipelineLayout(), num_microbatches=5, stage=0)) == expected


def test_every_stage_runs_megatrons_order(pipeline_rank):
    mismatches = []
    for pp, vpp, group, count in CASES:
        layout = PipelineLayout(pp_size=pp, vpp_size=vpp, microbatch_group_size_per_vp_stage=group)
        for stage in range(pp):
            pipeline_rank(pp=pp, vpp=vpp, stage=stage)
            expected = megatron_order(count, pp=pp, vpp=vpp, group=layout.group_size, stage=stage)
            if list(stage_op_order(layout, num_microbatches=count, stage=stage)) != expected:
                mismatches.append((pp, vpp, group, count, stage))
    assert not mismatches, mismatches[:10]
