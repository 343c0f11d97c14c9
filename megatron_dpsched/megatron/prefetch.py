"""Preparing the next step off the training thread (``--dp-schedule-prefetch on``).

A :class:`StepPrefetcher` runs one job at a time in one background thread: the feed's
``prepare`` (plan the next step, load and collate its micro-batches). The training thread
takes the result when it begins that step, and the next job starts then, so at most one
step is prepared ahead of the one training. A job never raises in the thread: what went
wrong is kept in the :class:`PreparedStep` and raised on the training thread when the
step (planning errors, ``StopIteration``) or its micro-batch (loading, collation, the length
check) is due, exactly where it would be raised without prefetching. :meth:`close` (also at
interpreter exit) waits for the job in progress, at most one step's preparation, so a job
never hangs at exit and leaves no thread behind.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class PreparedStep:
    """One step prepared ahead: its batches, collated micro-batches, and what failed."""

    batches: Any = None
    """The step's :class:`~megatron_dpsched.megatron.feeds.StepBatches` (``None`` if planning failed)."""
    micro_batches: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Collated micro-batches by index, up to the first that failed."""
    error: BaseException | None = None
    """Planning failed (``StopIteration`` at the end of the data) or, with ``failed_at``, that micro-batch."""
    failed_at: int | None = None
    """Index of the micro-batch whose loading or collation raised ``error``."""
    seconds: float = 0.0
    """Wall time the background thread spent preparing the step."""


_open: weakref.WeakSet[StepPrefetcher] = weakref.WeakSet()


class StepPrefetcher:
    """Runs ``prepare`` one step ahead in one background thread."""

    def __init__(self, prepare: Callable[[], PreparedStep], *, name: str = "dp-schedule-prefetch") -> None:
        self._prepare = prepare
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._future: Future[PreparedStep] | None = None
        _open.add(self)

    def start(self) -> None:
        """Start preparing the next step (a no-op while one is prepared or in progress)."""
        if self._future is None and self._executor is not None:
            self._future = self._executor.submit(self._prepare)

    def take(self) -> PreparedStep:
        """The prepared step (waits for it); the one after starts preparing at once unless the data ended."""
        if self._future is None:
            self.start()
        assert self._future is not None, "take() after close()"
        prepared = self._future.result()
        self._future = None
        if not isinstance(prepared.error, StopIteration) or prepared.failed_at is not None:
            self.start()
        return prepared

    def close(self) -> None:
        """Drop what is prepared and stop the thread (waits for a job in progress)."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


@atexit.register
def _close_all() -> None:
    for prefetcher in list(_open):
        prefetcher.close()
