"""The sample contract (no torch): every bad sample of issues 16 and 17 is refused naming where, and the JSONL
reader refuses booleans, two token keys, ids outside the vocabulary and deep nesting with the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_dpsched.data.contract import (
    COPY_MIN_POSITIONS,
    IGNORE_INDEX,
    MicroBatchSize,
    Place,
    SampleContractError,
    json_depth,
    labels_copy_tokens,
    require_samples,
    require_within_cap,
    validate_sample,
)
from megatron_dpsched.data.rows import MAX_JSON_DEPTH, parse_row

VOCAB = 64
PLACE = Place(sample_id=7, step=3, rank=1)
LENGTH = 5


def good() -> dict[str, np.ndarray]:
    return {"tokens": np.array([1, 2, 3, 4, 63]), "labels": np.array([2, 3, IGNORE_INDEX, 63, 0]),
            "loss_mask": np.array([0, 1, 1, 1, 0], dtype=np.int8)}


def _check(sample: object) -> None:
    validate_sample(sample, length=LENGTH, vocab_size=VOCAB, place=PLACE)


def test_a_good_sample_passes_in_every_mask_dtype() -> None:
    _check(good())
    for mask in (np.ones(LENGTH, dtype=bool), np.zeros(LENGTH, dtype=np.float32), np.array([0., 1., 1., 0., 1.])):
        _check({**good(), "loss_mask": mask})
    _check({"tokens": good()["tokens"], "labels": good()["labels"], "extra": "ignored"})
    validate_sample({**good(), "tokens": np.array([1, 2, 3, 4, 10**9])}, length=LENGTH, vocab_size=None, place=PLACE)


BAD = {  # what issue 16 and 17 list -> (the sample, the field named, what the message says)
    "loss_mask 5": ({**good(), "loss_mask": np.array([0, 1, 5, 1, 0])}, "loss_mask", "other than 0 and 1 (5)"),
    "loss_mask -1": ({**good(), "loss_mask": np.array([0, -1, 1, 1, 0])}, "loss_mask", "other than 0 and 1 (-1)"),
    "float loss_mask 0.5": ({**good(), "loss_mask": np.array([0, .5, 1, 1, 0])}, "loss_mask", "(0.5)"),
    "labels -5": ({**good(), "labels": np.array([2, -5, 3, 4, 5])}, "labels", "holds -5"),
    "labels 10**6": ({**good(), "labels": np.array([2, 10**6, 3, 4, 5])}, "labels", "holds 1000000, outside"),
    "labels == vocab": ({**good(), "labels": np.array([2, VOCAB, 3, 4, 5])}, "labels", f"[0, {VOCAB})"),
    "tokens >= vocab": ({**good(), "tokens": np.array([1, 2, VOCAB, 4, 5])}, "tokens", f"holds {VOCAB}, outside"),
    "negative token": ({**good(), "tokens": np.array([1, 2, -3, 4, 5])}, "tokens", "negative token id (-3)"),
    "float tokens": ({**good(), "tokens": np.array([1., 2.5, 3., 4., 5.])}, "tokens", "dtype float64"),
    "bool tokens": ({**good(), "tokens": np.ones(LENGTH, dtype=bool)}, "tokens", "dtype bool"),
    "bool labels": ({**good(), "labels": np.ones(LENGTH, dtype=bool)}, "labels", "dtype bool"),
    "list tokens": ({**good(), "tokens": [1, 2, 3, 4, 5]}, "tokens", "got list"),
    "missing labels": ({"tokens": good()["tokens"]}, "labels", "is missing"),
    "[1, n] tokens": ({**good(), "tokens": good()["tokens"][None]}, "tokens", "shape (1, 5)"),
    "[1, n] labels": ({**good(), "labels": good()["labels"][None]}, "labels", "shape (1, 5)"),
    "short labels": ({**good(), "labels": np.array([2, 3])}, "labels", "2 entries for 5 tokens"),
    "long mask": ({**good(), "loss_mask": np.ones(6)}, "loss_mask", "6 entries for 5 tokens"),
    "not a mapping": ([1, 2, 3, 4, 5], "sample", "must be a mapping"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_sample_is_refused_naming_sample_step_rank_and_field(case: str) -> None:
    sample, field, says = BAD[case]
    with pytest.raises(SampleContractError) as raised:
        _check(sample)
    message = str(raised.value)
    assert isinstance(raised.value, ValueError) and raised.value.field == field
    assert message.startswith("dp-schedule step 3, data-parallel rank 1: sample 7: "), message
    assert f"'{field}'" in message and says in message, message


def test_a_sample_of_another_length_than_planned_names_both_lengths() -> None:
    with pytest.raises(SampleContractError, match=r"step 3, data-parallel rank 1: sample 7 has 5 tokens, but the "
                                                  r"plan was made with length 6 \(the shipped plan's lengths\)"):
        validate_sample(good(), length=6, vocab_size=VOCAB, place=PLACE, length_source="the shipped plan's lengths")


def test_the_collated_size_counts_padding_as_collate_built_it() -> None:
    """Issue 16's case: four samples (40, 2, 2, 2 tokens) collated bshd are [4, 40] = 160 elements, cap 48."""
    bshd = MicroBatchSize(shape=(4, 40), real_tokens=46, sample_ids=(0, 1, 2, 3))
    place = Place(step=0, rank=1)
    with pytest.raises(SampleContractError, match=r"step 0, data-parallel rank 1: the micro-batch of samples "
                                                  r"\[0, 1, 2, 3\] collates to \[4, 40\] = 160 tokens, over the "
                                                  r"token cap 48"):
        require_within_cap(bshd, cap=48, counts_padding=True, place=place)
    require_within_cap(bshd, cap=48, counts_padding=False, place=place)  # --dp-schedule-cap-counts tokens
    require_within_cap(bshd, cap=160, counts_padding=True, place=place)
    require_within_cap(bshd, cap=None, counts_padding=True, place=place)  # static batching: no cap
    with pytest.raises(SampleContractError, match="holds 46 tokens"):
        require_within_cap(bshd, cap=45, counts_padding=False, place=place)
    alone = MicroBatchSize(shape=(1, 100), real_tokens=100, sample_ids=(5,))
    require_within_cap(alone, cap=48, counts_padding=True, place=place)  # a sample longer than the cap, alone


