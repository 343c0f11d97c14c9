"""Sample formats on real megatron-core and torch, one process: masked JSONL rows, the indexed dataset's
sidecar mask, Megatron's SFT conversations through its own tokenizer, and how collate carries the masks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sft_data import (
    KNOWN,
    KNOWN_MASK,
    KNOWN_TOKENS,
    WORDS,
    build_tokenizer_folder,
    conversation,
    expected_mask,
    sft_args,
    write_conversations,
)

from megatron_dpsched.data import (
    ConversationJsonlDataset,
    IndexedTokenDataset,
    PaddedSampleDataset,
    TokenJsonlDataset,
    sft_format_from_args,
    write_token_indexed,
    write_token_jsonl,
)
from megatron_dpsched.megatron.collate import CollateConfig, collate_micro_batch

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def sft_format(tmp_path_factory: pytest.TempPathFactory):
    return sft_format_from_args(sft_args(build_tokenizer_folder(tmp_path_factory.mktemp("tokenizer"))))


def test_the_known_conversation_is_masked_token_by_token(tmp_path: Path, sft_format) -> None:
    path = tmp_path / "conv.jsonl"
    path.write_text(json.dumps({"messages": KNOWN}) + "\n")
    data = ConversationJsonlDataset(path, sft_format)
    sample = data[0]
    assert [WORDS[i] for i in sample["tokens"].tolist()] == KNOWN_TOKENS[:-1]
    assert [WORDS[i] for i in sample["labels"].tolist()] == KNOWN_TOKENS[1:]
    assert sample["loss_mask"].tolist() == KNOWN_MASK
    assert list(data.lengths) == [len(KNOWN_TOKENS) - 1]


def test_conversations_packed_in_a_line_are_one_sample_each(tmp_path: Path, sft_format) -> None:
    data = ConversationJsonlDataset(write_conversations(tmp_path / "conv.jsonl", 7, per_line=3), sft_format)
    assert len(data) == 7 and data.index.parts.tolist() == [0, 1, 2, 0, 1, 2, 0]
    for i in range(7):
        assert data[i]["loss_mask"].tolist() == expected_mask(conversation(i)), i
        assert data.lengths[i] == data[i]["tokens"].numel()
    again = ConversationJsonlDataset(tmp_path / "conv.jsonl", sft_format)
    assert not again.index.rebuilt and list(again.lengths) == list(data.lengths)


@pytest.mark.parametrize(("line", "message"), [
    ('{"messages": [{"role": "system", "content": "ok"}, {"role": "user", "content": "hi"}, '
     '{"role": "assistant", "content": ""}]}', "empty assistant turn"),
    ('{"conversations": []}', 'expected {"messages"'),
    ('{"messages": [{"role": "system", "content": "ok"', "truncated or corrupt line"),
])
def test_a_bad_conversation_fails_with_file_and_line(tmp_path: Path, sft_format, line: str, message: str) -> None:
    path = write_conversations(tmp_path / "conv.jsonl", 2)
    with open(path, "a") as out:
        out.write(line + "\n")
    with pytest.raises(ValueError, match=rf"{path}:3: ") as error:
        ConversationJsonlDataset(path, sft_format)
    assert message in str(error.value)


def test_sft_needs_megatrons_sft_tokenizer(tmp_path: Path) -> None:
    args = sft_args(tmp_path)
    args.tokenizer_type = "HuggingFaceTokenizer"
    with pytest.raises(ValueError, match="--tokenizer-type SFTTokenizer"):
        sft_format_from_args(args)


def test_jsonl_masks_reach_the_padded_and_packed_micro_batches(tmp_path: Path) -> None:
    rows = [{"tokens": [1, 2, 3, 4], "loss_mask": [1, 1, 0, 1]}, {"input_ids": [5, 6, 7], "labels": [-100, -100, 7]},
            [8, 9, 10]]
    data = TokenJsonlDataset(write_token_jsonl(tmp_path / "rows.jsonl", rows))
    samples = [data[i] for i in range(3)]
    bshd = collate_micro_batch(samples, [0, 1, 2], CollateConfig(format="bshd"))
    assert bshd["loss_mask"].tolist() == [[1, 0, 1], [0, 1, 0], [1, 1, 0]]  # padding 0
    thd = collate_micro_batch(samples, [0, 1, 2], CollateConfig(format="thd", pad_multiple=4))
    assert thd["loss_mask"].tolist() == [[1, 0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0]]
    assert collate_micro_batch([], [], CollateConfig(format="thd"))["loss_mask"].sum() == 0  # the dummy
    padded = PaddedSampleDataset(data, seq_length=5)[1]
    assert padded["loss_mask"].tolist() == [0, 1, 0, 0, 0]


def test_collate_masks_ignore_index_labels_and_checks_mask_lengths() -> None:
    sample = {"tokens": torch.tensor([1, 2, 3]), "labels": torch.tensor([2, -100, 4])}
    batch = collate_micro_batch([sample], [0], CollateConfig(format="bshd", pad_token_id=0))
    assert batch["loss_mask"].tolist() == [[1, 0, 1]] and batch["labels"].tolist() == [[2, 0, 4]]
    with pytest.raises(ValueError, match="3 tokens but 2 loss_mask entries"):
        collate_micro_batch([{**sample, "loss_mask": torch.ones(2)}], [0], CollateConfig())


def test_indexed_dataset_with_a_sidecar_mask(tmp_path: Path) -> None:
    rows, masks = [[1, 2, 3, 4], [5, 6, 7]], [[1, 0, 1, 1], [0, 0, 1]]
    data = IndexedTokenDataset(write_token_indexed(tmp_path / "data", rows, masks=masks))
    assert data[0]["loss_mask"].tolist() == [0, 1, 1] and data[1]["loss_mask"].tolist() == [0, 1]
    assert "loss_mask" not in IndexedTokenDataset(tmp_path / "data", mask=False)[0]
    assert "loss_mask" not in IndexedTokenDataset(write_token_indexed(tmp_path / "plain", rows))[0]


def test_a_sidecar_mask_that_does_not_match_the_index_is_refused(tmp_path: Path) -> None:
    write_token_indexed(tmp_path / "data", [[1, 2, 3, 4], [5, 6, 7]])
    write_token_indexed(tmp_path / "data_mask", [[1, 0, 1, 1], [0, 1]])
    with pytest.raises(ValueError, match="sequence 1 of the sidecar mask .*data_mask has 2 values for 3 tokens"):
        IndexedTokenDataset(tmp_path / "data")
    write_token_indexed(tmp_path / "data_mask", [[1, 0, 1, 1]])
    with pytest.raises(ValueError, match="holds 1 sequences, the token index 2"):
        IndexedTokenDataset(tmp_path / "data")
    write_token_indexed(tmp_path / "data_mask", [[1, 0, 1, 1], [0, 2, 1]])
    with pytest.raises(ValueError, match=r"^.*data_mask\.bin sequence 1: the sidecar mask holds 2; a loss mask "
                                         r"holds only 0 and 1$"):  # when opened, not when the sample is read
        IndexedTokenDataset(tmp_path / "data")


def test_a_line_corrupted_after_indexing_fails_with_its_line_number(tmp_path: Path) -> None:
    path = write_token_jsonl(tmp_path / "rows.jsonl", [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    data = TokenJsonlDataset(path)
    text = path.read_text().replace("[4, 5, 6]", "[4, 5, X]")
    path.write_text(text)  # same size: an open dataset reads what is there now
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON object"):
        data[1]


def test_a_row_whose_length_changed_under_its_index_fails_naming_the_file(tmp_path) -> None:
    from megatron_dpsched.data.corpus import TokenJsonlDataset

    path = tmp_path / "d.jsonl"
    path.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [4, 5, 6]}\n')
    dataset = TokenJsonlDataset(path)
    path.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [4, 5, 6, 7]}\n')  # a running job keeps its index
    with pytest.raises(ValueError, match=r"d.jsonl:2: the row has 3 positions, its length index says 2"):
        dataset[1]


def test_conversations_with_no_assistant_turn_are_counted_and_named(tmp_path: Path, sft_format) -> None:
    """A conversation of system and user turns only has no loss token: counted from the index (cached with the
    lengths), named FILE:LINE, with the conversation's place in a line of several."""
    asked = [{"role": "system", "content": "ok"}, {"role": "user", "content": "what is three"}]
    lines = [conversation(0), asked, [*conversation(1), *asked], conversation(2)]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in lines))
    data = ConversationJsonlDataset(path, sft_format)
    convs = [conversation(0), asked, conversation(1), asked, conversation(2)]
    assert list(data.trained_tokens) == [sum(expected_mask(c)) for c in convs]
    assert [data[i]["loss_mask"].sum().item() for i in range(len(data))] == list(data.trained_tokens)
    notice = data.no_loss_notice()
    assert notice is not None and f"{path}: 2 of 5 samples have no loss token" in notice, notice
    assert f"{path}:2, {path}:3 (conversation 2). They train nothing" in notice, notice
    again = ConversationJsonlDataset(path, sft_format)
    assert not again.index.rebuilt and again.no_loss_notice() == notice


def test_jsonl_and_indexed_datasets_give_their_loss_tokens(tmp_path: Path) -> None:
    rows = [{"tokens": [1, 2, 3]}, {"input_ids": [4, 5, 6], "labels": [-100, -100, -100]},
            {"tokens": [7, 8, 9, 10], "loss_mask": [1, 1, 0, 1]}]
    data = TokenJsonlDataset(write_token_jsonl(tmp_path / "rows.jsonl", rows))
    assert list(data.trained_tokens) == [int(data[i].get("loss_mask", torch.ones(2)).sum()) for i in range(3)]
    assert list(data.trained_tokens) == [2, 0, 2] and f"{data.path}:2. They" in data.no_loss_notice()
    plain = IndexedTokenDataset(write_token_indexed(tmp_path / "plain", [[1, 2, 3], [4, 5]]))
    assert plain.trained_tokens == plain.lengths and plain.no_loss_notice() is None
    masked = IndexedTokenDataset(write_token_indexed(tmp_path / "masked", [[1, 2, 3]], masks=[[1, 0, 0]]))
    assert masked.trained_tokens is None  # not counted: that would read the whole mask
