"""``megatron-dpsched plan`` on a Megatron indexed dataset: lengths read from the index by megatron-core."""

from __future__ import annotations

import json

import pytest

from megatron_dpsched.cli import main
from megatron_dpsched.data import IndexedTokenDataset, TokenJsonlDataset, write_token_indexed, write_token_jsonl
from megatron_dpsched.whatif.inputs import load_sample_lengths

pytestmark = pytest.mark.distributed

ROWS = [list(range(n)) for n in (5, 2, 17, 9, 3, 40, 11, 8)]


def test_indexed_and_jsonl_inputs_give_the_datasets_lengths(tmp_path, capsys) -> None:
    prefix = write_token_indexed(tmp_path / "corpus", ROWS)
    jsonl = write_token_jsonl(tmp_path / "corpus.jsonl", ROWS)
    expected = [len(row) - 1 for row in ROWS]
    assert list(IndexedTokenDataset(prefix).lengths) == list(TokenJsonlDataset(jsonl).lengths) == expected
    for name in (str(prefix), f"{prefix}.bin", f"{prefix}.idx"):
        assert load_sample_lengths(name) == (expected, "indexed dataset")
    assert load_sample_lengths(str(jsonl)) == (expected, "JSONL corpus")
    assert main(["plan", str(prefix), "--dp-size", "2", "--global-batch-size", "4", "--max-tokens-per-gpu", "32",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == len(ROWS) and report["input"].endswith("(indexed dataset)")
    assert sum(step["tokens"] for step in report["steps"]) == sum(expected)


def test_a_broken_index_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "bad.bin").write_bytes(b"\0" * 16)
    (tmp_path / "bad.idx").write_bytes(b"not an index")
    assert main(["plan", str(tmp_path / "bad"), "--dp-size", "1", "--global-batch-size", "1",
                 "--max-tokens-per-gpu", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megatron-dpsched: error: ") and "bad.idx" in err[0]
