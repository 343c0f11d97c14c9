"""One line per job under ``torchrun``: a failure every rank meets before training (a flag typo, ``16k`` for a
number, a ``--dp-schedule-*`` option without ``--dp-schedule`` or one that would not act, a flag of Megatron's
own, a check of ``setup_dp_schedule`` or of the feed) is printed once, by rank 0, and torchrun's summary names it
as the root cause with exit code 2. Real ``torchrun --nproc-per-node 2`` jobs of the entry point (gloo,
``--cpu-dry-run``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from entry import MODEL_BUILT, REPO, corpus_rows, errors, torchrun
from test_quiet_flags import _argv

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed

PROG = "pretrain_gpt_dpsched.py: error: "
RANK_TRACEBACK = re.compile(r"\[rank\d+\]:|File \".*(megatron_dpsched|pretrain_gpt_dpsched\.py)")
"""A traceback frame of a rank (torchrun's own ChildFailedError traceback names neither)."""
CAP = ("--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows(48))


def assert_once_per_job(proc: subprocess.CompletedProcess, line: str) -> str:
    """``line`` printed exactly once (torchrun's summary aside), named by the summary's root cause with exit code
    2, no rank's traceback and no argparse usage; returns the log."""
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, errors(log)
    printed = [text for text in log.splitlines() if line in text and not text.lstrip().startswith("traceback :")]
    assert printed == [line], (printed, errors(log))
    root = log[log.index("Root Cause (first observed failure):"):]
    assert re.search(r"exitcode\s*: 2 ", root) and f"traceback : {line}" in root, root
    assert not RANK_TRACEBACK.search(log) and "usage:" not in log, errors(log)
    return log


HEADS_ASSERT = "assert args.hidden_size % args.num_attention_heads == 0"
"""A check of Megatron's ``validate_args`` without a message of its own."""


def _line_of(source: str) -> int:
    """The line of ``source`` in the installed ``megatron/training/arguments.py`` (read here, apart from the code
    under test)."""
    import megatron.training.arguments as arguments

    lines = Path(arguments.__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.strip() == source)


@pytest.mark.parametrize(("extra", "message"), [
    ((*CAP, "--dp-schedule-balanse", "tokens"),
     "unknown option --dp-schedule-balanse; did you mean --dp-schedule-balance?"),
    (("--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "16k"),
     "argument --dp-schedule-max-tokens-per-gpu: invalid int value: '16k'"),
    (("--dp-schedule-balance", "tokens"),
     "--dp-schedule-balance given without --dp-schedule, which they configure; add --dp-schedule or drop them"),
    ((*CAP, "--dp-schedule-microbatch-overhead-ms", "3"),
     "--dp-schedule-microbatch-overhead-ms has no effect with the micro-batches objective "
     "(--pipeline-model-parallel-size 1): it times micro-batches for the step-time objective only; drop it"),
    ((*CAP, "--global-batch-size", "16k"), "argument --global-batch-size: invalid int value: '16k'"),
    ((*CAP, "--no-such-megatron-flag"), "unrecognized arguments: --no-such-megatron-flag"),
    ((*CAP, "--num-attention-heads", "3"), "Megatron's argument check refused the arguments "
     f"(megatron/training/arguments.py:{_line_of(HEADS_ASSERT)}): {HEADS_ASSERT}"),
], ids=["typo", "16k_ours", "without_switch", "would_not_act", "16k_megatron", "unknown_megatron",
        "megatron_assert"])
def test_a_flag_error_is_one_line_per_job_and_torchruns_summary_names_it(corpus: Path, extra: tuple,
                                                                          message: str) -> None:
    log = assert_once_per_job(torchrun(_argv(corpus, *extra), nproc=2), PROG + message)
    assert MODEL_BUILT not in log


def test_a_check_of_setup_dp_schedule_is_one_line_per_job(corpus: Path) -> None:
    message = ("--dp-schedule-max-tokens-per-gpu plans micro-batches by tokens; --micro-batch-size must stay 1 (it "
               "is the sample-accounting unit), got 2")
    log = assert_once_per_job(torchrun(_argv(corpus, *CAP, "--micro-batch-size", "2"), nproc=2), PROG + message)
    assert MODEL_BUILT not in log


def test_a_check_of_the_feed_is_one_line_per_job(corpus: Path) -> None:
    line = ("dp-schedule: rank 0: the train dataset holds 48 samples, but training reads --train-iters 7 x "
            "--global-batch-size 8 = 56; give more data or fewer iterations (or --dataloader-type cyclic to read "
            "it again)")
    log = assert_once_per_job(torchrun(_argv(corpus, *CAP, "--train-iters", "7"), nproc=2), line)
    assert "iteration        1/" not in log


RANK_SCRIPT = "from megatron_dpsched.options import exit_on_bad_flags; exit_on_bad_flags(['--dp-schedule-balanse'], " \
              "prog='train.py')"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_flag_error_is_printed_by_rank_0_and_recorded_by_every_rank(tmp_path: Path, rank: str) -> None:
    """A rank other than 0 that torchrun has not stopped (rank 0 printed the same line) exits quietly with the same
    code, its error file naming the line (another node's torchrun summary prints it)."""
    error_file = tmp_path / "error.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": rank, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    proc = subprocess.run([sys.executable, "-c", RANK_SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    line = "train.py: error: unknown option --dp-schedule-balanse; did you mean --dp-schedule-balance?"
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"{line}\n" if rank == "0" else ""), proc.stderr
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == line and recorded["extraInfo"]["py_callstack"] == line
