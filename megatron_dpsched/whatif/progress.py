"""A minimal progress bar on stderr (no dependency): ``label [#####     ] 52% 520/1000``."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts work done and redraws one line at most every ``interval`` seconds; silent when disabled."""

    def __init__(self, label: str, total: int, *, enabled: bool, stream: TextIO | None = None,
                 interval: float = 0.1) -> None:
        self.label, self.total, self.enabled = label, max(1, total), enabled and total > 0
        self.stream = sys.stderr if stream is None else stream
        self.interval, self.done, self._drawn = interval, 0, 0.0

    def update(self, count: int = 1) -> None:
        """Add ``count`` units of work; redraw if the last drawing is old enough."""
        self.done = min(self.total, self.done + count)
        now = time.monotonic()
        if self.enabled and (now - self._drawn >= self.interval or self.done == self.total):
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        width = 30
        filled = width * self.done // self.total
        percent = 100 * self.done // self.total
        self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (width - filled)}] {percent:3d}% "
                          f"{self.done}/{self.total}")
        self.stream.flush()

    def close(self) -> None:
        """Finish the line (the bar stays visible, the next output starts on a new line)."""
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
