"""Corpora validated when they are indexed: ids against the padded vocabulary, masks 0/1, the ``.bin`` against its
``.idx``, and rows changed in place after indexing found when they are read, each in one line naming the file and
the line (JSONL) or the sequence (indexed)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_dpsched.data.corpus import open_corpus, write_token_indexed, write_token_jsonl
from megatron_dpsched.data.indexed_file import read_index_file
from megatron_dpsched.data.line_index import index_path
from megatron_dpsched.runtime.job_identity import file_checksum

REPO = Path(__file__).resolve().parents[2]
VOCAB = 128
ROWS = [[(7 * i + j) % VOCAB for j in range(3 + i % 5)] for i in range(300)]


def _jsonl(tmp_path: Path, rows: list) -> Path:
    return write_token_jsonl(tmp_path / "corpus.jsonl", rows)


def _other_first_id(line: bytes) -> bytes:
    """The JSONL row ``line`` with its first token id changed to another of the same width (same length)."""
    row = json.loads(line)
    row["tokens"][0] ^= 1
    return json.dumps(row).encode()


def _edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` by ``new`` (same length) in place."""
    assert len(old) == len(new)
    position = path.read_bytes().index(old)
    with open(path, "r+b") as out:
        out.seek(position)
        out.write(new)


OUTSIDE = f"outside the padded vocabulary [0, {VOCAB}) (an embedding row that does not exist)"


@pytest.mark.parametrize(("row", "message"), [
    ({"tokens": [1, 2, VOCAB]}, f"'tokens' holds {VOCAB}, {OUTSIDE}"),
    ({"input_ids": [1, 2, 3], "labels": [-100, 2, VOCAB + 5]}, f"'labels' holds {VOCAB + 5}, {OUTSIDE}"),
    ({"tokens": [1, -1, 3]}, "'tokens' holds a negative token id (-1)"),
    ({"input_ids": [1, 2, 3], "labels": [-100, -1, 3]},
     "'labels' holds -1; a label is a token id or -100 (not trained)"),
    ({"tokens": [1, 2, 3], "loss_mask": [0, 2, 1]},
     "'loss_mask' holds values other than 0 and 1 (2); a loss mask is not a loss weight"),
])
def test_a_bad_late_jsonl_row_fails_when_the_corpus_is_opened_naming_its_line(tmp_path: Path, row: dict,
                                                                              message: str) -> None:
    path = _jsonl(tmp_path, [*ROWS, row, *ROWS[:5]])
    for attempt in range(2):  # built, then (the id checks) from the cache: the vocabulary is checked either way
        with pytest.raises(ValueError) as error:
            open_corpus(path, vocab_size=VOCAB)
        assert str(error.value) == f"{path}:301: {message}", attempt


def test_the_vocabulary_is_checked_on_every_open_of_a_cached_index(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, ROWS)
    assert len(open_corpus(path)) == len(ROWS)  # no bound: built and cached
    assert not open_corpus(path, vocab_size=VOCAB).index.rebuilt
    largest = max(max(row) for row in ROWS)
    late = max(i for i, row in enumerate(ROWS) if max(row) == largest)
    first = min(i for i, row in enumerate(ROWS) if max(row) == largest)
    with pytest.raises(ValueError, match=rf"^{path}:{first + 1}: 'tokens' holds {largest}, outside the padded "
                                         rf"vocabulary \[0, {largest}\)"):
        open_corpus(path, vocab_size=largest)
    assert late > first


def test_a_jsonl_row_edited_in_place_after_indexing_is_named_when_read(tmp_path: Path) -> None:
    """Same length, other ids: the length check passes, the digest recorded at indexing does not."""
    path = _jsonl(tmp_path, ROWS)
    data = open_corpus(path, vocab_size=VOCAB)
    assert data[250]["tokens"].tolist() == ROWS[250][:-1]
    line = path.read_bytes().split(b"\n")[250]
    edited = _other_first_id(line)
    assert len(edited) == len(line) and edited != line
    _edit_in_place(path, line, edited)
    assert data[249]["tokens"].numel() > 0  # other rows still read
    with pytest.raises(ValueError) as error:
        data[250]
    assert str(error.value) == (f"{path}:251: the row changed after the file was indexed at start-up (same length, "
                                f"other content): the file was edited in place under this job; restore it, or "
                                f"restart the job to index the new content")


