"""Which process this is, for messages printed once per job (no collective, safe before the process group), and
how a failure that ends the process reaches the user once per job (:func:`report_failure`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""torchrun's per-rank error file: its failure summary prints the message a failed rank wrote there."""
OTHER_RANKS_DELAY_S = 3.0
"""Seconds a rank other than 0 waits before it reports a failure (torchrun stops it first when rank 0 failed too)."""


def global_rank() -> int | None:
    """The global rank: the process group's once it exists, else torchrun's ``RANK``; ``None`` outside a job."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def print_rank_0(message: str) -> None:
    """Print ``message`` on global rank 0 (or outside a job)."""
    if global_rank() in (None, 0):
        print(message, flush=True)


def report_failure(line: str, *, same_on_every_rank: bool) -> None:
    """Report ``line``, the failure that is about to end this process, once per job: rank 0 (or a process outside
    a job) records it in torchrun's error file (:data:`ERROR_FILE_ENV`, whose summary then names it as the root
    cause) and prints it on stderr at once. Another rank waits :data:`OTHER_RANKS_DELAY_S` first (torchrun stops
    it when rank 0 has failed too; having written nothing, it cannot become the summary's first failure), then
    records it and prints it, unless ``same_on_every_rank`` (a failure of the command line, which every rank has:
    rank 0 printed it; the record still names it in the summary of a node without rank 0)."""
    if global_rank():
        time.sleep(OTHER_RANKS_DELAY_S)
    write_error_file(line)
    if global_rank() and same_on_every_rank:
        return
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


def write_error_file(line: str) -> None:
    """``line`` as torchrun's error record of this rank (its summary prints ``py_callstack`` as the traceback)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"message": {"message": line, "extraInfo": {
            "py_callstack": line, "timestamp": str(int(time.time()))}}}))
