"""Loss masks through Megatron's real ``train()``: masked JSONL samples (bshd and thd, DP=2 on gloo) train
exactly like a one-process whole-batch reference that masks the same tokens (its micro-batch is built by
hand from the mask lists, not by the project's reader or collate), on every rank; and Megatron's SFT
conversations go through the entry point, tokenized and masked by Megatron's tokenizer, with exactly the
assistant tokens trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from entry import MODEL_BUILT, errors, python, tiny_gpt_argv, torchrun
from harness import LENGTHS, TRAIN_ITERS
from registry import names
from scenarios_masks import token_mask
from sft_data import PROMPT_FORMAT, build_tokenizer_folder, conversation, expected_mask, write_conversations
from train_checks import RTOL, assert_trained_like_reference, step_samples

pytestmark = pytest.mark.distributed

REFERENCE = {"masked_bshd_dp2": "masked_reference", "masked_thd_dp2": "masked_reference_rope"}


@pytest.mark.parametrize("layout", names("masked"))
def test_masked_samples_train_like_the_reference_that_masks_the_same_tokens(launches, layout: str) -> None:
    (reference,) = launches.get(REFERENCE[layout])
    assert_trained_like_reference(launches.get(layout), reference, rtol=RTOL)


def test_the_masks_change_what_is_trained(launches) -> None:
    """The masked reference differs from the unmasked one (the masks are not a no-op)."""
    (with_masks,) = launches.get("masked_reference")
    (without,) = launches.get("reference")
    diff = (with_masks["weights"]["output_layer.weight"] - without["weights"]["output_layer.weight"]).norm()
    assert diff > 1e-3 * without["weights"]["output_layer.weight"].norm()
    assert sum(sum(token_mask(i)[1:]) for i in step_samples(0)) < sum(LENGTHS[i] for i in step_samples(0))


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return build_tokenizer_folder(tmp_path_factory.mktemp("tokenizer"))


def _sft_argv(data: Path, tokenizer: Path, *extra: str) -> list[str]:
    return [*tiny_gpt_argv(), "--sft", "--data-path", str(data), "--split", "100,0,0",
            "--tokenizer-type", "SFTTokenizer",
            "--tokenizer-model", str(tokenizer), "--sft-tokenizer-prompt-format", PROMPT_FORMAT,
            "--global-batch-size", "8", "--train-iters", str(TRAIN_ITERS), "--lr", "1e-3", "--eval-iters", "0",
            *extra]


@pytest.mark.parametrize("collate", [[], ["--dp-schedule-collate-format", "thd", "--spec",
                                          "megatron_dpsched.testing.cpu_attention", "gpt_layer_spec"]],
                         ids=["bshd", "thd"])
def test_sft_conversations_train_through_the_entry_point_with_the_prompts_masked(
        tmp_path: Path, tokenizer_folder: Path, collate: list[str]) -> None:
    data = write_conversations(tmp_path / "conv.jsonl", 8 * TRAIN_ITERS, per_line=2)
    argv = _sft_argv(data, tokenizer_folder, "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48",
                     "--dp-schedule-verify", "strict", "--step-stats-dir", str(tmp_path / "stats"), *collate)
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert MODEL_BUILT in log
    records = [json.loads(line) for f in sorted((tmp_path / "stats").glob("rank*.jsonl"))
               for line in f.read_text().splitlines()]
    for step in range(TRAIN_ITERS):
        trained = [r for r in records if r["step"] == step]
        ids = sorted(i for r in trained for mb in r["micro_batch_ids"] for i in mb)
        assert ids == step_samples(step)
        expected = sum(sum(expected_mask(conversation(i))) for i in ids)
        assert sum(r["tokens"] for r in trained) == expected, step  # loss tokens: the assistant answers only


def test_megatrons_packing_sft_path_is_refused_with_dp_schedule(tmp_path: Path) -> None:
    from harness import base_argv, parse_megatron_args

    with pytest.raises(ValueError, match="--sft cannot be combined with --dp-schedule: Megatron's SFTDataset packs"):
        parse_megatron_args([*base_argv(), "--sft"])


def test_sft_with_another_tokenizer_fails_naming_the_flag(tmp_path: Path) -> None:
    data = write_conversations(tmp_path / "conv.jsonl", 8)
    argv = [*tiny_gpt_argv(), "--sft", "--data-path", str(data), "--split", "100,0,0",
            "--global-batch-size", "8", "--train-iters", "1",
            "--lr", "1e-3", "--dp-schedule"]
    proc = python(argv)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--sft needs --tokenizer-type SFTTokenizer" in proc.stderr.strip().splitlines()[-1]
