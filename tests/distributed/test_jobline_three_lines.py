"""A user's own three-line integration script (``three_line_script.py``: the README's lines around Megatron's
``pretrain()``) tried on CPU with ``python -m megatron_dpsched.testing.cpu_dry_run`` under a real
``torchrun --nproc-per-node 2``: it trains with ``--dp-schedule``; a dataset without ``lengths`` is one line per
job naming it, before the model is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from entry import _PORTS, MODEL_BUILT, REPO, corpus_rows, errors, tiny_gpt_argv
from test_jobline_flags import assert_once_per_job

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("three_line_script.py")
DRY_RUN = "megatron_dpsched.testing.cpu_dry_run"


def _three_lines(corpus: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    launcher = Path(sys.executable).with_name("torchrun")
    flags = [*tiny_gpt_argv()[1:], "--global-batch-size", "8", "--train-iters", "2", "--lr", "1e-3", "--eval-iters",
             "0", "--eval-interval", "1000", "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", *extra]
    cmd = [str(launcher), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(next(_PORTS)),
           "-m", DRY_RUN, str(SCRIPT), *flags]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "DATASET": str(corpus), **env,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=environment, timeout=400)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows(48))


def test_a_three_line_script_trains_on_cpu_through_pretrain(corpus: Path) -> None:
    proc = _three_lines(corpus)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert "iteration        2/       2 |" in log and "dp-schedule step 1: micro-batches per rank" in log, errors(log)
    assert "dp-schedule: every rank agrees on the job" in log and MODEL_BUILT in log


def test_a_dataset_without_lengths_is_one_line_naming_it_before_the_model(corpus: Path) -> None:
    proc = _three_lines(corpus, NO_LENGTHS="1")
    log = assert_once_per_job(proc, "dp-schedule: rank 0: --dp-schedule needs the token count of every sample: give "
                                    "the train dataset (SamplesWithoutLengths) a 'lengths' sequence with one entry "
                                    "per sample (got NoneType)")
    assert MODEL_BUILT not in log


def test_a_bad_late_row_of_a_corpus_opened_without_the_vocabulary_is_one_line_before_the_model(tmp_path: Path) -> None:
    """``open_corpus(path)`` as the README's script calls it (no ``vocab_size=``): the provider bounds the corpus by
    Megatron's padded vocabulary before the model is built, naming the row's line, not a sample at its step."""
    rows = corpus_rows(48)
    rows[45] = [*rows[45][:-1], 500]
    bad = write_token_jsonl(tmp_path / "late.jsonl", rows)
    line = (f"dp-schedule: rank 0: {bad}:46: 'tokens' holds 500, outside the padded vocabulary [0, 128) (an embedding "
            "row that does not exist)")
    log = assert_once_per_job(_three_lines(bad), line)
    assert MODEL_BUILT not in log


def test_a_flag_typo_in_a_three_line_script_is_one_line_per_job(corpus: Path) -> None:
    """``add_dp_schedule_args`` makes Megatron's parser report a bad flag once per job, naming the closest known
    ``--dp-schedule*`` flag instead of argparse's "unrecognized arguments" and usage on every rank."""
    log = assert_once_per_job(_three_lines(corpus, "--dp-schedule-balanse", "tokens"),
                              "three_line_script.py: error: unknown option --dp-schedule-balanse; did you mean "
                              "--dp-schedule-balance?")
    assert MODEL_BUILT not in log


def test_the_dry_run_launcher_needs_a_script() -> None:
    proc = subprocess.run([sys.executable, "-m", DRY_RUN], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 1 and proc.stderr.splitlines()[-1] == (
        "usage: python -m megatron_dpsched.testing.cpu_dry_run SCRIPT [ARGS ...] (under torchrun)")
