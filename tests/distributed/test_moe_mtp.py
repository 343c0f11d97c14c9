"""MoE and multi-token prediction (MTP) with ``--dp-schedule``, on every rank.

1. MoE gradients (dropless top-2 of 4 experts, no load-balancing loss: micro-batch-independent maths)
   equal the one-process whole-batch reference's: alltoall and allgather dispatchers at DP2, alltoall
   at PP2 and DP2 x EP2 (``train_checks.assert_trained_like_reference``).
2. With the load-balancing loss (``aux_loss``, coefficient 0.01), at DP2 and PP2, and with MTP, the
   logged loss (what ``training_log`` writes to TensorBoard / W&B), the gradients and the grad norm of
   every step equal Megatron's own path on the same micro-batches (``scenarios_moe`` docstring): the
   whole-batch reference cannot express them, Megatron computes these losses per micro-batch. The
   logged losses also differ from what ``training_log``'s own ``1 / get_num_microbatches()`` scale would
   have logged during a scheduled step (the samples-based accounting count).
3. ``--cpu-dry-run`` through the entry point with ``--expert-model-parallel-size 2`` on 2 processes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from entry import corpus_rows, errors, tiny_gpt_argv, torchrun
from harness import TRAIN_ITERS
from registry import names
from scenarios_moe import EXPERTS
from train_checks import RTOL, assert_close, assert_trained_like_reference

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("layout", names("moe"))
def test_moe_trains_like_the_whole_batch_reference(launches, layout: str) -> None:
    (reference,) = launches.get("moe_reference")
    assert_trained_like_reference(launches.get(layout), reference)


def test_expert_parallel_ranks_hold_distinct_global_experts(launches) -> None:
    held = [{name.split("local_experts.")[1].split(".")[0] for name in r["weights"] if "local_experts" in name}
            for r in launches.get("moe_dp2_ep2")]
    assert held == [{"0", "1"}, {"2", "3"}]


def _logged_key(layout: str) -> str:
    return "mtp_1 loss" if layout.startswith("mtp") else "load_balancing_loss"


@pytest.mark.parametrize("layout", names("own_path"))
def test_logged_loss_grads_and_grad_norm_equal_megatrons_own_path(launches, layout: str) -> None:
    results = launches.get(layout)
    key = _logged_key(layout)
    for result in results:
        rank, scheduled, own = result["global_rank"], result["scheduled"], result["own"]
        assert all(ids for step in result["micro_batches"] for ids in step), "own path: no empty micro-batch"
        assert len(own) == len(scheduled["logged"]) == TRAIN_ITERS
        for step in range(TRAIN_ITERS):
            assert scheduled["logged"][step][key] == pytest.approx(own[step]["logged"][0][key], rel=1e-5), \
                f"rank {rank} step {step}: logged {key}"
            assert scheduled["grad_norms"][step] == pytest.approx(own[step]["grad_norms"][0], rel=RTOL)
            assert_close(scheduled["grads"][step], own[step]["grads"][0], f"rank {rank} step {step} grads")


@pytest.mark.parametrize("layout", names("own_path"))
def test_logged_loss_is_not_megatrons_accounting_scale(launches, layout: str) -> None:
    """``training_log`` divides by ``get_num_microbatches()``, the accounting count during a scheduled
    step; unpatched it would log ``logged x M / count`` for a step of ``M`` micro-batches."""
    key = _logged_key(layout)
    for result in launches.get(layout):
        counts = [len(step) for step in result["micro_batches"]]
        assert any(count != result["accounting_count"] for count in counts), counts
        for step, count in enumerate(counts):
            logged = result["scheduled"]["logged"][step][key]
            unscaled = logged * count / result["accounting_count"]
            if count != result["accounting_count"]:
                assert abs(logged - unscaled) > 1e-3 * abs(logged), f"step {step}: {logged} vs {unscaled}"


def test_cpu_dry_run_with_expert_parallelism(tmp_path: Path) -> None:
    data = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows())
    argv = [*tiny_gpt_argv(), *EXPERTS, "--moe-token-dispatcher-type", "alltoall",
            "--expert-model-parallel-size", "2", "--train-data-path", str(data), "--global-batch-size", "8",
            "--train-iters", "2", "--eval-iters", "0", "--lr", "1e-3", "--dp-schedule",
            "--dp-schedule-max-tokens-per-gpu", "48", "--dp-schedule-verify", "strict"]
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert "dp-schedule: train feed starts at step 0 (consumed_samples=0)" in log
    for step in (0, 1):
        assert f"dp-schedule step {step}: micro-batches per rank" in log
    assert "iteration        2/       2" in log and "load_balancing_loss" in log
    assert re.search(r"expert_model_parallel_size \.+ 2\n", log)
