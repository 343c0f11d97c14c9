"""The label convention of a shipped sample, and whom a feed feeds, on real megatron-core.

A shipped sample's labels are shifted (``labels[i]`` is the token after ``tokens[i]``). Hugging Face style labels
(``labels == tokens`` where trained, ``-100`` elsewhere, a loss mask aligned with them) handed with
``label_convention="unshifted"`` train a Megatron GPT exactly as the same samples shifted by hand (the reference
shifts with list slicing, not the feed's code): the same loss and gradients, numpy samples too; handed as
shifted they train something else, and global rank 0 prints one warning per job (a subprocess per job). In a
one-rank Megatron world a plan made for two data-parallel ranks is refused when its feed is built, or, for a
feed built before Megatron's initialisation, when its first step begins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_cpu_attention import megatron_world  # noqa: F401 - the one-rank Megatron world fixture

from megatron_dpsched import ScheduleConfig, build_dp_schedule
from megatron_dpsched.megatron import ScheduledDataIterator, ScheduledDatasetLoader

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

REPO = Path(__file__).resolve().parents[2]
VOCAB = 64
LENGTHS = (9, 14, 5, 21, 12, 7, 16, 10)
PROMPT = 3
"""Positions of every sample whose label is -100 (a prompt)."""


def hugging_face_sample(sample_id: int) -> dict[str, list[int]]:
    """Tokens, labels equal to them after the prompt (-100 before), and on odd samples a loss mask leaving one
    response position out: Hugging Face's alignment (``labels[i]`` and ``loss_mask[i]`` belong to token ``i``)."""
    generator = torch.Generator().manual_seed(500 + sample_id)
    tokens = torch.randint(1, VOCAB, (LENGTHS[sample_id],), generator=generator).tolist()
    sample = {"tokens": tokens, "labels": [-100] * PROMPT + tokens[PROMPT:]}
    if sample_id % 2:
        sample["loss_mask"] = [1] * len(tokens)
        sample["loss_mask"][PROMPT + 1] = 0
    return sample


def shifted_by_hand(sample: dict[str, list[int]]) -> dict[str, list[int]]:
    """The reference: every label and mask value moved one position left, the last position not trained."""
    shifted = {"tokens": sample["tokens"], "labels": sample["labels"][1:] + [-100]}
    if "loss_mask" in sample:
        shifted["loss_mask"] = sample["loss_mask"][1:] + [0]
    return shifted


def tensors(sample: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {key: torch.tensor(value, dtype=torch.long) for key, value in sample.items()}


def arrays(sample: dict[str, list[int]]) -> dict[str, np.ndarray]:
    return {key: np.array(value, dtype=np.uint8 if key == "loss_mask" else np.int32) for key, value in sample.items()}


def plan(dp_size: int = 1) -> Any:
    return build_dp_schedule(list(LENGTHS), dp_size=dp_size, global_batch_size=4, max_tokens_per_gpu=32,
                             padded_rows=True)


@pytest.fixture(scope="module")
def gpt(request: pytest.FixtureRequest) -> Any:
    """A tiny Megatron GPT (local layer spec, no dropout), in the one-rank Megatron world."""
    request.getfixturevalue("megatron_world")
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
                               attention_dropout=0.0, hidden_dropout=0.0, masked_softmax_fusion=False,
                               bias_dropout_fusion=False, use_cpu_initialization=True)
    torch.manual_seed(1234)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=64, position_embedding_type="learned_absolute")


def loss_and_gradients(model: Any, feed: ScheduledDataIterator) -> tuple[float, dict[str, torch.Tensor]]:
    """The per-token loss of every step the feed plans (sum of masked token losses over loss tokens, as the
    scheduled loss counts it) and the gradients it leaves."""
    model.zero_grad(set_to_none=True)
    loss_sum, loss_tokens = torch.zeros(()), torch.zeros(())
    while True:
        try:
            planned = feed.begin_step()
        except StopIteration:
            break
        for _ in planned.micro_batches:
            batch = next(feed.chunks[0])
            losses = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
            loss_sum = loss_sum + (losses.float() * batch["loss_mask"]).sum()
            loss_tokens = loss_tokens + batch["loss_mask"].sum()
        feed.end_step()
    loss = loss_sum / loss_tokens
    loss.backward()
    return float(loss), {name: param.grad.clone() for name, param in model.named_parameters()}


def test_a_feed_built_before_megatron_is_initialised_is_checked_when_its_first_step_begins(
        request: pytest.FixtureRequest) -> None:
    """First in this module: the feed is built before the one-rank Megatron world exists."""
    from megatron.core import parallel_state

    assert not parallel_state.model_parallel_is_initialized()
    samples = [tensors(hugging_face_sample(i)) for i in range(len(LENGTHS))]
    early = ScheduledDataIterator(plan(dp_size=2), rank=1, samples=samples, vocab_size=VOCAB)  # nothing to compare
    request.getfixturevalue("megatron_world")
    with pytest.raises(ValueError, match=r"^dp-schedule: ScheduledDataIterator: the plan was made for dp_size=2, "
                                         r"but this job runs 1 data-parallel ranks"):
        early.begin_step()


