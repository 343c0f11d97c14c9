"""Ranks and checkpoints that disagree fail loudly: real ``torchrun`` jobs of the GPT entry point on gloo.

* Same lengths, other content: rank 0 reads a corpus, rank 1 the same rows in reverse order (every row
  21 tokens), through the same relative ``--data-path`` (resolved: two files): every rank stops before the
  model is built, naming the data's paths and content and the ranks, not its sizes (which agree). Past the
  start-up check (a feed in real ``train()``), the step's fingerprint covers the samples' token ids:
  ``dp2_ranks_content`` stops in step 0.
* ``--dp-schedule`` on rank 0 only: a clear error on every rank within seconds, not a hang.
* Resume with another ``--data-path``: refused naming what changed; with
  ``--dp-schedule-changed-resume allow`` it trains and the log says what changed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from entry import MODEL_BUILT, corpus_rows, errors, tiny_gpt_argv, torchrun, torchrun_per_rank

from megatron_dpsched import ScheduleConfig
from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed

ROW_TOKENS, ROWS = 21, 48
FAIL_WITHIN_S = 120


def _argv(data: str, *extra: str, train_iters: int = 2, dp_schedule: bool = True) -> list[str]:
    schedule = ["--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48"] if dp_schedule else []
    return [*tiny_gpt_argv(), "--data-path", data, "--split", "100,0,0", "--global-batch-size", "8",
            "--train-iters", str(train_iters), "--lr", "1e-3", "--eval-iters", "0", *schedule, *extra]


def _rows() -> list[list[int]]:
    """Rows of the same length (a pre-chunked corpus), each with its own ids."""
    return [[(5 * row + 3 * position) % 97 + 1 for position in range(ROW_TOKENS)] for row in range(ROWS)]


def _log(proc) -> str:
    return proc.stdout + proc.stderr


def _one_message(log: str, start: str) -> str:
    """The message (up to the end of its line) that ``start`` opens; every rank must have raised it."""
    lines = {line[line.index(start):] for line in log.splitlines() if start in line}
    assert lines, errors(log)
    assert len(lines) == 1, f"the ranks raised different messages: {lines}"
    return lines.pop()


def test_same_lengths_other_content_stop_every_rank_before_the_model(tmp_path: Path) -> None:
    folders = [tmp_path / "rank0", tmp_path / "rank1"]
    write_token_jsonl(folders[0] / "corpus.jsonl", _rows())
    write_token_jsonl(folders[1] / "corpus.jsonl", _rows()[::-1])
    assert (folders[0] / "corpus.jsonl").stat().st_size == (folders[1] / "corpus.jsonl").stat().st_size
    started = time.monotonic()
    proc = torchrun_per_rank([_argv("corpus.jsonl")] * 2, cwds=folders, spec=tmp_path / "ranks.json",
                             timeout=FAIL_WITHIN_S)
    log = _log(proc)
    assert proc.returncode != 0, "the job trained on two different corpora"
    assert time.monotonic() - started < FAIL_WITHIN_S
    message = _one_message(log, "the ranks of this job disagree on")
    assert message.startswith("the ranks of this job disagree on data paths, data content ("), message
    assert f"ranks 0 have \"data_path=['{folders[0].resolve() / 'corpus.jsonl'}']" in message, message
    assert re.search(r"data content: ranks 0 have '[0-9a-f]{16}'; ranks 1 have '[0-9a-f]{16}'", message), message
    assert "data sizes" not in message
    assert log.count(message) == 2, "every rank must raise it"
    assert MODEL_BUILT not in log and "iteration        1/" not in log


def test_a_step_whose_samples_differ_in_content_stops_every_rank(launches) -> None:
    results = launches.get("dp2_ranks_content")
    assert len(results) == 2
    messages = {result["error"] for result in results}
    assert len(messages) == 1, "every rank must raise the same message"
    (message,) = messages
    assert "the ranks hold different plans for train step 0" in message
    assert re.search(r"and other sample content: the same planned lengths hold other token ids "
                     r"\(ranks 0 content 0x[0-9a-f]{16}; ranks 1 content 0x[0-9a-f]{16}\)", message), message
    for result in results:
        assert result["records"] == [], "a micro-batch was read before the error"
        assert result["unchanged"], "weights changed before the error"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("corpora")
    return (write_token_jsonl(folder / "first.jsonl", corpus_rows(48)),
            write_token_jsonl(folder / "second.jsonl", corpus_rows(48)[::-1]))


def test_dp_schedule_on_one_rank_only_fails_within_seconds_naming_the_flag(corpora, tmp_path: Path) -> None:
    first, _ = corpora
    started = time.monotonic()
    proc = torchrun_per_rank([_argv(str(first)), _argv(str(first), dp_schedule=False)],
                             cwds=[tmp_path, tmp_path], spec=tmp_path / "ranks.json", timeout=FAIL_WITHIN_S)
    log = _log(proc)
    assert proc.returncode != 0
    assert time.monotonic() - started < FAIL_WITHIN_S
    message = _one_message(log, "the ranks of this job disagree on")
    assert message.startswith("the ranks of this job disagree on --dp-schedule, "), message
    assert "--dp-schedule: ranks 0 have 'on'; ranks 1 have 'off'" in message
    assert log.count(message) == 2, "every rank must raise it"
    assert MODEL_BUILT not in log


@pytest.fixture(scope="module")
def checkpoint(corpora, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of iteration 2 (of 4) trained on the first corpus."""
    first, _ = corpora
    folder = tmp_path_factory.mktemp("saved") / "checkpoint"
    saved = torchrun(_argv(str(first), "--save", str(folder), "--save-interval", "2", "--exit-interval", "2",
                           train_iters=4), nproc=2)
    assert saved.returncode == 0, errors(_log(saved))
    return folder


