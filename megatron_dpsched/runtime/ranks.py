"""Which process this is, for messages printed once per job (no collective, safe before the process group)."""

from __future__ import annotations

import os
import sys


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
