"""The GPT entry point under a virtual pipeline: Megatron's per-stage provider calls share one feed.

``pretrain()`` builds data iterators once per VPP stage through the datasets provider
(asserting it takes ``vp_stage``); the ``--cpu-dry-run`` path does the same. This runs
PP=2 x VPP=2 on 2 CPU processes for two steps, with a validation pass, and checks the
run completes with the planned micro-batch counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from entry import MODEL_BUILT, corpus_rows, errors, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed


def test_pipeline_with_virtual_stages_trains_and_evaluates(tmp_path: Path) -> None:
    rows = corpus_rows()
    data = write_token_jsonl(tmp_path / "corpus.jsonl", rows)
    valid = write_token_jsonl(tmp_path / "valid.jsonl", rows[::-1])
    argv = [*tiny_gpt_argv(num_layers=4), "--train-data-path", str(data), "--valid-data-path", str(valid),
            "--eval-global-batch-size", "4", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "8", "--train-iters", "2",
            "--eval-interval", "2", "--eval-iters", "1", "--lr", "1e-3", "--dp-schedule",
            "--dp-schedule-max-tokens-per-gpu", "48", "--dp-schedule-verify", "strict",
            "--step-stats-dir", str(tmp_path / "stats"), "--tensorboard-dir", str(tmp_path / "tb"),
            "--tensorboard-log-interval", "1", "--log-throughput"]
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert "validation loss at iteration 2" in log
    assert MODEL_BUILT in log
    assert "dp-schedule: train feed starts at step 0 (consumed_samples=0)" in log
    records = [json.loads(line) for f in sorted((tmp_path / "stats").glob("rank*.jsonl"))
               for line in f.read_text().splitlines()]
    counts = {r["step"]: r["micro_batches"] for r in records if "micro_batches" in r}
    assert sorted(counts) == [0, 1], counts
    assert all(count >= 2 for count in counts.values())  # interleaved schedule: at least the group of PP=2
    assert "dp-schedule step 0: micro-batches per rank" in log and "throughput per GPU (TFLOP/s/GPU)" in log
    _assert_tensorboard_holds_the_plan_figures(tmp_path / "tb", records)


def _assert_tensorboard_holds_the_plan_figures(folder: Path, records: list[dict]) -> None:
    """The ``dp-schedule/`` scalars of the event file equal what the ranks measured while training."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"dp-schedule/" + name for name in ("micro-batches", "tokens-per-rank-min", "tokens-per-rank-mean",
                                                    "tokens-per-rank-max", "imbalance", "token-imbalance", "padding",
                                                    "empty-micro-batches", "plan-seconds")}
    assert expected <= tags, tags
    by_iteration = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in expected}
    for step in (0, 1):  # iteration step + 1 logs step `step`; one pipeline stage's records are the DP rank's
        measured = [r for r in records if r["step"] == step and r["pp_rank"] == 0]
        assert by_iteration["dp-schedule/micro-batches"][step + 1] == measured[0]["micro_batches"]
        assert by_iteration["dp-schedule/tokens-per-rank-max"][step + 1] == max(r["tokens"] for r in measured)
        padding = 1 - sum(r["tokens"] for r in measured) / sum(r["padded_tokens"] for r in measured)
        assert abs(by_iteration["dp-schedule/padding"][step + 1] - padding) < 1e-6


STAND_IN = ["--spec", "megatron_dpsched.testing.cpu_attention", "gpt_layer_spec"]


@pytest.mark.parametrize("layout", [
    ["--tensor-model-parallel-size", "2", "--sequence-parallel", *STAND_IN, "--dp-schedule-collate-format", "thd"],
    ["--context-parallel-size", "2", *STAND_IN, "--dp-schedule-collate-format", "thd",
     "--position-embedding-type", "rope", "--no-rope-fusion"],
], ids=["tp2_sp_thd", "cp2_thd_rope"])
def test_cpu_dry_run_starts_with_tensor_and_context_parallelism(tmp_path: Path, layout: list[str]) -> None:
    data = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows())
    argv = [*tiny_gpt_argv(), "--data-path", str(data), "--global-batch-size", "8", "--train-iters", "2",
            "--lr", "1e-3", "--eval-iters", "0", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48",
            "--step-stats-dir", str(tmp_path / "stats"), *layout]
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert MODEL_BUILT in log and "dp-schedule step 1: micro-batches per rank" in log
    records = [json.loads(line) for f in sorted((tmp_path / "stats").glob("rank*.jsonl"))
               for line in f.read_text().splitlines()]
    assert {r["step"] for r in records if "micro_batches" in r} == {0, 1}


@pytest.mark.parametrize("scheduled", [True, False], ids=["dp-schedule", "megatron"])
def test_without_a_validation_set_training_ends_cleanly(tmp_path: Path, scheduled: bool) -> None:
    """Megatron's default --eval-iters with no validation data would evaluate a missing iterator."""
    data = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows())
    argv = [*tiny_gpt_argv(), "--data-path", str(data), "--split", "100,0,0", "--global-batch-size", "8",
            "--train-iters", "2", "--lr", "1e-3",
            *(["--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48"] if scheduled else [])]
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert "no validation data (--valid-data-path, or a --split share): validation is off (--eval-iters 100 -> 0)" \
        in log
    assert "iteration        2/       2" in log
