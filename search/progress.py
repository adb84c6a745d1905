"""Progress of a run: a live bar on a terminal, one line per finished trial everywhere."""
from __future__ import annotations

import shutil
import sys
from typing import TextIO


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


class Progress:
    """``[#####.....] 5/12  best 21,123 samples/s (#7)  trial #8 running 3.2 s``"""

    def __init__(self, total: int, done: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.total, self.done = total, done
        self.stream = stream or sys.stderr
        self.width = width
        self.live = self.stream.isatty()
        self.best: tuple[str, int] | None = None  # ("12,345 samples/s", trial number)
        self.current: int | None = None

    def _bar(self, elapsed: float | None) -> str:
        filled = int(self.width * self.done / max(1, self.total))
        text = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}"
        if self.best:
            text += f"  best {self.best[0]} (#{self.best[1]})"
        if self.current is not None and elapsed is not None:
            text += f"  trial #{self.current} running {elapsed:.0f} s"
        columns = shutil.get_terminal_size((100, 20)).columns
        return text[: columns - 1]

    def _draw(self, elapsed: float | None = None) -> None:
        if self.live:
            self.stream.write("\r\033[K" + self._bar(elapsed))
            self.stream.flush()

    def started(self, number: int) -> None:
        self.current = number
        self._draw(0.0)

    def tick(self, elapsed: float) -> None:
        self._draw(elapsed)

    def finished(self, line: str) -> None:
        self.done += 1
        self.current = None
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        self._draw()
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