def test_a_short_sample_list_is_refused_with_both_counts() -> None:
    with pytest.raises(ValueError, match="samples holds 3 samples, but the plan reads sample ids up to 4"):
        require_samples([{}] * 3, needed=5, name="samples")
    require_samples([{}] * 5, needed=5, name="samples")
    require_samples(lambda i: {}, needed=5, name="samples")  # a callable is checked sample by sample


# --- the JSONL reader -------------------------------------------------------------------------------


def _parse(row: object, **kwargs: object) -> None:
    line = row if isinstance(row, str) else json.dumps(row)
    parse_row(line.encode(), path=Path("data.jsonl"), line_number=12, **kwargs)


@pytest.mark.parametrize(("row", "message"), [
    ({"tokens": [1, True, 3]}, "'tokens' must be a list of integers (true/false are not ids)"),
    ({"input_ids": [1, 2, 3], "labels": [-100, False, 3]}, "'labels' must be a list of integers (true/false"),
    ({"tokens": [1, 2, 3], "input_ids": [1, 2, 3]}, "both 'tokens' and 'input_ids'"),
    ({"tokens": [1.0, 2, 3]}, "'tokens' must be a list of integers"),
    ({"input_ids": [1, 2, 3], "labels": [-100, -5, 3]}, "'labels' holds -5"),
])
def test_bad_rows_are_refused_naming_the_file_and_line(row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"^data\.jsonl:12: ") as raised:
        _parse(row)
    assert message in str(raised.value)


def test_ids_outside_the_vocabulary_are_refused_when_the_reader_knows_it() -> None:
    _parse({"tokens": [1, 2, 10**6]})  # no vocabulary given: only negative ids are refused here
    with pytest.raises(ValueError, match=r"data\.jsonl:12: 'tokens' holds 1000000, outside the padded vocabulary"):
        _parse({"tokens": [1, 2, 10**6]}, vocab_size=VOCAB)
    with pytest.raises(ValueError, match=r"data\.jsonl:12: 'labels' holds 64, outside"):
        _parse({"input_ids": [1, 2, 3], "labels": [-100, 64, 3]}, vocab_size=VOCAB)
    _parse({"input_ids": [1, 2, 63], "labels": [-100, 2, 63]}, vocab_size=VOCAB)


def test_a_row_true_in_text_but_not_in_ids_is_read() -> None:
    _parse('{"tokens": [1, 2, 3], "note": "true or false"}')


def test_deep_nesting_is_refused_before_json_recurses() -> None:
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(ValueError, match=rf"data\.jsonl:12: the row nests 200001 levels deep; at most "
                                         rf"{MAX_JSON_DEPTH}"):
        _parse('{"tokens": ' + deep + "}")
    brackets_in_strings = json.dumps({"tokens": [1, 2, 3], "note": "[" * 100 + '\\"{' * 50})
    _parse(brackets_in_strings)


def _depth(value: object) -> int:
    """Reference: nesting of a parsed JSON value (containers only)."""
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ ab', max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=4), inner,
                                                                max_size=4),
    max_leaves=20)


@given(JSON_VALUES)
def test_json_depth_matches_the_parsed_nesting(value: object) -> None:
    assert json_depth(json.dumps(value)) == _depth(value)


def test_labels_that_copy_the_tokens_at_every_loss_position_are_found() -> None:
    """Hugging Face style labels (the prompt -100, the response equal to the tokens) handed as shifted ones are
    found; shifted labels, a copy only where the loss mask is 0, or too few loss positions are not."""
    tokens = np.array([1, 30, 31, 40, 41, 2])
    hugging_face = {"tokens": tokens, "labels": np.array([IGNORE_INDEX] * 3 + [40, 41, 2])}
    assert labels_copy_tokens(hugging_face, place=PLACE)
    assert labels_copy_tokens({"tokens": tokens, "labels": tokens.copy()}, place=PLACE)
    shifted = {"tokens": tokens, "labels": np.array([30, 31, 40, 41, 2, IGNORE_INDEX])}
    assert not labels_copy_tokens(shifted, place=PLACE)
    one_differs = {"tokens": tokens, "labels": np.array([1, 30, 31, 40, 41, 3])}
    assert not labels_copy_tokens(one_differs, place=PLACE)
    masked_out = {**one_differs, "loss_mask": np.array([1, 1, 1, 1, 1, 0], dtype=np.int8)}
    assert labels_copy_tokens(masked_out, place=PLACE)  # the differing label is not trained
    assert COPY_MIN_POSITIONS == 2
    one_position = {"tokens": tokens, "labels": np.array([IGNORE_INDEX] * 5 + [2])}
    assert not labels_copy_tokens(one_position, place=PLACE)  # one token equal to its label proves nothing
