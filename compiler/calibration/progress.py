"""A tiny progress bar with an ETA, on stderr.

On a terminal it redraws one line with carriage returns, at most ``1 / min_interval``
times a second; elsewhere (a log file, CI) it prints a plain line at each quarter. The
ETA is ``elapsed / done * (total - done)``. It only ever writes to its stream, so the
compiler's output files are unaffected.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 24


def _clock_text(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """Progress of ``total`` steps, used as ``with Progress(n, "calibrating") as bar: bar.step()``.

    Args:
        total: Number of steps expected.
        label: What is being done, printed first.
        stream: Where to write (default: ``sys.stderr`` at entry).
        enabled: False prints nothing (``--quiet``).
        min_interval: Least seconds between two redraws on a terminal.
        lines: Plain lines printed over the run when the stream is not a terminal.
        clock: Seconds counter (injectable for tests).
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        min_interval: float = 0.1,
        lines: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.done = 0
        self._stream = stream
        self._enabled = enabled
        self._min_interval = min_interval
        self._lines = max(1, lines)
        self._clock = clock
        self._start = self._last = 0.0
        self._tty = False
        self._printed = 0  # plain lines written so far

    def __enter__(self) -> Progress:
        if self._stream is None:
            self._stream = sys.stderr
        isatty = getattr(self._stream, "isatty", None)
        self._tty = bool(isatty()) if callable(isatty) else False
        self._start = self._clock()
        self._last = -float("inf")
        if self._tty:
            self._draw(self._start)
        return self

    def step(self, n: int = 1) -> None:
        """Record ``n`` more steps done and redraw when due."""
        self.done = min(self.total, self.done + n) if self.total else self.done + n
        now = self._clock()
        if self._tty:
            if now - self._last >= self._min_interval or self.done >= self.total:
                self._draw(now)
        elif self.total:
            due = self.done * self._lines // self.total
            if due > self._printed:
                self._printed = due
                self._write(self._text(now) + "\n")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._tty:
            self._draw(self._clock())
            self._write("\n")
        elif self.total == 0 or (self._printed == 0 and self.done):
            self._write(self._text(self._clock()) + "\n")

    def _text(self, now: float) -> str:
        elapsed = now - self._start
        if not self.total:
            return f"{self.label}: {self.done} done, {_clock_text(elapsed)} elapsed"
        pct = 100 * self.done // self.total
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        tail = f"ETA {_clock_text(eta)}" if eta is not None else "ETA --:--"
        if self._tty:
            fill = _WIDTH * self.done // self.total
            bar = "#" * fill + "." * (_WIDTH - fill)
            return f"{self.label} [{bar}] {self.done}/{self.total} {pct:3d}% {_clock_text(elapsed)} {tail}"
        return f"{self.label}: {self.done}/{self.total} ({pct}%), {_clock_text(elapsed)} elapsed, {tail}"

    def _draw(self, now: float) -> None:
        self._last = now
        self._write("\r" + self._text(now) + "\x1b[K")

    def _write(self, text: str) -> None:
        if self._enabled and self._stream is not None:
            self._stream.write(text)
            self._stream.flush()
