"""JSONL rows and the cached length index (no torch): formats, masks, stale-index rebuilds, bad lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_dpsched.data.line_index import CACHE_DIR_ENV, IntArrayView, index_path, open_index
from megatron_dpsched.data.rows import IGNORE_INDEX, parse_row, row_length, shifted


def _measure(path: Path):
    return lambda line, number: (row_length(line, path=path, line_number=number),)


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _open(path: Path):
    return open_index(path, kind="test-rows", measure=_measure(path))


ROWS = [{"tokens": [1, 2, 3]}, {"tokens": [4, 5, 6, 7], "loss_mask": [1, 0, 1, 1]},
        {"input_ids": [8, 9, 10, 11], "labels": [-100, -100, 10, 11]}]


def test_the_three_row_shapes_and_their_shifted_masks() -> None:
    plain, masked, labelled = (parse_row(json.dumps(r), path="f", line_number=1) for r in ROWS)
    assert plain.targets is None and plain.num_positions == 2
    inputs, labels, mask = shifted(masked.tokens, masked.targets)
    assert inputs.tolist() == [4, 5, 6] and labels.tolist() == [5, 6, 7] and mask.tolist() == [False, True, True]
    inputs, labels, mask = shifted(labelled.tokens, labelled.targets)
    assert inputs.tolist() == [8, 9, 10] and labels.tolist() == [9, 10, 11] and mask.tolist() == [False, True, True]
    assert IGNORE_INDEX not in labels.tolist()  # ignored labels become valid ids


@pytest.mark.parametrize(("row", "message"), [
    ({"tokens": [1, 2, 3], "loss_mask": [1, 0]}, "'loss_mask' has 2 entries for 3 'tokens'"),
    ({"input_ids": [1, 2, 3], "labels": [1, 2]}, "'labels' has 2 entries for 3 'input_ids'"),
    ({"input_ids": [1, 2, 3], "labels": [-100, -7, 3]}, "'labels' holds -7"),
    ({"input_ids": [1, 2, 3], "labels": [-100, 2.5, 3]}, "'labels' must be a list of integers"),
    ({"tokens": [1, 2, 3], "loss_mask": [1, 2, 0]}, "values other than 0 and 1"),
    ({"text": "hello"}, "a row needs \"tokens\""),
    ({"tokens": [5]}, "at least 2 token ids"),
    ({"tokens": [1, -2]}, "negative token id"),
    ({"tokens": [1, 2], "loss_mask": [1, 1], "labels": [1, 2]}, "not both"),
])
def test_bad_rows_name_the_file_and_line(tmp_path: Path, row: dict, message: str) -> None:
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], ROWS[1], row])
    with pytest.raises(ValueError, match=rf"{path}:3: .*") as error:
        _open(path)
    assert message in str(error.value)


def test_a_truncated_last_line_fails_with_its_line_number(tmp_path: Path) -> None:
    path = _write(tmp_path / "cut.jsonl", ROWS)
    with open(path, "a") as out:
        out.write('{"tokens": [1, 2, 3')  # a copy that stopped mid-line
    with pytest.raises(ValueError, match=rf"{path}:4: not a JSON object \(truncated or corrupt line\?\)"):
        _open(path)


def test_the_index_holds_offsets_and_lengths_and_is_cached(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", [ROWS[0], "", ROWS[1], ROWS[2]])  # a blank line is skipped
    first = _open(path)
    assert first.rebuilt and first.lengths.tolist() == [2, 3, 3]
    data = path.read_bytes()
    for offset, row in zip(first.offsets.tolist(), (ROWS[0], ROWS[1], ROWS[2]), strict=True):
        assert json.loads(data[offset:].split(b"\n", 1)[0]) == row
    assert index_path(path).is_file()
    second = _open(path)
    assert not second.rebuilt and second.lengths.tolist() == [2, 3, 3]
    assert open_index(path, kind="another-reader", measure=_measure(path)).rebuilt  # another kind: rebuilt


def test_touching_or_appending_rebuilds_the_index(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    _open(path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touched: same bytes, new mtime
    assert _open(path).rebuilt
    assert not _open(path).rebuilt
    with open(path, "a") as out:
        out.write(json.dumps({"tokens": [1, 2, 3, 4, 5]}) + "\n")
    appended = _open(path)
    assert appended.rebuilt and appended.lengths.tolist() == [2, 3, 3, 4]


def test_a_corrupt_cache_file_is_rebuilt(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    _open(path)
    index_path(path).write_bytes(b"not an npz file")
    assert _open(path).rebuilt and not _open(path).rebuilt


def test_the_cache_folder_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert _open(path).rebuilt
    assert index_path(path).parent == tmp_path / "cache" and index_path(path).is_file()
    assert not path.with_name(path.name + ".dpsched-index.npz").exists()
    assert not _open(path).rebuilt


def test_an_unwritable_cache_warns_and_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "rows.jsonl", ROWS)
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))  # a folder under a file cannot be made
    with pytest.warns(UserWarning, match="cannot store the length index"):
        assert _open(path).lengths.tolist() == [2, 3, 3]


def test_int_array_view_is_a_sequence_of_python_ints() -> None:
    view = IntArrayView(np.arange(200_000, dtype=np.int64))
    assert len(view) == 200_000 and type(view[5]) is int and view[-1] == 199_999
    assert view[2:5] == [2, 3, 4] and max(view) == 199_999 and tuple(view)[:3] == (0, 1, 2)


def test_rows_and_index_import_without_torch() -> None:
    code = ("import sys, megatron_dpsched.data.rows, megatron_dpsched.data.line_index; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2]).returncode == 0



def _padded_row(tokens: list[int], width: int) -> str:
    text = json.dumps({"tokens": tokens}, separators=(",", ":"))
    return text + " " * (width - 1 - len(text)) + "\n"


def test_a_same_size_copy_with_the_mtime_kept_is_reindexed(tmp_path) -> None:
    """``cp -p`` / ``rsync -a`` of another file of the same size: the CRC tells them apart."""
    path = tmp_path / "d.jsonl"
    path.write_text(_padded_row([1, 2, 3], 60) + _padded_row([4, 5, 6], 60))
    stat = os.stat(path)
    assert len(_open(path)) == 2
    path.write_text(_padded_row([7, 7, 7], 25) + _padded_row([8, 8, 8], 35) + _padded_row([9, 9, 9], 60))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime, three rows
    index = _open(path)
    assert index.rebuilt and len(index) == 3 and list(index.offsets) == [0, 25, 60]


def test_reading_an_offset_that_no_longer_starts_a_line_fails_naming_the_file(tmp_path) -> None:
    from megatron_dpsched.data.line_index import LineReader

    path = tmp_path / "d.jsonl"
    path.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [4, 5, 6]}\n')
    offset = int(_open(path).offsets[1])
    path.write_text('{"tokens": [1, 2, 3, 4]}\n{"tokens": [4, 5, 6]}\n')  # a running job keeps its index
    with pytest.raises(ValueError, match=f"{path.name} changed after its length index was built"):
        LineReader(path).read(offset)


def test_a_file_deleted_after_start_up_fails_naming_it(tmp_path) -> None:
    from megatron_dpsched.data.line_index import LineReader

    path = tmp_path / "d.jsonl"
    path.write_text('{"tokens": [1, 2, 3]}\n{"tokens": [4, 5, 6]}\n')
    offset = int(_open(path).offsets[1])
    path.unlink()
    with pytest.raises(ValueError, match=f"{path} cannot be read \\(No such file or directory\\): it was moved or "
                                         "deleted after start-up"):
        LineReader(path).read(offset)


def test_threads_sharing_a_reader_read_their_own_lines(tmp_path) -> None:
    """The prefetch threads of two splits of one file share its reader: positional reads keep them apart."""
    import threading

    from megatron_dpsched.data.line_index import LineReader

    rows = [json.dumps({"tokens": list(range(i * 997 % 40000 + 1))}) for i in range(120)]  # lines up to ~200 KiB
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(rows) + "\n")
    offsets = [0]
    for row in rows[:-1]:
        offsets.append(offsets[-1] + len(row) + 1)
    reader, wrong = LineReader(path), []

    def read_some(seed: int) -> None:
        for j in range(200):
            i = (7 * j + seed) % len(rows)
            if reader.read(offsets[i]).decode().rstrip("\n") != rows[i]:
                wrong.append(i)

    threads = [threading.Thread(target=read_some, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
