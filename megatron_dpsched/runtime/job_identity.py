"""What a job is, as a few named fields every rank must share and a checkpoint remembers (standard library only).

A :class:`JobIdentity` is an ordered tuple of ``(field, summary)`` pairs: ``--dp-schedule`` on or off, the
``--dp-schedule-*`` options, the planner config, and the data's identity (the data flags, the sizes of the
files they name, a checksum of each file's content). Each summary is readable text; its 63-bit
:func:`digest63` is what ranks exchange. Before the model is built every rank all-reduces the vector of
field digests (``megatron_dpsched.megatron.job_checks``), so a mismatch names the field; only then are the
summaries gathered, for the message (:func:`job_disagreement_message`). A checkpoint stores the identity
(:func:`state_json`), and a resume compares it with the job's own (:func:`resume_changes`).

Content, twice:

* at start-up, :func:`file_checksum` of every data file (whole files up to :data:`WHOLE_FILE_BYTES`,
  else :data:`CHECKSUM_BLOCKS` evenly spaced blocks plus the size);
* every step, the feeds fold a digest of every sample's token ids into the step's fingerprint
  (:func:`fold_digests`), so two ranks that read the same lengths with other content disagree there.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the fields' labels: the text of messages and of the checkpoints' state files (which a resume compares)
ENABLED_FIELD = "--dp-schedule"
OPTIONS_FIELD = "dp-schedule options"
RUN_TIME_OPTIONS_FIELD = "dp-schedule run-time options"
PLANNER_FIELD = "planner config"
DATA_PATHS_FIELD = "data paths"
DATA_SIZES_FIELD = "data sizes"
DATA_CONTENT_FIELD = "data content"
FIELDS = (ENABLED_FIELD, OPTIONS_FIELD, RUN_TIME_OPTIONS_FIELD, PLANNER_FIELD, DATA_PATHS_FIELD, DATA_SIZES_FIELD,
          DATA_CONTENT_FIELD)
"""Every field of a job identity, in exchange order."""
RESUME_IGNORED = frozenset({RUN_TIME_OPTIONS_FIELD})
"""Fields a resume may change freely: they change how a step runs, not what it trains."""
STATE_FILE = "dp_schedule_state.json"
"""The checkpoint sidecar (in the iteration folder) holding the job identity and the next step's fingerprint."""
STATE_FORMAT = 1

WHOLE_FILE_BYTES = 64 << 20
"""Data files up to this size are hashed whole; larger ones by :data:`CHECKSUM_BLOCKS` blocks."""
CHECKSUM_BLOCK = 64 << 10
CHECKSUM_BLOCKS = 64
SUMMARY_CHARS = 300
"""Summaries longer than this are cut in messages (the digest still covers all of it)."""


def digest63(text: str) -> int:
    """A 63-bit hash of ``text`` (non-negative, so ``-digest`` fits a signed 64-bit integer)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def fold_digests(seed: int, digests: Sequence[int]) -> int:
    """``seed`` (a 63-bit fingerprint) mixed with ``digests`` (64-bit), order-sensitive, as a 63-bit integer."""
    digest = hashlib.blake2b(seed.to_bytes(8, "little"), digest_size=8)
    digest.update(array("Q", digests).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1


@dataclass(frozen=True, kw_only=True)
class JobIdentity:
    """The fields a job's ranks must agree on, each as readable text."""

    fields: tuple[tuple[str, str], ...]
    """``(field, summary)`` pairs, in :data:`FIELDS` order."""

    def __post_init__(self) -> None:
        assert tuple(name for name, _ in self.fields) == FIELDS, "a job identity holds every field, in order"

    @property
    def summaries(self) -> dict[str, str]:
        """Field -> summary."""
        return dict(self.fields)

    def digests(self) -> list[int]:
        """One :func:`digest63` per field, in :data:`FIELDS` order."""
        return [digest63(summary) for _, summary in self.fields]


def mismatched_fields(highest: Sequence[int], lowest: Sequence[int]) -> list[str]:
    """The fields whose digests differ across ranks, from the MAX and MIN of each over the job."""
    assert len(highest) == len(lowest) == len(FIELDS)
    return [name for name, high, low in zip(FIELDS, highest, lowest) if high != low]