def test_a_resume_with_the_same_data_passes_and_checks_the_next_plan(corpora, checkpoint: Path) -> None:
    first, _ = corpora
    state = (checkpoint / "iter_0000002" / "dp_schedule_state.json").read_text()
    resumed = torchrun(_argv(str(first), "--load", str(checkpoint), train_iters=4), nproc=2)
    log = _log(resumed)
    assert resumed.returncode == 0, errors(log)
    line = re.search(r"train feed resumes at step 2 \(consumed_samples=16\); .* plan fingerprint (0x[0-9a-f]+)", log)
    assert line, errors(log)
    assert f'"fingerprint": {int(line.group(1), 16)}' in state, "the checkpoint must hold the next step's plan"
    assert "WARNING: resuming" not in log


def test_a_resume_with_other_data_fails_naming_it_unless_allowed(corpora, checkpoint: Path) -> None:
    first, second = corpora
    refused = torchrun(_argv(str(second), "--load", str(checkpoint), train_iters=4), nproc=2)
    log = _log(refused)
    assert refused.returncode != 0
    message = _one_message(log, "resuming iteration 2 of")
    assert f"data paths: \"data_path=['{first}'], split='100,0,0'\" -> \"data_path=['{second}']" in message, message
    assert "data content:" in message and "--dp-schedule-changed-resume allow" in message
    assert "iteration        3/" not in log

    allowed = torchrun(_argv(str(second), "--load", str(checkpoint), "--dp-schedule-changed-resume", "allow",
                             train_iters=4), nproc=2)
    log = _log(allowed)
    assert allowed.returncode == 0, errors(log)
    warning = _one_message(log, "dp-schedule: WARNING: resuming iteration 2 of")
    assert "with changes (--dp-schedule-changed-resume allow): data paths:" in warning
    assert str(second) in warning
    assert "iteration        4/       4" in log


PLAN_CONFIG = ScheduleConfig(dp_size=2, global_batch_size=8, max_tokens_per_gpu=48, padded_rows=True)
"""The feeds' planner options (bshd collate: the cap counts rows x longest)."""


def test_step_fingerprints_cover_content_through_the_stored_lines(tmp_path: Path) -> None:
    """A JSONL corpus and its reversed copy (every row 21 tokens): the same plans, other fingerprints; the
    stored-line digest and the parsed-tensor digest both see the order."""
    from megatron_dpsched.data import open_corpus
    from megatron_dpsched.data.compose import SubsetDataset
    from megatron_dpsched.megatron.feeds import ScheduledDatasetLoader

    def feed(rows: list[list[int]], *, wrap: bool) -> ScheduledDatasetLoader:
        corpus = open_corpus(write_token_jsonl(tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl", rows))
        data = SubsetDataset(corpus, range(len(corpus)), name="all") if wrap else corpus
        return ScheduledDatasetLoader(data, lengths=data.lengths, rank=0,
                                      config=PLAN_CONFIG,
                                      vocab_size=None)

    forward, backward = feed(_rows(), wrap=False), feed(_rows()[::-1], wrap=True)
    plans = [f.plan_step_at(8) for f in (forward, backward)]
    assert plans[0][0].micro_batches == plans[1][0].micro_batches
    assert plans[0][1].step_fingerprint(0, first_sample=8) == plans[1][1].step_fingerprint(0, first_sample=8)
    assert plans[0][0].fingerprint != plans[1][0].fingerprint and plans[0][0].content != plans[1][0].content
    again = feed(_rows(), wrap=True)
    assert again.plan_step_at(8)[0].fingerprint == plans[0][0].fingerprint, "wrapping changes no digest"
    parsed = ScheduledDatasetLoader(lambda i: again.load_sample(i), lengths=again.lengths, rank=0,
                                    config=PLAN_CONFIG,
                                    vocab_size=None)
    swapped = ScheduledDatasetLoader(lambda i: again.load_sample(ROWS - 1 - i), lengths=again.lengths, rank=0,
                                     config=PLAN_CONFIG,
                                    vocab_size=None)
    assert parsed.plan_step_at(8)[0].fingerprint != swapped.plan_step_at(8)[0].fingerprint
