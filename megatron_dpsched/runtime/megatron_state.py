"""The one reader of Megatron's private state: its global arguments and timers, and a checkpoint's saved arguments.

Megatron's ``get_args()`` and ``get_timers()`` assert when Megatron has not set them (a custom training loop,
a unit of the plugin used on its own), and it has no public reader of the arguments a checkpoint was saved
with. The plugin reads them here and nowhere else (a unit test checks it), so a Megatron release that renames
them changes this module only. :func:`megatron_args` and :func:`megatron_timers` never import Megatron: they
look at Megatron's module only where a process has loaded it (where it has not, Megatron has set nothing),
so that importing or calling them loads no torch.
"""

from __future__ import annotations

import os
import sys
from typing import Any

GLOBAL_VARS = "megatron.training.global_vars"
"""The Megatron module holding the global arguments and timers."""


def megatron_args() -> Any | None:
    """Megatron's global arguments (what ``get_args()`` returns), ``None`` where Megatron has not set them."""
    return getattr(sys.modules.get(GLOBAL_VARS), "_GLOBAL_ARGS", None)


def megatron_timers() -> Any | None:
    """Megatron's global timers (what ``get_timers()`` returns), ``None`` where Megatron has not set them."""
    return getattr(sys.modules.get(GLOBAL_VARS), "_GLOBAL_TIMERS", None)


def checkpoint_saved_args(args: Any) -> Any | None:
    """The arguments the ``--load`` checkpoint (``args.load``) was saved with, read by Megatron's own reader of
    the rank-0 state (the common part of a ``torch_dist`` checkpoint); ``None`` without a readable one.
    Imports Megatron's checkpointing (and torch)."""
    from megatron.training import checkpointing

    if not os.path.isfile(checkpointing.get_checkpoint_tracker_filename(args.load)):
        return None
    try:
        state_dict = checkpointing._load_base_checkpoint(args.load, args, rank0=True)[0]
    except (OSError, RuntimeError, KeyError, ValueError):  # Megatron's load reports an unreadable checkpoint
        return None
    return (state_dict or {}).get("args")
