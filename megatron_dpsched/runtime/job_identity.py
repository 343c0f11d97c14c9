"""What a job is, as a few named fields every rank must share and a checkpoint remembers (standard library; the
stored checksum of a length index is read through :mod:`megatron_dpsched.data.line_index`, numpy).

A :class:`JobIdentity` is an ordered tuple of ``(field, summary)`` pairs: ``--dp-schedule`` on or off, the
``--dp-schedule-*`` options, the planner config, and the data's identity (the data flags with every path
resolved, the sizes of the files they name, a checksum of each file's content; sizes and checksums are listed
in the order of the files, without their paths, so a field differs only where its own values do). Each
summary is readable text; its 63-bit :func:`digest63` is what ranks exchange. Before the model is built every
rank all-reduces the vector of field digests (``megatron_dpsched.megatron.job_checks``), so a mismatch names
the field; only then are the summaries gathered, for the message (:func:`job_disagreement_message`). A
checkpoint stores the identity (:func:`state_json`), and a resume compares it with the job's own
(:func:`resume_changes`).

Content, twice:

* at start-up, :func:`file_checksum` of every data file: every byte and the size, taken from the file's
  length index where one is fresh (the indexing pass computes it while it reads each row: no extra pass),
  else read once;
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

MAX_STATE_BYTES = 16 << 20
"""A state file larger than this is not one :func:`state_json` wrote (it holds a few short summaries)."""
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
    """A sidecar written by :func:`state_json`, or ``None`` when there is none; ``ValueError`` (one line) if it
    cannot be read as one: not UTF-8 text, too large, not JSON, nested too deep, or another shape."""
    try:
        if os.path.getsize(path) > MAX_STATE_BYTES:
            raise ValueError(f"dp-schedule: {path} is larger than {MAX_STATE_BYTES >> 20} MiB: not a dp-schedule "
                             f"state file")
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as error:
        raise ValueError(f"dp-schedule: {path} is not text (byte {error.start} is not UTF-8): not a dp-schedule "
                         f"state file") from None
    except OSError as error:
        raise ValueError(f"dp-schedule: {path} cannot be read ({error.strerror})") from None
    try:
        state = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"dp-schedule: {path} is not valid JSON ({error})") from None
    except RecursionError:
        raise ValueError(f"dp-schedule: {path} is nested too deeply: not a dp-schedule state file") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or not isinstance(state.get("job"), dict):
        raise ValueError(f"dp-schedule: {path} is not a dp-schedule state file of format {STATE_FORMAT}")
    return state


def data_files(values: Iterable[str]) -> list[str]:
    """The files that data flag values name, resolved: an existing file as it is, an indexed-dataset prefix as
    its ``.bin``/``.idx`` (and a ``_mask`` sidecar's); weights and other words name nothing."""
    files: list[str] = []
    for value in values:
        if os.path.isfile(value):
            files.append(os.path.realpath(value))
            continue
        for prefix in (value, value + "_mask"):
            files.extend(os.path.realpath(prefix + suffix) for suffix in (".bin", ".idx")
                         if os.path.isfile(prefix + suffix))
    return files


def resolved_words(value: object) -> object:
    """A data flag's value with every word that names a file or an indexed prefix resolved (absolute, links
    followed), so the same data named relatively on one rank and absolutely on another is one value."""
    if isinstance(value, (list, tuple)):
        return [resolved_words(word) for word in value]
    if isinstance(value, str) and data_files([value]):
        return os.path.realpath(value)
    return value


def sizes_summary(files: Sequence[str]) -> str:
    """The data sizes field: each file's size, in the order of ``files`` (their paths are the data paths')."""
    return ", ".join(f"{os.path.getsize(path)} bytes" for path in files) or "-"


def content_summary(files: Sequence[str]) -> str:
    """The data content field: :func:`file_checksum` of each file, in the order of ``files``."""
    return ", ".join(file_checksum(path) for path in files) or "-"


def file_checksum(path: str | Path) -> str:
    """A 64-bit blake2b of the file's size and every byte: the one its fresh length index recorded while
    indexing it (:func:`megatron_dpsched.data.line_index.stored_checksum`), else read here."""
    from megatron_dpsched.data.line_index import file_digest, stored_checksum

    stored = stored_checksum(path)
    if stored is not None:
        return stored
    digest = file_digest(os.path.getsize(path))
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
