"""Data validated before the first step, in real ``torchrun`` jobs of the GPT entry point on gloo.

* A bad late row (an id past the padded vocabulary, a -1 label, a sidecar mask value of 2) of a JSONL or an
  indexed corpus, or a ``.bin`` shorter than its ``.idx``: one line naming the file and the line (or the
  sequence), exit code 2, before the model is built, where it used to train until its step arrived.
* A row edited in place under the running job (same length, other ids): one line naming it when its step
  reads it, not the edited row trained.
* A corpus over 64 MiB edited in place between a save and a resume, where the old sampled checksum did not
  look (between its blocks) and in its last block: the resume is refused naming the data content.
* The same corpus named relatively on one rank and absolutely on the other: one job, it trains.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from entry import _PORTS, MODEL_BUILT, REPO, corpus_rows, errors, tiny_gpt_argv, torchrun, torchrun_per_rank

from megatron_dpsched.data import write_token_indexed, write_token_jsonl
from megatron_dpsched.data.indexed_file import read_index_file

pytestmark = pytest.mark.distributed

VOCAB = 128
RANK_TRACEBACK = re.compile(r"\[rank\d+\]:|File \".*(megatron_dpsched|pretrain_gpt_dpsched\.py|data_edit_entry\.py)")
"""A traceback frame of a rank (torchrun's own ChildFailedError traceback names none of these)."""


def _argv(data: str, *extra: str, train_iters: int = 2) -> list[str]:
    return [*tiny_gpt_argv(vocab=VOCAB), "--data-path", data, "--split", "100,0,0", "--global-batch-size", "8",
            "--train-iters", str(train_iters), "--lr", "1e-3", "--eval-iters", "0", "--dp-schedule",
            "--dp-schedule-max-tokens-per-gpu", "48", *extra]


def _one_line(log: str, pattern: str) -> str:
    """The log's one line matching ``pattern`` (besides torchrun's summary, which must name it), no traceback
    of a rank, and exit code 2."""
    lines = [line for line in log.splitlines() if re.search(pattern, line) and "traceback :" not in line]
    assert len(lines) == 1, (lines, errors(log))
    assert not RANK_TRACEBACK.search(log), errors(log)
    assert re.search(r"exitcode\s*: 2 ", log) and re.search(r"traceback : " + pattern.lstrip("^"), log, re.M), \
        errors(log)
    return lines[0]


def _with_bad_late_row(tmp_path: Path, kind: str) -> tuple[str, str]:
    """A corpus whose row 40 (of 48; trained at step 5, after the 2 steps asked) is bad, and the line naming it."""
    rows = corpus_rows(48)
    masks = [[1] * len(row) for row in rows]
    if kind == "jsonl_id":
        rows[40] = [*rows[40][:-1], VOCAB]
        path = write_token_jsonl(tmp_path / "bad.jsonl", rows)
        return str(path), rf"^pretrain_gpt_dpsched\.py: error: {path}:41: 'tokens' holds {VOCAB}, outside the padded"
    if kind == "jsonl_label":
        rows = [{"input_ids": row, "labels": [-100, *row[1:]]} for row in rows]
        rows[40]["labels"][2] = -1
        path = write_token_jsonl(tmp_path / "bad.jsonl", rows)
        return str(path), rf"^pretrain_gpt_dpsched\.py: error: {path}:41: 'labels' holds -1; a label is a token id"
    if kind == "indexed_mask":
        masks[40][3] = 2
    else:
        rows[40] = [*rows[40][:-1], VOCAB + 7]
    prefix = write_token_indexed(tmp_path / "bad", rows, masks=masks)
    if kind == "indexed_mask":
        return str(prefix), (rf"^pretrain_gpt_dpsched\.py: error: {prefix}_mask\.bin sequence 40: the sidecar mask "
                             r"holds 2; a loss mask holds only 0 and 1$")
    return str(prefix), (rf"^pretrain_gpt_dpsched\.py: error: --data-path {prefix}\.bin sequence 40: holds token id "
                         rf"{VOCAB + 7}, outside the padded vocabulary \[0, {VOCAB}\)$")


@pytest.mark.parametrize("kind", ["jsonl_id", "jsonl_label", "indexed_id", "indexed_mask"])
def test_a_bad_late_row_fails_before_the_first_step_naming_file_and_line(tmp_path: Path, kind: str) -> None:
    data, expected = _with_bad_late_row(tmp_path, kind)
    proc = torchrun(_argv(data), nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    _one_line(log, expected)
    assert MODEL_BUILT not in log and "iteration        1/" not in log


def test_a_bin_shorter_than_its_idx_fails_before_the_first_step(tmp_path: Path) -> None:
    prefix = write_token_indexed(tmp_path / "short", corpus_rows(48))
    binary = Path(f"{prefix}.bin")
    size = binary.stat().st_size
    with open(binary, "r+b") as out:
        out.truncate(size - 40)
    proc = torchrun(_argv(str(prefix)), nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    _one_line(log, rf"^pretrain_gpt_dpsched\.py: error: {binary} holds {size - 40} bytes; short\.idx says its 48 "
                   rf"sequences end at byte {size}: the \.bin is truncated or belongs to another index$")
    assert "buffer is smaller than requested size" not in log
    assert MODEL_BUILT not in log and "iteration        1/" not in log


def _torchrun_editing(argv: list[str], *, edit: dict, nproc: int = 2) -> subprocess.CompletedProcess:
    """The entry point under torchrun, ``edit`` applied once every rank has indexed the data
    (``tests/distributed/data_edit_entry.py``)."""
    launcher = Path(sys.executable).with_name("torchrun")
    cmd = [str(launcher), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port",
           str(next(_PORTS)), str(REPO / "tests" / "distributed" / "data_edit_entry.py"), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "DPSCHED_EDIT": json.dumps(edit),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


def test_a_jsonl_row_edited_in_place_under_the_running_job_is_named_at_its_step(tmp_path: Path) -> None:
    """Row 20 (line 21, step 2) gets another first id of the same width after every rank indexed the file."""
    path = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows(48))
    lines = path.read_bytes().splitlines(keepends=True)
    row = json.loads(lines[20])
    row["tokens"][0] ^= 1
    edited = (json.dumps(row) + "\n").encode()
    assert len(edited) == len(lines[20]) and edited != lines[20]
    (tmp_path / "sync").mkdir()
    proc = _torchrun_editing(_argv(str(path), train_iters=4), edit={
        "file": str(path), "offset": sum(map(len, lines[:20])), "hex": edited.hex(), "sync": str(tmp_path / "sync")})
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, "the edited row trained"
    _one_line(log, rf"^dp-schedule: rank \d step 2: {re.escape(str(path))}:21: the row changed after the file was "
                   r"indexed at start-up \(same length, other content\): the file was edited in place under this job")
    assert "iteration        2/" in log and "iteration        3/" not in log


def test_an_indexed_sequence_edited_in_place_under_the_running_job_is_named_at_its_step(tmp_path: Path) -> None:
    prefix = write_token_indexed(tmp_path / "corpus", corpus_rows(48))
    pointer = int(read_index_file(f"{prefix}.idx").pointers[20])
    first = int.from_bytes(Path(f"{prefix}.bin").read_bytes()[pointer:pointer + 4], "little")
    (tmp_path / "sync").mkdir()
    proc = _torchrun_editing(_argv(str(prefix), train_iters=4), edit={
        "file": f"{prefix}.bin", "offset": pointer, "hex": (first ^ 1).to_bytes(4, "little").hex(),
        "sync": str(tmp_path / "sync")})
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, "the edited sequence trained"
    _one_line(log, rf"^dp-schedule: rank \d step 2: {re.escape(str(prefix))}\.bin sequence 20: the sequence changed "
                   r"after the file was indexed at start-up \(edited in place under this job\)")
    assert "iteration        2/" in log and "iteration        3/" not in log


OLD_BLOCKS, OLD_BLOCK = 64, 64 << 10
"""The checksum this replaced: files over 64 MiB hashed by 64 evenly spaced 64 KiB blocks."""


@pytest.fixture(scope="module")
def large_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A corpus over 64 MiB (48 rows, then one row padded by a 65 MiB field never trained in 4 steps) and a
    checkpoint of iteration 2 of it."""
    folder = tmp_path_factory.mktemp("large")
    path = write_token_jsonl(folder / "large.jsonl", corpus_rows(48))
    with open(path, "a") as out:
        out.write(json.dumps({"tokens": [1, 2, 3], "padding": "x" * (65 << 20)}) + "\n")
    saved = folder / "checkpoint"
    proc = torchrun(_argv(str(path), "--save", str(saved), "--save-interval", "2", "--exit-interval", "2",
                          train_iters=4), nproc=2)
    assert proc.returncode == 0, errors(proc.stdout + proc.stderr)
    return path, saved


def _old_block_starts(size: int) -> list[int]:
    return [(size - OLD_BLOCK) * block // (OLD_BLOCKS - 1) for block in range(OLD_BLOCKS)]


@pytest.mark.parametrize("where", ["between_old_blocks", "last_block"])
def test_a_large_corpus_edited_in_place_before_a_resume_is_refused(large_corpus: tuple[Path, Path],
                                                                   where: str) -> None:
    path, saved = large_corpus
    size = path.stat().st_size
    starts = _old_block_starts(size)
    position = starts[1] - 4096 if where == "between_old_blocks" else size - 100
    assert (position >= starts[-1]) == (where == "last_block")
    assert where == "last_block" or not any(s <= position < s + OLD_BLOCK for s in starts), "outside the old blocks"
    original = path.read_bytes()[position:position + 1]
    assert original == b"x"
    with open(path, "r+b") as out:
        out.seek(position)
        out.write(b"y")
    try:
        proc = torchrun(_argv(str(path), "--load", str(saved), train_iters=4), nproc=2)
    finally:
        with open(path, "r+b") as out:
            out.seek(position)
            out.write(original)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, "resumed on edited data"
    lines = {line[line.index("resuming iteration 2 of"):] for line in log.splitlines()
             if "resuming iteration 2 of" in line and "traceback :" not in line}
    assert len(lines) == 1, errors(log)
    (message,) = lines
    assert re.search(r"data content: '[0-9a-f]{16}' -> '[0-9a-f]{16}'", message), message
    assert "data paths" not in message and "data sizes" not in message, message
    assert "iteration        3/" not in log


def test_a_relative_and_an_absolute_path_of_one_corpus_are_one_job(tmp_path: Path) -> None:
    path = write_token_jsonl(tmp_path / "corpus.jsonl", corpus_rows(48))
    proc = torchrun_per_rank([_argv("corpus.jsonl"), _argv(str(path))], cwds=[tmp_path, REPO],
                             spec=tmp_path / "ranks.json")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, errors(log)
    assert "disagree" not in log and "iteration        2/       2" in log
    assert np.isfinite(float(re.findall(r"lm loss: ([0-9.E+-]+)", log)[-1]))
