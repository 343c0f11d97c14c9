"""Samples with no loss token (no torch): counted by the length index when a JSONL file is read, cached with the
lengths, and named (count, first file:line) in the warning the entry point prints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from megatron_dpsched.data import line_index
from megatron_dpsched.data.line_index import index_path, line_numbers_at, open_index
from megatron_dpsched.data.no_loss import SHOWN, no_loss_notice, no_loss_samples
from megatron_dpsched.data.rows import IGNORE_INDEX, row_measure

ROWS = [
    {"tokens": [1, 2, 3]},                                         # every position trained
    {"tokens": [4, 5, 6, 7], "loss_mask": [1, 0, 1, 1]},           # two of three
    {"input_ids": [8, 9, 10], "labels": [-100, -100, -100]},       # none: all labels ignored
    {"tokens": [4, 5, 6], "loss_mask": [1, 0, 0]},                 # none: only the first token (never a target)
    {"input_ids": [8, 9, 10, 11], "labels": [8, -100, -100, 11]},  # one (the first label is never a target)
]


def _expected_trained(row: dict) -> int:
    """Reference: targets are tokens 1.. of the row; count those not masked out."""
    if "loss_mask" in row:
        return sum(row["loss_mask"][1:])
    if "labels" in row:
        return sum(label != IGNORE_INDEX for label in row["labels"][1:])
    return len(row["tokens"]) - 1


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _open(path: Path) -> line_index.LineIndex:
    return open_index(path, kind="test-rows", measure=lambda line, n: (row_measure(line, path=path, line_number=n),))


def _names(path: Path, index: line_index.LineIndex):
    return lambda ids: [f"{path}:{n}" for n in line_numbers_at(path, [int(index.offsets[i]) for i in ids])]


def test_the_index_counts_each_rows_trained_positions_and_caches_them(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    built = _open(path)
    assert built.rebuilt and built.trained.tolist() == [_expected_trained(r) for r in ROWS] == [2, 2, 0, 0, 1]
    cached = _open(path)
    assert not cached.rebuilt and cached.trained.tolist() == built.trained.tolist()
    assert no_loss_samples(cached.trained).tolist() == [2, 3]


def test_an_index_cached_before_the_trained_counts_is_rebuilt(tmp_path: Path) -> None:
    """A version-2 cache (lengths only) must not be read as having no trained counts."""
    path = _write(tmp_path / "rows.jsonl", ROWS)
    _open(path)
    cache = index_path(path)
    with np.load(cache) as stored:
        meta = json.loads(str(stored["meta"]))
        arrays = {k: stored[k] for k in ("offsets", "parts", "lengths")}
    meta["version"] = 2
    with open(cache, "wb") as out:
        np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
    again = _open(path)
    assert again.rebuilt and again.trained.tolist() == [2, 2, 0, 0, 1]


def test_the_notice_gives_the_count_and_the_first_lines(tmp_path: Path) -> None:
    rows = [ROWS[0], "", ROWS[2], ROWS[1], ROWS[3]]  # a blank line: line numbers are the file's
    path = _write(tmp_path / "rows.jsonl", rows)
    index = _open(path)
    notice = no_loss_notice(index.trained, source=f"--data-path {path}", name=_names(path, index))
    assert notice is not None and notice.startswith(f"dp-schedule: WARNING: --data-path {path}: 2 of 4 samples "
                                                    "have no loss token")
    assert f"{path}:3, {path}:5." in notice and "more" not in notice
    assert "steps the optimizer with zero gradients" in notice and "docs/data.md" in notice


def test_the_notice_names_the_first_few_and_counts_the_rest(tmp_path: Path) -> None:
    no_loss = {"input_ids": [1, 2], "labels": [-100, -100]}
    rows = [no_loss if i % 2 else ROWS[0] for i in range(2 * SHOWN + 6)]
    path = _write(tmp_path / "rows.jsonl", rows)
    index = _open(path)
    notice = no_loss_notice(index.trained, source="x", name=_names(path, index))
    total = SHOWN + 3
    assert f": {total} of {len(rows)} samples have no loss token" in notice
    shown = ", ".join(f"{path}:{2 * k + 2}" for k in range(SHOWN))
    assert f"{shown} and {total - SHOWN} more." in notice
    assert f"{path}:{2 * SHOWN + 2}," not in notice


def test_no_notice_when_every_sample_trains(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", [ROWS[0], ROWS[1], ROWS[4]])
    index = _open(path)
    assert no_loss_notice(index.trained, source="x", name=_names(path, index)) is None


def test_a_measure_giving_bare_lengths_trains_every_position(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    index = open_index(path, kind="lengths-only",
                       measure=lambda line, n: (row_measure(line, path=path, line_number=n)[0],))
    assert index.trained.tolist() == index.lengths.tolist() == [2, 3, 2, 2, 3]
