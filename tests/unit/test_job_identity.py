"""``megatron_dpsched.runtime.job_identity``: digests, which fields differ, the messages, checksums, the state file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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


def test_checksums_cover_small_files_whole_and_large_files_by_blocks(tmp_path: Path, monkeypatch) -> None:
    small, other = tmp_path / "small.jsonl", tmp_path / "other.jsonl"
    small.write_bytes(b"[1, 2, 3]\n[4, 5, 6]\n")
    other.write_bytes(b"[4, 5, 6]\n[1, 2, 3]\n")  # the same rows in another order: same size
    assert ji.file_checksum(small) != ji.file_checksum(other)
    assert ji.file_checksum(small) == hashlib.blake2b(
        small.stat().st_size.to_bytes(8, "little") + small.read_bytes(), digest_size=8).hexdigest()
    monkeypatch.setattr(ji, "WHOLE_FILE_BYTES", 64)
    monkeypatch.setattr(ji, "CHECKSUM_BLOCK", 4)
    monkeypatch.setattr(ji, "CHECKSUM_BLOCKS", 3)  # bytes 0-3, the middle 4 and the last 4 of 100
    large = tmp_path / "large.bin"
    data = bytearray(range(100))
    large.write_bytes(bytes(data))
    before = ji.file_checksum(large)
    assert before.endswith(" (sampled)")
    data[10] ^= 1  # outside the sampled blocks: unseen
    large.write_bytes(bytes(data))
    assert ji.file_checksum(large) == before
    data[48] ^= 1  # inside the middle block
    large.write_bytes(bytes(data))
    assert ji.file_checksum(large) != before


def test_data_files_are_files_and_indexed_prefixes_not_weights(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("[1, 2]\n")
    for name in ("b.bin", "b.idx", "b_mask.bin", "b_mask.idx"):
        (tmp_path / name).write_bytes(b"")
    found = ji.data_files(["0.3", str(tmp_path / "a.jsonl"), "0.7", str(tmp_path / "b"), str(tmp_path / "none")])
    assert found == [str(tmp_path / n) for n in ("a.jsonl", "b.bin", "b.idx", "b_mask.bin", "b_mask.idx")]


def test_rank_ranges() -> None:
    assert ji.rank_ranges([0, 1, 2, 5]) == "0-2,5"
    assert ji.rank_ranges([3]) == "3"
    assert ji.rank_ranges([0, 2, 3, 4, 7, 8]) == "0,2-4,7-8"
