"""Every feed applies the sample contract (single process, torch): the shipped-plan feed refuses each input of
issue 16 naming the sample, step, rank and field; a plan made for another collate is refused when the feed is
built; the dataset feed names the sample of an id outside the vocabulary."""

from __future__ import annotations

import json
from typing import Any

import harness
import pytest
import torch

from megatron_dpsched import DPSchedule, ScheduleConfig, build_dp_schedule
from megatron_dpsched.data import TokenJsonlDataset, write_token_jsonl
from megatron_dpsched.data.contract import SampleContractError
from megatron_dpsched.megatron import CollateConfig, ScheduledDataIterator, ScheduledDatasetLoader

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

VOCAB = harness.VOCAB
LENGTHS = harness.LENGTHS[:16]
BAD_ID = 5  # the sample made bad in each case


def shipped_plan(**options: Any) -> DPSchedule:
    """A plan for two ranks, shipped as JSON (what an RL controller sends), for the default bshd collate."""
    plan = build_dp_schedule(LENGTHS, dp_size=2, global_batch_size=8, max_tokens_per_gpu=40,
                             **{"padded_rows": True, **options})
    return DPSchedule.from_dict(json.loads(json.dumps(plan.to_dict())))


def where_is(plan: DPSchedule, sample_id: int) -> tuple[int, int]:
    """(rank, step) holding ``sample_id`` in ``plan``."""
    for rank in range(plan.dp_size):
        for step in range(plan.num_steps):
            if any(sample_id in mb for mb in plan.rank_step_micro_batches(rank, step)):
                return rank, step
    raise AssertionError(f"sample {sample_id} is not planned")


def run_all(feed: ScheduledDataIterator) -> int:
    """Read every micro-batch of every step as the model chunks would; the micro-batches read."""
    read = 0
    while True:
        try:
            planned = feed.begin_step()
        except StopIteration:
            return read
        for _ in planned.micro_batches:
            next(feed.chunks[0])
            read += 1
        feed.end_step()


def samples_with(change: Any) -> list[dict[str, Any]]:
    """Every planned sample as harness tensors; sample ``BAD_ID`` passed through ``change``."""
    samples: list[dict[str, Any]] = [dict(harness.make_sample(i)) for i in range(len(LENGTHS))]
    samples[BAD_ID] = change(samples[BAD_ID])
    return samples


def _set(sample: dict[str, Any], key: str, position: int, value: Any) -> dict[str, Any]:
    tensor = sample.get(key, torch.ones_like(sample["tokens"])).clone()
    tensor[position] = value
    return {**sample, key: tensor}


ISSUE_16 = {  # the issue's inputs -> (the change to one sample, the field named, what the message says)
    "loss_mask 5": (lambda s: _set(s, "loss_mask", 0, 5), "loss_mask", "other than 0 and 1 (5)"),
    "loss_mask -1": (lambda s: _set(s, "loss_mask", 1, -1), "loss_mask", "other than 0 and 1 (-1)"),
    "labels -5": (lambda s: _set(s, "labels", 0, -5), "labels", "holds -5"),
    "labels 10**6": (lambda s: _set(s, "labels", 0, 10**6), "labels", "holds 1000000, outside the padded vocabulary"),
    "token >= vocab": (lambda s: _set(s, "tokens", 0, VOCAB), "tokens", f"holds {VOCAB}, outside"),
    "float tokens": (lambda s: {**s, "tokens": s["tokens"].float() + 0.5}, "tokens", "dtype float32"),
    "bfloat16 tokens": (lambda s: {**s, "tokens": s["tokens"].bfloat16()}, "tokens", "dtype float32"),
    "bool tokens": (lambda s: {**s, "tokens": s["tokens"] > 0}, "tokens", "dtype bool"),
    "list tokens": (lambda s: {**s, "tokens": s["tokens"].tolist()}, "tokens", "got list"),
    "list labels": (lambda s: {**s, "labels": s["labels"].tolist()}, "labels", "got list"),
    "missing labels": (lambda s: {"tokens": s["tokens"]}, "labels", "is missing"),
    "[1, n] tokens": (lambda s: {**s, "tokens": s["tokens"][None]}, "tokens", "shape (1, "),
    "[1, n] loss_mask": (lambda s: {**s, "loss_mask": torch.ones(1, s["tokens"].numel())}, "loss_mask", "shape (1, "),
    "short labels": (lambda s: {**s, "labels": s["labels"][:-1]}, "labels", "entries for"),
}


