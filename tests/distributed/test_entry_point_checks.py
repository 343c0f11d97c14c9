"""Bad flags and too little data stop the GPT entry point with a message naming them, before the model
or the training it would corrupt; what plain Megatron accepts still trains."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from entry import MODEL_BUILT, corpus_rows, errors, python, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl
from megatron_dpsched.megatron.checks import check_before_validate_args

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows(48))


def _argv(corpus: Path, *extra: str, train_iters: int = 2) -> list[str]:
    return [*tiny_gpt_argv(), "--data-path", str(corpus), "--split", "100,0,0", "--global-batch-size", "8",
            "--train-iters", str(train_iters), "--lr", "1e-3", "--eval-iters", "0", *extra]


@pytest.mark.parametrize(("extra", "message"), [
    (("--dp-schedule-balance", "tokens"), "--dp-schedule-balance given without --dp-schedule"),
    (("--dp-schedule-max-tokens-per-gpu", "48"), "--dp-schedule-max-tokens-per-gpu given without --dp-schedule"),
    (("--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", "--dp-schedule-balance-growth", "50"),
     "--dp-schedule-balance-growth must be between 0 and 10; got 50.0"),
    (("--dp-schedule", "--dp-schedule-balance-growth", "0.5"),
     "--dp-schedule-balance-growth has no effect without --dp-schedule-max-tokens-per-gpu"),
    (("--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "0"),
     "--dp-schedule-max-tokens-per-gpu must be between 1 and 2147483647; got 0"),
])
def test_bad_flags_fail_before_the_model_is_built(corpus: Path, extra: tuple, message: str) -> None:
    proc = python(_argv(corpus, *extra))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"pretrain_gpt_dpsched.py: error: {message}" or (
        last.startswith("pretrain_gpt_dpsched.py: error: ") and message in last), last
    assert MODEL_BUILT not in proc.stdout + proc.stderr


def test_too_little_data_fails_before_training_with_the_numbers(corpus: Path) -> None:
    proc = torchrun(_argv(corpus, "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", train_iters=10), nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("the train dataset holds 48 samples, but training reads --train-iters 10 x --global-batch-size 8 = 80"
            in log), errors(log)
    assert "iteration        1/" not in log


def test_a_vpp_group_flag_without_vpp_trains_as_plain_megatron_does(corpus: Path) -> None:
    extra = ("--pipeline-model-parallel-size", "2", "--microbatch-group-size-per-virtual-pipeline-stage", "1",
             "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48")
    proc = torchrun(_argv(corpus, *extra), nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert "iteration        2/       2" in log


def test_help_prints_megatron_and_dp_schedule_flags() -> None:
    proc = python(["--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--dp-schedule-max-tokens-per-gpu" in proc.stdout and "--tensor-model-parallel-size" in proc.stdout
    # megatron-core 0.19's help text with a bare '%' prints (escaped in the parser only)
    assert "--moe-paged-stash-buffer-size-factor-cuda" in proc.stdout and "%" in proc.stdout


@pytest.mark.parametrize(("extra", "flag", "job"), [
    (("--hybrid-context-parallel", "--max-seqlen-per-dp-cp-rank", "48", "--calculate-per-token-loss"),
     "--hybrid-context-parallel", "schedule the batch"),
    (("--max-seqlen-per-dp-cp-rank", "48"), "--max-seqlen-per-dp-cp-rank", "cap a micro-batch's tokens"),
    (("--rl-use-sequence-packing",), "--rl-use-sequence-packing", "pack the batch"),
])
def test_megatrons_own_packing_flags_are_refused_naming_both(corpus: Path, extra: tuple, flag: str, job: str) -> None:
    proc = python(_argv(corpus, "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", *extra))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pretrain_gpt_dpsched.py: error: --dp-schedule and {flag} both {job}: choose one "
                           "(--dp-schedule plans every step across the data-parallel ranks; "), last
    assert "Traceback" not in proc.stderr and MODEL_BUILT not in proc.stdout + proc.stderr



@pytest.mark.parametrize(("given", "flag"), [
    ({"sequence_packing_scheduler": "dp_balanced"}, "--sequence-packing-scheduler"),  # Megatron-LM dev's flags
    ({"dynamic_context_parallel": True}, "--dynamic-context-parallel"),
])
def test_packing_flags_of_later_releases_are_refused_naming_both(given: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"--dp-schedule and {flag} both schedule the batch: choose one")):
        check_before_validate_args(SimpleNamespace(dp_schedule=True, **given))
    check_before_validate_args(SimpleNamespace(dp_schedule=False, world_size=None, **given))  # Megatron's alone