def test_a_jsonl_file_edited_before_a_later_start_is_reindexed_with_new_digests(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, ROWS)
    first = open_corpus(path)
    line = path.read_bytes().split(b"\n")[10]
    _edit_in_place(path, line, _other_first_id(line))
    again = open_corpus(path)
    assert again.index.rebuilt and again.sample_digest(10) != first.sample_digest(10)
    assert again.index.checksum != first.index.checksum
    assert again.sample_digest(11) == first.sample_digest(11)


def test_the_index_records_each_rows_largest_id_and_digest(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [[1, 2, 3], {"input_ids": [1, 2, 3], "labels": [-100, 2, 90]}, [5, 4]])
    data = open_corpus(path)
    assert data.index.max_ids.tolist() == [3, 90, 5]
    lines = path.read_bytes().splitlines(keepends=True)
    assert [data.sample_digest(i) for i in range(3)] == [
        int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little") for line in lines]


# --- indexed corpora ----------------------------------------------------------------------------------


def _indexed(tmp_path: Path, rows: list, masks: list | None = None) -> Path:
    return write_token_indexed(tmp_path / "corpus", rows, masks=masks)


def test_a_bad_late_indexed_sequence_fails_when_opened_naming_the_file_and_sequence(tmp_path: Path) -> None:
    prefix = _indexed(tmp_path, [*ROWS, [1, 2, VOCAB + 3], *ROWS[:3]])
    for attempt in range(2):  # scanned, then from the cache
        with pytest.raises(ValueError) as error:
            open_corpus(prefix, vocab_size=VOCAB)
        assert str(error.value) == (f"--data-path {prefix}.bin sequence 300: holds token id {VOCAB + 3}, outside "
                                    f"the padded vocabulary [0, {VOCAB})"), attempt
    assert len(open_corpus(prefix, vocab_size=VOCAB + 4)) == len(ROWS) + 4


def test_a_negative_indexed_id_is_refused(tmp_path: Path) -> None:
    prefix = _indexed(tmp_path, [*ROWS, [1, -1, 3]])
    with pytest.raises(ValueError, match=rf"^{prefix}.bin sequence 300: holds a negative token id \(-1\)$"):
        open_corpus(prefix, vocab_size=VOCAB)


def test_a_sidecar_mask_value_of_2_in_a_late_sequence_is_refused_when_opened(tmp_path: Path) -> None:
    masks = [[1] * len(row) for row in ROWS]
    masks[280] = [1, 2] + [1] * (len(ROWS[280]) - 2)
    prefix = _indexed(tmp_path, ROWS, masks)
    with pytest.raises(ValueError, match=rf"^{prefix}_mask.bin sequence 280: the sidecar mask holds 2; a loss mask "
                                         r"holds only 0 and 1$"):
        open_corpus(prefix, vocab_size=VOCAB)


def test_a_bin_shorter_than_its_idx_is_refused_when_opened(tmp_path: Path) -> None:
    prefix = _indexed(tmp_path, ROWS)
    binary = Path(f"{prefix}.bin")
    size = binary.stat().st_size
    with open(binary, "r+b") as out:
        out.truncate(size - 8)
    with pytest.raises(ValueError, match=rf"^{binary} holds {size - 8} bytes; corpus.idx says its 300 sequences end "
                                         rf"at byte {size}: the .bin is truncated or belongs to another index$"):
        open_corpus(prefix)


def test_an_indexed_sequence_edited_in_place_after_opening_is_named_when_read(tmp_path: Path) -> None:
    masks = [[1] * len(row) for row in ROWS]
    prefix = _indexed(tmp_path, ROWS, masks)
    data = open_corpus(prefix, vocab_size=VOCAB)
    index = read_index_file(f"{prefix}.idx")
    for binary, sequence in ((Path(f"{prefix}.bin"), 299), (Path(f"{prefix}_mask.bin"), 150)):
        itemsize = 4 if binary.name == "corpus.bin" else 1
        with open(binary, "r+b") as out:
            out.seek(int(read_index_file(str(binary)[:-4] + ".idx").pointers[sequence]))
            out.write((0).to_bytes(itemsize, "little"))  # same size, another first value
        with pytest.raises(ValueError) as error:
            data[sequence]
        assert str(error.value) == (f"{binary} sequence {sequence}: the sequence changed after the file was indexed "
                                    f"at start-up (edited in place under this job); restore it, or restart the job "
                                    f"to index the new content")
    assert index.lengths.size == len(ROWS) and data[0]["tokens"].numel() == len(ROWS[0]) - 1


def test_the_scan_is_cached_and_redone_when_the_bin_changes(tmp_path: Path) -> None:
    prefix = _indexed(tmp_path, ROWS)
    first = open_corpus(prefix)
    assert first._scan.rebuilt and not open_corpus(prefix)._scan.rebuilt
    binary = Path(f"{prefix}.bin")
    reference = hashlib.blake2b(binary.stat().st_size.to_bytes(8, "little") + binary.read_bytes(), digest_size=8)
    assert first._scan.checksum == reference.hexdigest() == file_checksum(binary)  # the job identity's, no pass
    assert index_path(binary).is_file()
    data = bytearray(binary.read_bytes())
    data[-4:] = (5).to_bytes(4, "little")
    binary.write_bytes(bytes(data))
    again = open_corpus(prefix)
    assert again._scan.rebuilt and again._scan.checksum != first._scan.checksum
    assert again.sample_digest(len(ROWS) - 1) != first.sample_digest(len(ROWS) - 1)


def _idx_header(*, code: int = 4, sequences: int = 3, documents: int = 4) -> bytes:
    return b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, sequences, documents)