@pytest.mark.parametrize("case", sorted(ISSUE_16))
@pytest.mark.parametrize("prefetch", [False, True])
def test_the_shipped_plan_feed_refuses_each_bad_sample_naming_it(case: str, prefetch: bool) -> None:
    change, field, says = ISSUE_16[case]
    plan = shipped_plan()
    rank, step = where_is(plan, BAD_ID)
    feed = ScheduledDataIterator(plan, rank=rank, samples=samples_with(change), vocab_size=VOCAB, prefetch=prefetch)
    try:
        with pytest.raises(SampleContractError) as raised:
            run_all(feed)
    finally:
        feed.close()
    message = str(raised.value)
    assert message.startswith(f"dp-schedule step {step}, data-parallel rank {rank}: sample {BAD_ID}: "), message
    assert raised.value.field == field and f"'{field}'" in message and says in message, message


def test_good_samples_train_through_and_other_ranks_are_not_stopped() -> None:
    plan = shipped_plan()
    rank, _ = where_is(plan, BAD_ID)
    bad = samples_with(ISSUE_16["labels -5"][0])
    other = 1 - rank
    assert run_all(ScheduledDataIterator(plan, rank=other, samples=bad, vocab_size=VOCAB)) == \
        sum(len(plan.rank_step_micro_batches(other, s)) for s in range(plan.num_steps))
    good = samples_with(lambda s: s)
    assert run_all(ScheduledDataIterator(plan, rank=rank, samples=good, vocab_size=VOCAB)) > 0


def test_a_short_sample_list_is_refused_when_the_feed_is_built() -> None:
    with pytest.raises(ValueError, match="samples holds 15 samples, but the plan reads sample ids up to 15"):
        ScheduledDataIterator(shipped_plan(), rank=0, samples=samples_with(lambda s: s)[:15], vocab_size=VOCAB)


def test_a_default_plan_collated_bshd_is_refused_with_the_fix() -> None:
    """Issue 16: lengths 40, 2, 2, 2 under a cap of 48 plan as one micro-batch of 46 real tokens; bshd collates
    it as [4, 40] = 160 elements. The feed refuses the plan when it is built, naming both fixes."""
    lengths = [40, 2, 2, 2]
    plan = build_dp_schedule(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=48)
    assert plan.rank_step_micro_batches(0, 0) == ((0, 1, 2, 3),)

    def data(i: int) -> dict[str, torch.Tensor]:
        return {"tokens": torch.ones(lengths[i], dtype=torch.long), "labels": torch.ones(lengths[i], dtype=torch.long)}

    with pytest.raises(ValueError) as raised:
        ScheduledDataIterator(plan, rank=0, samples=data, vocab_size=VOCAB)  # CollateConfig's default: bshd
    message = str(raised.value)
    assert message.startswith("the shipped plan: the plan counts pad_multiple=1, padded_rows=False"), message
    assert "padded_rows=True" in message and "CollateConfig(format='thd', pad_multiple=1)" in message, message
    thd = ScheduledDataIterator(plan, rank=0, samples=data, vocab_size=VOCAB, collate=CollateConfig(format="thd"))
    thd.begin_step()
    assert next(thd.chunks[0])["tokens"].shape == (1, 46)
    tokens = ScheduledDataIterator(plan, rank=0, samples=data, vocab_size=VOCAB, cap_counts="tokens")
    tokens.begin_step()  # asked for: the cap bounds real tokens only, the tensor may exceed it
    assert next(tokens.chunks[0])["tokens"].shape == (4, 40)
    padded = build_dp_schedule(lengths, dp_size=1, global_batch_size=4, max_tokens_per_gpu=48, padded_rows=True)
    feed = ScheduledDataIterator(padded, rank=0, samples=data, vocab_size=VOCAB)
    assert run_all(feed) == padded.num_microbatches[0]