def job_disagreement_message(held: Sequence[JobIdentity]) -> str:
    """One line naming each field the ranks (``held[rank]``) disagree on, and which ranks hold what."""
    differing = [name for name in FIELDS if len({identity.summaries[name] for identity in held}) > 1]
    assert differing, "the ranks disagree on some field"
    # where --dp-schedule is off, its options and planner read '-': the flag is named, not its consequences
    follow = {OPTIONS_FIELD, RUN_TIME_OPTIONS_FIELD, PLANNER_FIELD} if ENABLED_FIELD in differing else set()
    parts = []
    for name in (name for name in differing if name not in follow):
        ranks: dict[str, list[int]] = defaultdict(list)
        for rank, identity in enumerate(held):
            ranks[identity.summaries[name]].append(rank)
        groups = sorted(ranks.items(), key=lambda item: item[1][0])
        parts.append(f"{name}: " + "; ".join(f"ranks {rank_ranges(members)} have {_cut(summary)!r}"
                                             for summary, members in groups))
    return (f"dp-schedule: the ranks of this job disagree on {', '.join(differing)} ({' | '.join(parts)}); "
            "every rank must run with the same --dp-schedule flags and the same data. Nothing was built or trained.")


def resume_changes(saved: Mapping[str, str], now: JobIdentity) -> list[str]:
    """What differs between a checkpoint's job fields (``saved``: field -> summary) and this job's, one entry
    per field (``"data paths: 'a' -> 'b'"``); fields in :data:`RESUME_IGNORED` do not count."""
    changes = []
    for name, summary in now.fields:
        if name in RESUME_IGNORED:
            continue
        before = saved.get(name)
        if before is None:
            changes.append(f"{name}: not in the checkpoint -> {_cut(summary)!r}")
        elif before != summary:
            changes.append(f"{name}: {_cut(before)!r} -> {_cut(summary)!r}")
    return changes


def state_json(identity: JobIdentity, *, iteration: int, next_step: Mapping[str, int] | None) -> str:
    """The checkpoint sidecar's text: the job identity and ``next_step`` (``step``, ``consumed_samples``,
    ``fingerprint`` of the plan the next iteration trains, or ``None``)."""
    return json.dumps({"format": STATE_FORMAT, "iteration": iteration, "job": dict(identity.fields),
                       "next_step": None if next_step is None else dict(next_step)}, indent=1)


def read_state(path: str | Path) -> dict[str, Any] | None:
    """A sidecar written by :func:`state_json`, or ``None`` when there is none; ``ValueError`` if unreadable."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        state = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"dp-schedule: {path} is not valid JSON ({error})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or not isinstance(state.get("job"), dict):
        raise ValueError(f"dp-schedule: {path} is not a dp-schedule state file of format {STATE_FORMAT}")
    return state


def data_files(values: Iterable[str]) -> list[str]:
    """The files that data flag values name: an existing file as it is, an indexed-dataset prefix as its
    ``.bin``/``.idx`` (and a ``_mask`` sidecar's); weights and other words name nothing."""
    files: list[str] = []
    for value in values:
        if os.path.isfile(value):
            files.append(value)
            continue
        for prefix in (value, value + "_mask"):
            files.extend(prefix + suffix for suffix in (".bin", ".idx") if os.path.isfile(prefix + suffix))
    return files


def file_checksum(path: str | Path) -> str:
    """A 64-bit blake2b of the file's size and content (whole up to :data:`WHOLE_FILE_BYTES`, else
    :data:`CHECKSUM_BLOCKS` evenly spaced blocks of :data:`CHECKSUM_BLOCK` bytes, first and last included)."""
    size = os.path.getsize(path)
    digest = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=8)
    with open(path, "rb") as handle:
        if size <= WHOLE_FILE_BYTES:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            return digest.hexdigest()
        for block in range(CHECKSUM_BLOCKS):
            digest.update(os.pread(handle.fileno(), CHECKSUM_BLOCK,
                                   (size - CHECKSUM_BLOCK) * block // (CHECKSUM_BLOCKS - 1)))
    return f"{digest.hexdigest()} (sampled)"


def rank_ranges(members: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    start = previous = members[0]
    for rank in [*members[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        out.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ",".join(out)


def _cut(summary: str) -> str:
    return summary if len(summary) <= SUMMARY_CHARS else summary[:SUMMARY_CHARS - 3] + "..."