@pytest.mark.parametrize(("content", "message"), [
    (b"garbage", " is not a Megatron index (no MMIDIDX version-1 header; truncated or another file)"),
    (_idx_header(code=9), ": unknown dtype code 9 (megatron-core knows [1, 2, 3, 4, 5, 6, 7, 8])"),
    (_idx_header() + b"\x00" * 10, " holds 44 bytes; its header promises 3 sequences and 4 documents (102 bytes): "
                                   "truncated or corrupt"),
    (_idx_header(sequences=1, documents=0) + struct.pack("<iq", -3, 0),
     " holds negative sequence lengths or pointers: corrupt"),
])
def test_a_corrupt_idx_is_one_line_when_opened(tmp_path: Path, content: bytes, message: str) -> None:
    prefix = _indexed(tmp_path, ROWS[:3])
    Path(f"{prefix}.idx").write_bytes(content)
    with pytest.raises(ValueError) as error:
        open_corpus(prefix)
    assert str(error.value) == f"--data-path {prefix}: {prefix}.idx{message}"


def test_plan_on_a_corrupt_idx_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    """megatron-core's reader asserted, then its ``__del__`` raised again after the clear line."""
    prefix = _indexed(tmp_path, ROWS[:3])
    Path(f"{prefix}.idx").write_bytes(b"garbage")
    done = subprocess.run([sys.executable, "-m", "megatron_dpsched.cli", "plan", f"{prefix}.idx", "--dp-size", "1",
                           "--global-batch-size", "2", "--max-tokens-per-gpu", "100"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"megatron-dpsched: error: {prefix}.idx is not a Megatron index (no MMIDIDX version-1 header; truncated or "
        f"another file)"], done.stderr


def test_plan_reads_the_lengths_of_a_good_index(tmp_path: Path) -> None:
    from megatron_dpsched.whatif.inputs import load_sample_lengths

    prefix = _indexed(tmp_path, ROWS)
    assert load_sample_lengths(f"{prefix}.bin") == ([len(row) - 1 for row in ROWS], "indexed dataset")
    assert json.dumps(read_index_file(f"{prefix}.idx").bin_bytes) == str(4 * sum(map(len, ROWS)))
    assert np.array_equal(read_index_file(f"{prefix}.idx").lengths, [len(row) for row in ROWS])
