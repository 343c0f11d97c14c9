"""This planner as Megatron-LM's packing scheduler, through Megatron's real ``wrap_data_iterator`` on 2 gloo
processes (``tests/distributed/scenarios_packing.py``): every sample arrives once, whole, on the ranks the plan
names, the micro-batch count is the plan's on every rank and every pack keeps the cap.

Needs ``DPSCHED_MEGATRON_LM_SRC``, a Megatron-LM checkout with ``megatron/core/datasets/data_schedule.py``'s
``BasePackingScheduler`` (main ``d98e8a6`` on); skipped without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from registry import REPO, LaunchResults
from scenarios_packing import CAP, SAMPLES_PER_RANK, padded, sample_id, sample_lengths

from megatron_dpsched.compat.megatron_packing import PackingLayout, sample_id_groups

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def megatron_lm(tmp_path_factory: pytest.TempPathFactory) -> LaunchResults:
    source = os.environ.get("DPSCHED_MEGATRON_LM_SRC")
    if not source:
        pytest.skip("set DPSCHED_MEGATRON_LM_SRC to a Megatron-LM checkout (main) to run its wrap_data_iterator")
    if not (Path(source) / "megatron" / "core" / "datasets" / "data_schedule.py").is_file():
        pytest.skip(f"{source} has no megatron/core/datasets/data_schedule.py")
    path = os.pathsep.join(filter(None, [str(REPO), source, os.environ.get("PYTHONPATH")]))
    return LaunchResults(tmp_path_factory.mktemp("packing"), env={"PYTHONPATH": path},
                         only=("packing_dp2", "packing_cp2"))


def _expected(cp: int) -> tuple[list[tuple[int, int]], list[list[list[int]]]]:
    """Every sample as ``(token id, padded size)`` in Megatron's global order, and the plan of the step."""
    samples = [(sample_id(rank, i), padded(length)) for rank in range(2 // cp)
               for i, length in enumerate(sample_lengths(rank))]
    layout = PackingLayout(max_seqlen_per_dp_cp_rank=CAP, dp_size=2 // cp, cp_size=cp)
    return samples, sample_id_groups([(gid, size) for gid, (_, size) in enumerate(samples)], layout=layout)


@pytest.mark.parametrize("cp", [1, 2])
def test_every_sample_arrives_once_as_planned(megatron_lm: LaunchResults, cp: int) -> None:
    ranks = megatron_lm.get("packing_dp2" if cp == 1 else "packing_cp2")
    samples, groups = _expected(cp)
    assert ranks[0]["registered"] == {"dp_balanced": "DpBalancedScheduler", "dpsched": "DPScheduleScheduler"}
    assert [r["num_microbatches"] for r in ranks] == [len(groups)] * 2
    for rank, result in enumerate(ranks):
        planned = [[samples[gid] for gid in micro_batch[rank]] for micro_batch in groups]
        assert result["micro_batches"] == [list(mb) for mb in planned]  # Megatron moved what the plan says
    data_ranks = ranks[:1] if cp == 2 else ranks  # CP ranks of one DP rank receive the same pack
    arrived = sorted(seq for r in data_ranks for mb in r["micro_batches"] for seq in mb)
    assert arrived == sorted(samples) and len(arrived) == 2 // cp * SAMPLES_PER_RANK
    for r in data_ranks:
        for mb in r["micro_batches"]:
            assert len(mb) == 1 or sum(size for _, size in mb) <= CAP * cp
    assert ranks[0]["token_sum"] == sum(size for _, size in samples)
