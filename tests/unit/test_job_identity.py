"""``megatron_dpsched.runtime.job_identity``: digests, which fields differ, the messages, checksums, the state file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from megatron_dpsched.runtime import job_identity as ji

BASE = {ji.ENABLED_FIELD: "on", ji.OPTIONS_FIELD: "balance='cost'", ji.RUN_TIME_OPTIONS_FIELD: "prefetch=True",
        ji.PLANNER_FIELD: "dp_size=2", ji.DATA_PATHS_FIELD: "data_path=['a.jsonl']",
        ji.DATA_SIZES_FIELD: "a.jsonl: 10 bytes", ji.DATA_CONTENT_FIELD: "a.jsonl: 0123456789abcdef"}


def identity(**changes: str) -> ji.JobIdentity:
    """The base identity with some fields changed (``DATA_PATHS=...`` changes ``ji.DATA_PATHS_FIELD``)."""
    values = {**BASE, **{getattr(ji, f"{name}_FIELD"): value for name, value in changes.items()}}
    return ji.JobIdentity(fields=tuple((name, values[name]) for name in ji.FIELDS))


def reduce_like_all_reduce(held: list[ji.JobIdentity]) -> tuple[list[int], list[int]]:
    """MAX and MIN of each field digest over the ranks, as the job's all-reduce computes them."""
    columns = list(zip(*(one.digests() for one in held)))
    return [max(c) for c in columns], [min(c) for c in columns]


def test_digests_are_63_bit_deterministic_and_differ_per_summary() -> None:
    digests = identity().digests()
    assert digests == identity().digests()
    assert all(0 <= d < 2**63 for d in digests)
    expected = int.from_bytes(hashlib.blake2b(b"on", digest_size=8).digest(), "little") >> 1
    assert digests[0] == expected
    assert identity(DATA_CONTENT="a.jsonl: fedcba9876543210").digests()[-1] != digests[-1]


def test_folding_is_order_sensitive_and_keyed_by_the_seed() -> None:
    assert ji.fold_digests(7, [1, 2]) != ji.fold_digests(7, [2, 1])
    assert ji.fold_digests(7, [1, 2]) != ji.fold_digests(8, [1, 2])
    assert ji.fold_digests(7, [1, 2]) == ji.fold_digests(7, [1, 2])
    assert 0 <= ji.fold_digests(2**63 - 1, [2**64 - 1]) < 2**63


@pytest.mark.parametrize("field", ["ENABLED", "OPTIONS", "PLANNER", "DATA_PATHS", "DATA_SIZES", "DATA_CONTENT"])
def test_the_reduced_digests_name_exactly_the_field_one_rank_changed(field: str) -> None:
    held = [identity(), identity(), identity(**{field: "something else"}), identity()]
    assert ji.mismatched_fields(*reduce_like_all_reduce(held)) == [getattr(ji, f"{field}_FIELD")]
    assert ji.mismatched_fields(*reduce_like_all_reduce([identity()] * 3)) == []


def test_the_message_names_the_field_and_the_ranks_of_each_value() -> None:
    held = [identity(), identity(), identity(DATA_CONTENT="a.jsonl: fedcba9876543210"), identity()]
    message = ji.job_disagreement_message(held)
    assert message.startswith("dp-schedule: the ranks of this job disagree on data content (data content: "
                              "ranks 0-1,3 have 'a.jsonl: 0123456789abcdef'; ranks 2 have 'a.jsonl: fedcba9876543210')")
    assert "\n" not in message


def test_a_rank_without_the_flag_is_named_by_the_flag_not_its_consequences() -> None:
    off = identity(ENABLED="off", OPTIONS="-", RUN_TIME_OPTIONS="-", PLANNER="-")
    message = ji.job_disagreement_message([identity(), off])
    assert "disagree on --dp-schedule, dp-schedule options, dp-schedule run-time options, planner config (" in message
    assert "(--dp-schedule: ranks 0 have 'on'; ranks 1 have 'off')" in message


