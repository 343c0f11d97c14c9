"""Rows and steps with no loss token through the entry point (``--cpu-dry-run``, DP=2 on gloo): the corpus
warning (count, first file:line) is printed once, when the data is read; a step whose samples hold no loss
token is named in the log; and Megatron's own line for that step shows what the docs say (no lm loss, grad
norm 0)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from entry import MODEL_BUILT, errors, tiny_gpt_argv, torchrun

from megatron_dpsched.data import write_token_jsonl

pytestmark = pytest.mark.distributed

BATCH = 8
NO_LOSS_IN_STEP_0 = (2, 5)
"""Rows of the first step whose labels are all ignored; every row of the second step is."""


def _rows() -> list[dict]:
    rows = []
    for i in range(2 * BATCH):
        tokens = [(5 * i + j) % 100 for j in range(4 + (7 * i) % 20)]
        no_loss = i >= BATCH or i in NO_LOSS_IN_STEP_0
        rows.append({"input_ids": tokens, "labels": [-100] * len(tokens) if no_loss else tokens})
    return rows


def test_rows_and_a_step_with_no_loss_token_are_warned_and_named(tmp_path: Path) -> None:
    rows = _rows()
    data = write_token_jsonl(tmp_path / "sft.jsonl", rows)
    argv = [*tiny_gpt_argv(), "--train-data-path", str(data), "--global-batch-size", str(BATCH),
            "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--dp-schedule",
            "--dp-schedule-max-tokens-per-gpu", "48"]
    proc = torchrun(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert MODEL_BUILT in log
    no_loss = [i for i, row in enumerate(rows) if all(label == -100 for label in row["labels"][1:])]
    lines = ", ".join(f"{data}:{i + 1}" for i in no_loss[:5])
    warning = (f"dp-schedule: WARNING: {data}: {len(no_loss)} of {len(rows)} samples have no loss token "
               f"(every target ignored: labels -100, loss_mask 0, or a conversation with no assistant turn): "
               f"{lines} and {len(no_loss) - 5} more.")
    assert log.count(warning) == 1, log[:3000]  # rank 0 only, once
    assert log.count("dp-schedule step 1: WARNING: no loss token in this step") == 1
    assert "dp-schedule step 0: WARNING" not in log
    trained_0 = sum(len(row["tokens" if "tokens" in row else "input_ids"]) - 1
                    for i, row in enumerate(rows[:BATCH]) if i not in no_loss)
    assert re.search(rf"dp-schedule step 0: .*\| loss tokens {trained_0} \| plan", log), log[-3000:]
    assert re.search(r"dp-schedule step 1: micro-batches .*\| loss tokens 0 \| plan", log), log[-3000:]
    first, second = (_megatron_line(log, iteration) for iteration in (1, 2))
    assert "lm loss:" in first and "lm loss:" not in second, (first, second)  # Megatron's 0/0 is left out
    assert "grad norm: 0.000 |" in second and "grad norm: 0.000 |" not in first, (first, second)


def _megatron_line(log: str, iteration: int) -> str:
    (line,) = [line for line in log.splitlines() if re.search(rf"iteration\s+{iteration}/\s*2 \|", line)]
    return line
