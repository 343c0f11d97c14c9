"""The GPT entry point: a bad ``--dp-schedule*`` flag is one line before Megatron's argument dump; samples over
the token cap are warned about once, counted in every step's log line, or refused before training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from entry import MODEL_BUILT, corpus_rows, errors, python, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed

TORCH_LOG = re.compile(r"^[IWEF]\d{4} \d")
"""torch's own C++ log lines (``W1204 ... No CUDA runtime is found``), printed on import on a CPU machine."""
ARGUMENT_DUMP = "------------------------ arguments ------------------------"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows(48))


def _argv(corpus: Path, *extra: str) -> list[str]:
    return [*tiny_gpt_argv(), "--data-path", str(corpus), "--split", "100,0,0", "--global-batch-size", "8",
            "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", *extra]


@pytest.mark.parametrize(("extra", "message"), [
    (("--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", "--dp-schedule-balanse", "tokens"),
     "unknown option --dp-schedule-balanse; did you mean --dp-schedule-balance?"),
    (("--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "48", "--dp-schedule-microbatch-overhead-ms", "3"),
     "--dp-schedule-microbatch-overhead-ms has no effect with the micro-batches objective "
     "(--pipeline-model-parallel-size 1): it times micro-batches for the step-time objective only; drop it"),
])
def test_a_bad_flag_is_one_line_before_megatrons_argument_dump(corpus: Path, extra: tuple, message: str) -> None:
    proc = python(_argv(corpus, *extra))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if not TORCH_LOG.match(line)]
    assert ours == [f"pretrain_gpt_dpsched.py: error: {message}"]
    assert ARGUMENT_DUMP not in proc.stdout and MODEL_BUILT not in proc.stdout


def test_over_cap_samples_are_warned_once_and_counted_every_step(corpus: Path) -> None:
    # rows of 40 positions (ids 7 and 15 of the 16 read) are over the cap of 32
    proc = torchrun(_argv(corpus, "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "32",
                          "--dp-schedule-collate-format", "bshd"), nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    warnings = [line for line in log.splitlines() if "over the token cap" in line]
    assert warnings == ["dp-schedule: WARNING: 2 sample(s) of the train dataset are over the token cap of 32 "
                        "(--dp-schedule-max-tokens-per-gpu x --context-parallel-size), the longest 40 tokens: "
                        "id 7 (40 tokens), id 15 (40 tokens); each trains alone in a micro-batch over the cap, which "
                        "may not fit in memory (--dp-schedule-over-cap allow: no warning; refuse: stop)"]
    for step in (0, 1):
        (line,) = [line for line in log.splitlines() if f"dp-schedule step {step}: " in line]
        assert "| over cap 1 (longest 40) |" in line, line
    assert "iteration        2/       2" in log


def test_refuse_stops_before_training_naming_the_samples(corpus: Path) -> None:
    proc = torchrun(_argv(corpus, "--dp-schedule", "--dp-schedule-max-tokens-per-gpu", "32",
                          "--dp-schedule-collate-format", "bshd", "--dp-schedule-over-cap", "refuse"), nproc=1)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("--dp-schedule-over-cap refuse: 2 sample(s) of the train dataset are over the token cap of 32" in log
            and "id 7 (40 tokens), id 15 (40 tokens)" in log), errors(log)
    assert "iteration        1/" not in log