def test_long_summaries_are_cut_in_messages() -> None:
    long = "x" * 1000
    message = ji.job_disagreement_message([identity(), identity(PLANNER=long)])
    assert "x" * (ji.SUMMARY_CHARS - 3) + "..." in message and "x" * ji.SUMMARY_CHARS not in message


def test_a_resume_names_what_changed_but_not_run_time_options() -> None:
    saved = identity().summaries
    assert ji.resume_changes(saved, identity(RUN_TIME_OPTIONS="prefetch=False")) == []
    changes = ji.resume_changes(saved, identity(DATA_PATHS="data_path=['b.jsonl']", PLANNER="dp_size=4"))
    assert changes == ["planner config: 'dp_size=2' -> 'dp_size=4'",
                       "data paths: \"data_path=['a.jsonl']\" -> \"data_path=['b.jsonl']\""]
    missing = {name: value for name, value in saved.items() if name != ji.DATA_CONTENT_FIELD}
    assert ji.resume_changes(missing, identity()) == [
        "data content: not in the checkpoint -> 'a.jsonl: 0123456789abcdef'"]


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / ji.STATE_FILE
    next_step = {"step": 2, "consumed_samples": 16, "fingerprint": 2**63 - 5}
    path.write_text(ji.state_json(identity(), iteration=2, next_step=next_step))
    state = ji.read_state(path)
    assert state["job"] == identity().summaries and state["next_step"] == next_step and state["iteration"] == 2
    assert ji.read_state(tmp_path / "absent.json") is None
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        ji.read_state(path)
    path.write_text(json.dumps({"format": 99, "job": {}}))
    with pytest.raises(ValueError, match="is not a dp-schedule state file of format 1"):
        ji.read_state(path)


def _reference_checksum(path: Path) -> str:
    return hashlib.blake2b(path.stat().st_size.to_bytes(8, "little") + path.read_bytes(), digest_size=8).hexdigest()


def test_checksums_cover_every_byte_of_any_size(tmp_path: Path) -> None:
    """No sampled blocks: a change anywhere (an old unsampled byte, the last block, the last byte) is seen."""
    small, other = tmp_path / "small.jsonl", tmp_path / "other.jsonl"
    small.write_bytes(b"[1, 2, 3]\n[4, 5, 6]\n")
    other.write_bytes(b"[4, 5, 6]\n[1, 2, 3]\n")  # the same rows in another order: same size
    assert ji.file_checksum(small) != ji.file_checksum(other)
    assert ji.file_checksum(small) == _reference_checksum(small)
    large = tmp_path / "large.bin"  # over 64 MiB, which the old checksum sampled by 64 blocks of 64 KiB
    size = (65 << 20) + 5
    with open(large, "wb") as out:
        out.truncate(size)
    old_blocks = [(size - (64 << 10)) * block // 63 for block in range(64)]
    between = old_blocks[1] - 4096
    assert not any(start <= between < start + (64 << 10) for start in old_blocks)
    seen = {ji.file_checksum(large)}
    for position in (between, size - 30_000, size - 1):  # between the old blocks, in the last block, the last byte
        with open(large, "r+b") as out:
            os.pwrite(out.fileno(), b"\x01", position)
        assert ji.file_checksum(large) == _reference_checksum(large)
        seen.add(ji.file_checksum(large))
        with open(large, "r+b") as out:
            os.pwrite(out.fileno(), b"\x00", position)
    assert len(seen) == 4


def test_the_checksum_of_an_indexed_file_is_the_one_its_index_recorded(tmp_path: Path) -> None:
    """The indexing pass folds every byte into the checksum it stores: the job identity reads that, no pass of
    its own, and only while the index is fresh."""
    from megatron_dpsched.data.line_index import index_path, open_index

    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"[1, 2, 3]\n\n[4, 5, 6]\n")
    index = open_index(path, kind="test", measure=lambda line, number: (2,))
    assert index.checksum == _reference_checksum(path) == ji.file_checksum(path)
    with np.load(index_path(path)) as stored:
        kept = {name: stored[name] for name in stored.files}
    with open(index_path(path), "wb") as out:
        np.savez(out, **{**kept, "checksum": np.array("recorded")})
    assert ji.file_checksum(path) == "recorded"  # taken from the index, not read
    path.write_bytes(b"[1, 2, 3]\n\n[4, 5, 7]\n")  # same size, another mtime: the index is stale
    assert ji.file_checksum(path) == _reference_checksum(path)


