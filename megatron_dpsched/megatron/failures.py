"""One line per failure: what the plugin refuses reaches the user as one line, not a traceback per rank.

A training script wraps its body::

    from megatron_dpsched.megatron.failures import one_line_errors

    with one_line_errors():
        args = parse_and_validate_args(extra_args_provider=add_dp_schedule_args)
        setup_dp_schedule(args)
        pretrain(...)

A ``ValueError`` raised by the plugin's own code (the innermost frame of its traceback is in
``megatron_dpsched``, or in a file the caller names: a bad row, a plan disagreement, too little data, a bad
flag) then prints ``dp-schedule: rank R step S: <message>`` on stderr (``step`` once Megatron's ``train()``
has started) and ends the process with exit code :data:`EXIT_CODE`, without running exit handlers (a
process group whose peers wait in a collective cannot be torn down cleanly). Everything else (Megatron's own
errors, bugs) propagates unchanged, traceback included; so does every error with ``DPSCHED_DEBUG=1``.

Under ``torchrun`` the line is reported once per job (:func:`~megatron_dpsched.runtime.ranks.report_failure`):
every rank writes it to its ``TORCHELASTIC_ERROR_FILE``, so torchrun's failure summary shows it as the root cause
instead of "To enable traceback see ..."; rank 0 prints at once, another rank waits a few seconds first (torchrun
stops it when rank 0 failed too, so the job prints one line; a failure on one rank alone is printed by that rank
after the wait). torchrun itself still ends with its own ``ChildFailedError`` traceback (it raises one whenever a
child exits non-zero).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import megatron_dpsched
from megatron_dpsched.runtime.megatron_state import megatron_args
from megatron_dpsched.runtime.ranks import global_rank, report_failure

DEBUG_ENV = "DPSCHED_DEBUG"
"""Set to 1 to get the traceback instead of the one line."""
EXIT_CODE = 2
"""Exit code of a refused run (a user or data error), as for a bad command-line flag."""
PREFIX = "dp-schedule: "
PACKAGE = Path(megatron_dpsched.__file__).resolve().parent


PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")
"""What a gloo collective raises on a rank whose peer exited (e.g. after printing its one line)."""
FOLLOW_ON_WAIT_S = 30.0
"""Seconds a rank whose peer exited waits for torchrun to stop it (silently) before it prints a line itself."""
STRAGGLER_TRACEBACK = "['Traceback (most recent call last):"
"""Megatron's ``StragglerDetector`` logs a warning with the traceback of every error that leaves a timed forward
step; :func:`one_line_errors` drops those records (the error is reported once, by it or by Python)."""


@contextlib.contextmanager
def one_line_errors(*, also_from: Sequence[str | Path] = ()) -> Iterator[None]:
    """Turn the plugin's ``ValueError`` into one line and exit code :data:`EXIT_CODE` (see the module doc);
    ``also_from``: more source files whose errors count as the plugin's (e.g. the training script). A rank
    whose collective fails because a peer exited waits for torchrun to stop it instead of printing a
    traceback."""
    quiet = _DropLoggedTracebacks()
    logger = logging.getLogger("megatron.core.utils")
    if not debug_requested():
        logger.addFilter(quiet)
    try:
        yield
    except ValueError as error:
        if debug_requested() or not raised_by(error, [PACKAGE, *also_from]):
            raise
        exit_with_line(error)
    except RuntimeError as error:
        if debug_requested() or not any(text in str(error) for text in PEER_LOST):
            raise
        time.sleep(FOLLOW_ON_WAIT_S)  # torchrun stops this rank once it sees the failed one
        exit_with_line(RuntimeError(f"stopped: another rank exited ({one_line(error)[:200]})"))
    finally:
        logger.removeFilter(quiet)


class _DropLoggedTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return STRAGGLER_TRACEBACK not in record.getMessage()


def debug_requested() -> bool:
    """``DPSCHED_DEBUG`` is set (and not 0): show tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def raised_by(error: BaseException, sources: Sequence[str | Path]) -> bool:
    """Whether the innermost frame of ``error``'s traceback is in one of ``sources`` (files or folders)."""
    frame = _innermost(error.__traceback__)
    if frame is None:
        return False
    where = Path(frame.tb_frame.f_code.co_filename).resolve()
    roots = [Path(source).resolve() for source in sources]
    return any(where == root or root in where.parents for root in roots)


def _innermost(trace: TracebackType | None) -> TracebackType | None:
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return trace


def failure_line(error: BaseException, *, rank: int | None, step: int | None) -> str:
    """``dp-schedule: rank R step S: message`` on one line (the message's own ``dp-schedule:`` dropped)."""
    text = one_line(error)
    text = text[len(PREFIX):] if text.startswith(PREFIX) else text
    where = " ".join(part for part in (f"rank {rank}" if rank is not None else "",
                                       f"step {step}" if step is not None else "") if part)
    return f"{PREFIX}{where}: {text}" if where else f"{PREFIX}{text}"


def one_line(error: BaseException) -> str:
    """The error's message with every run of whitespace (newlines too) made one space."""
    return " ".join(str(error).split())


def exit_with_line(error: BaseException, *, prefix: str | None = None) -> None:
    """Report :func:`failure_line` (or ``prefix`` and the message) once per job
    (:func:`~megatron_dpsched.runtime.ranks.report_failure`: recorded for torchrun, printed by rank 0 at once and by
    another rank only if it is still running after a few seconds) and end the process with
    :data:`EXIT_CODE`."""
    line = failure_line(error, rank=global_rank(), step=_step()) if prefix is None else prefix + one_line(error)
    report_failure(line, same_on_every_rank=False)
    os._exit(EXIT_CODE)


def _step() -> int | None:
    """The training iteration Megatron's ``train()`` is in, ``None`` before it started."""
    step = getattr(megatron_args(), "curr_iteration", None)
    return step if isinstance(step, int) else None