def test_the_pad_multiple_must_match_collates() -> None:
    plan = shipped_plan(padded_rows=False, pad_multiple=1)
    with pytest.raises(ValueError, match="collate pads every sequence to a multiple of 4 in thd"):
        ScheduledDataIterator(plan, rank=0, samples=harness.make_sample, vocab_size=VOCAB,
                              collate=CollateConfig(format="thd", pad_multiple=4))
    static = build_dp_schedule(LENGTHS, dp_size=2, global_batch_size=8, micro_batch_size=2)
    ScheduledDataIterator(static, rank=0, samples=harness.make_sample, vocab_size=VOCAB)  # no cap: nothing to bound


def test_the_vocabulary_bound_comes_from_megatron_or_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from megatron.training import global_vars

    plan = shipped_plan()
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", None)
    with pytest.raises(ValueError, match="give vocab_size=<the model's padded vocabulary size>, or vocab_size=None"):
        ScheduledDataIterator(plan, rank=0, samples=harness.make_sample)
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", SimpleNamespace(padded_vocab_size=VOCAB - 1))
    feed = ScheduledDataIterator(plan, rank=0, samples=samples_with(lambda s: _set(s, "tokens", 0, VOCAB - 1)))
    assert feed.vocab_size == VOCAB - 1
    with pytest.raises(SampleContractError, match=f"'tokens' holds {VOCAB - 1}, outside the padded vocabulary"):
        run_all(ScheduledDataIterator(plan, rank=where_is(plan, BAD_ID)[0],
                                      samples=samples_with(lambda s: _set(s, "tokens", 0, VOCAB - 1))))
    unbounded = ScheduledDataIterator(plan, rank=where_is(plan, BAD_ID)[0], vocab_size=None,
                                      samples=samples_with(lambda s: _set(s, "tokens", 0, 10**6)))
    assert run_all(unbounded) > 0  # asked for: no upper bound


def test_the_dataset_feed_names_the_sample_of_an_id_outside_the_vocabulary(tmp_path) -> None:
    rows = [[1, 2, 3, 4]] * 7 + [[1, 2, VOCAB + 3, 4]]
    data = TokenJsonlDataset(write_token_jsonl(tmp_path / "rows.jsonl", rows))
    loader = ScheduledDatasetLoader(data, lengths=data.lengths, rank=0, vocab_size=VOCAB,
                                    config=ScheduleConfig(dp_size=1, global_batch_size=8, max_tokens_per_gpu=12,
                                                         padded_rows=True))
    with pytest.raises(SampleContractError, match=rf"dp-schedule step 0, data-parallel rank 0: sample 7: 'tokens' "
                                                  rf"holds {VOCAB + 3}, outside the padded vocabulary \[0, {VOCAB}\)"):
        run_all(loader)
    with pytest.raises(ValueError, match=rf"rows.jsonl:8: 'tokens' holds {VOCAB + 3}, outside"):
        TokenJsonlDataset(tmp_path / "rows.jsonl", vocab_size=VOCAB)  # opened with the vocabulary: refused whole
    with pytest.raises(ValueError, match="TokenJsonlDataset holds 8 samples, but the plan "
                                         "reads sample ids up to 8"):
        ScheduledDatasetLoader(data, lengths=[*data.lengths, 3], rank=0, vocab_size=VOCAB,
                               config=ScheduleConfig(dp_size=1, global_batch_size=9, max_tokens_per_gpu=12,
                                                    padded_rows=True))


def test_jsonl_rows_with_booleans_or_two_token_keys_fail_at_start_up(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [1, true, 3]}\n')
    with pytest.raises(ValueError, match=rf"{path}:2: 'tokens' must be a list of integers \(true/false"):
        TokenJsonlDataset(path)
    path.write_text('{"tokens": [1, 2, 3], "input_ids": [4, 5, 6]}\n')
    with pytest.raises(ValueError, match=rf"{path}:1: the row has both 'tokens' and 'input_ids'"):
        TokenJsonlDataset(path)