def test_the_state_file_refuses_binary_huge_and_deeply_nested_content_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / ji.STATE_FILE
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ValueError, match=r"^dp-schedule: .*dp_schedule_state.json is not text \(byte 0 is not "
                                         r"UTF-8\): not a dp-schedule state file$"):
        ji.read_state(path)
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=r"^dp-schedule: .* is nested too deeply: not a dp-schedule state file$"):
        ji.read_state(path)
    with open(path, "wb") as out:
        out.truncate(ji.MAX_STATE_BYTES + 1)
    with pytest.raises(ValueError, match="is larger than 16 MiB: not a dp-schedule state file"):
        ji.read_state(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ValueError, match="cannot be read"):
        ji.read_state(path)


def test_paths_are_resolved_so_a_relative_and_an_absolute_name_agree(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.jsonl").write_text("[1, 2]\n")
    for name in ("b.bin", "b.idx"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    relative = ji.resolved_words(["0.3", "a.jsonl", "0.7", "b"])
    absolute = ji.resolved_words(["0.3", str(tmp_path / "a.jsonl"), "0.7", str(tmp_path / "b")])
    assert relative == absolute == ["0.3", str(tmp_path.resolve() / "a.jsonl"), "0.7", str(tmp_path.resolve() / "b")]
    assert ji.resolved_words("99,1,0") == "99,1,0" and ji.resolved_words(None) is None
    assert ji.data_files(["a.jsonl"]) == ji.data_files([str(tmp_path / "a.jsonl")])
    files = ji.data_files(["a.jsonl", "b"])
    assert ji.sizes_summary(files) == "7 bytes, 0 bytes, 0 bytes"  # no paths: only sizes can differ here
    assert ji.content_summary(files).count(", ") == 2 and "/" not in ji.content_summary(files)


def test_only_the_field_that_differs_is_named() -> None:
    """Another file of the same size and content (copied elsewhere) differs in its path alone."""
    held = [identity(), identity(DATA_PATHS="data_path=['/elsewhere/a.jsonl']")]
    message = ji.job_disagreement_message(held)
    assert message.startswith("dp-schedule: the ranks of this job disagree on data paths (data paths: ranks 0 "
                              "have \"data_path=['a.jsonl']\"; ranks 1 have \"data_path=['/elsewhere/a.jsonl']\")")
    assert "data sizes" not in message and "data content" not in message


def test_data_files_are_files_and_indexed_prefixes_not_weights(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("[1, 2]\n")
    for name in ("b.bin", "b.idx", "b_mask.bin", "b_mask.idx"):
        (tmp_path / name).write_bytes(b"")
    found = ji.data_files(["0.3", str(tmp_path / "a.jsonl"), "0.7", str(tmp_path / "b"), str(tmp_path / "none")])
    assert found == [str(tmp_path.resolve() / n) for n in ("a.jsonl", "b.bin", "b.idx", "b_mask.bin", "b_mask.idx")]


def test_rank_ranges() -> None:
    assert ji.rank_ranges([0, 1, 2, 5]) == "0-2,5"
    assert ji.rank_ranges([3]) == "3"
    assert ji.rank_ranges([0, 2, 3, 4, 7, 8]) == "0,2-4,7-8"
