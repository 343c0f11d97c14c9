"""Quiet mode: a job's standard output without Megatron's argument dump and per-step noise.

Megatron prints ~850 lines of arguments, its start-up steps and timers, and one line per logged step; a run with
``--quiet`` (the GPT entry point, ``examples/rl_controller.py``) or ``DPSCHED_QUIET=1`` (any script whose
``extra_args_provider`` is ``add_dp_schedule_args``, or that calls :func:`install`) keeps, on standard output:

* the plugin's own lines (``dp-schedule...``), but for the per-step plan lines (``dp-schedule step S: ...``);
* warnings and errors (lines naming ``warning`` or ``error``; standard error is never filtered);
* where checkpoints were saved and loaded (Megatron's ``successfully saved`` / ``successfully loaded``);
* the final summary: Megatron's log line of the last training step (``iteration N/ N``) and its
  ``after training is done`` line;
* the lines that begin with one of the script's own prefixes (``keep``).

Everything else on standard output is dropped. :func:`install` sets :data:`QUIET_ENV` too, so processes the job
starts (spawned trainers) are quiet as well once they call :func:`install_if_requested`.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Sequence
from typing import TextIO

QUIET_ENV = "DPSCHED_QUIET"
"""Set to 1 to run quiet (inherited by the processes a job starts)."""
QUIET_FLAG = "--quiet"
"""The command-line flag of the entry point and the RL example."""
KEPT_PREFIXES = ("dp-schedule",)
"""The plugin's lines."""
PER_STEP = re.compile(r"^dp-schedule step \d+:")
"""The plugin's per-step plan line (dropped)."""
KEPT_WORDS = re.compile(r"warning|error|successfully (saved|loaded)|after training is done", re.IGNORECASE)
ARGUMENT_LINE = re.compile(r"^\S+ \.{3,} ")
"""A line of Megatron's argument dump (``name ...... value``; dropped even where the value names an error)."""
LAST_STEP = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
"""Megatron's step log line; kept for the last step (``N/ N``)."""


def kept(line: str, *, keep: Sequence[str] = ()) -> bool:
    """Whether quiet mode prints ``line`` (see the module doc)."""
    text = line.strip()
    if text.startswith(KEPT_PREFIXES):
        return not PER_STEP.match(text)
    if ARGUMENT_LINE.match(text):
        return False
    if text.startswith(tuple(keep)) or KEPT_WORDS.search(text):
        return True
    step = LAST_STEP.search(text)
    return step is not None and step.group(1) == step.group(2)


class QuietStream(io.TextIOBase):
    """A text stream that passes on the whole lines :func:`kept` keeps to ``target``."""

    def __init__(self, target: TextIO, *, keep: Sequence[str] = ()) -> None:
        self.target, self.keep, self._partial = target, tuple(keep), ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        shown = [line for line in lines if kept(line, keep=self.keep)]
        if shown:
            self.target.write("\n".join(shown) + "\n")
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def fileno(self) -> int:
        return self.target.fileno()

    def isatty(self) -> bool:
        return self.target.isatty()


def install(*, keep: Sequence[str] = ()) -> None:
    """Run this process quiet from now on (``sys.stdout`` filtered; idempotent) and set :data:`QUIET_ENV` for the
    processes it starts; ``keep``: prefixes of the script's own lines to keep."""
    os.environ[QUIET_ENV] = "1"
    if not isinstance(sys.stdout, QuietStream):
        sys.stdout = QuietStream(sys.stdout, keep=keep)


def install_if_requested(*, keep: Sequence[str] = ()) -> None:
    """:func:`install` where :data:`QUIET_ENV` asks for it (set and not 0)."""
    if os.environ.get(QUIET_ENV, "") not in ("", "0"):
        install(keep=keep)


def uninstall() -> None:
    """Print everything again (what was written of an unfinished line is dropped)."""
    os.environ.pop(QUIET_ENV, None)
    if isinstance(sys.stdout, QuietStream):
        sys.stdout = sys.stdout.target