def test_unshifted_labels_train_as_the_same_samples_shifted_by_hand(gpt) -> None:
    samples = [hugging_face_sample(i) for i in range(len(LENGTHS))]

    def run(data: list[dict[str, Any]], **options: Any) -> tuple[float, dict[str, torch.Tensor]]:
        return loss_and_gradients(gpt, ScheduledDataIterator(plan(), rank=0, samples=data, vocab_size=VOCAB,
                                                             **options))

    reference = run([tensors(shifted_by_hand(s)) for s in samples])
    for name, got in {"unshifted tensors": run([tensors(s) for s in samples], label_convention="unshifted"),
                      "unshifted numpy": run([arrays(s) for s in samples], label_convention="unshifted"),
                      "shifted numpy": run([arrays(shifted_by_hand(s)) for s in samples])}.items():
        assert got[0] == reference[0], name
        assert all(torch.equal(got[1][key], value) for key, value in reference[1].items()), name
    copied = run([tensors(s) for s in samples])  # handed as shifted: trains the model to copy its input
    assert copied[0] != reference[0]


@pytest.mark.usefixtures("megatron_world")
def test_a_plan_for_another_data_parallel_size_is_refused_when_the_feed_is_built() -> None:
    with pytest.raises(ValueError) as raised:
        ScheduledDataIterator(plan(dp_size=2), rank=0, samples=[tensors(hugging_face_sample(0))] * 8,
                              vocab_size=VOCAB)
    assert str(raised.value) == ("dp-schedule: ScheduledDataIterator: the plan was made for dp_size=2, but this job "
                                 "runs 1 data-parallel ranks (megatron.core.parallel_state); plan again with "
                                 "dp_size=1")
    config = ScheduleConfig(dp_size=2, global_batch_size=4, max_tokens_per_gpu=32, padded_rows=True)
    with pytest.raises(ValueError, match=r"^dp-schedule: ScheduledDatasetLoader: the plan was made for dp_size=2, "
                                         r"but this job runs 1 data-parallel ranks"):
        ScheduledDatasetLoader(lambda i: tensors(hugging_face_sample(i)), lengths=LENGTHS, rank=0, config=config,
                               vocab_size=VOCAB)
    ScheduledDataIterator(plan(), rank=0, samples=[tensors(hugging_face_sample(i)) for i in range(8)],
                          vocab_size=VOCAB)  # its own rank and size: accepted


JOB = textwrap.dedent("""
    import json, sys
    import torch
    from megatron_dpsched import build_dp_schedule
    from megatron_dpsched.megatron import ScheduledDataIterator

    samples = [{key: torch.tensor(value) for key, value in sample.items()} for sample in json.loads(sys.argv[1])]
    plan = build_dp_schedule([len(s["tokens"]) for s in samples], dp_size=1, global_batch_size=4,
                             max_tokens_per_gpu=32, padded_rows=True)
    for convention, copied in (("shifted", False), ("unshifted", True), ("shifted", True), ("shifted", True)):
        data = samples if copied else [{**s, "labels": torch.cat([s["tokens"][1:], torch.tensor([-100])]),
                                        "loss_mask": torch.ones_like(s["tokens"])} for s in samples]
        feed = ScheduledDataIterator(plan, rank=0, samples=data, vocab_size=64, label_convention=convention)
        while True:
            try:
                step = feed.begin_step()
            except StopIteration:
                break
            for _ in step.micro_batches:
                next(feed.chunks[0])
        print(f"fed {convention} {'copied' if copied else 'shifted'} labels", flush=True)
""")


def run_job(rank: str) -> list[str]:
    """:data:`JOB` as global rank ``rank`` (torchrun's ``RANK``): the lines it printed."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "RANK": rank}
    samples = json.dumps([hugging_face_sample(i) for i in range(len(LENGTHS))])
    proc = subprocess.run([sys.executable, "-c", JOB, samples], capture_output=True, text=True, env=environment,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith(("fed ", "dp-schedule"))]


def test_labels_that_copy_the_tokens_are_warned_once_per_job_on_rank_0() -> None:
    lines = run_job("0")
    assert lines[:2] == ["fed shifted shifted labels", "fed unshifted copied labels"], lines
    assert lines[3:] == ["fed shifted copied labels", "fed shifted copied labels"], lines
    warning = lines[2]
    assert warning.startswith("dp-schedule: WARNING: step 0, data-parallel rank 0: sample "), warning
    assert warning.endswith("'s labels equal its tokens at every loss position: a sample's labels are shifted "
                            "(labels[i] is the token after tokens[i]); Hugging Face style labels (labels == tokens) "
                            "train the model to copy its input: hand them with label_convention='unshifted' (the "
                            "feed shifts labels and loss_mask). Printed once per job."), warning
    assert [line for line in run_job("1") if line.startswith("dp-schedule")] == []  # other ranks stay quiet
