"""Progress of a run: a live bar on a terminal, one line per finished trial everywhere."""
from __future__ import annotations

import shutil
import sys
import time
from typing import Callable, TextIO


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


class Progress:
    """``[#####.....] 5/12  best 21,123 samples/s (#7)  trial #8 running 3 s`` (several trials at
    once: ``trials #8, #9 running``)."""

    def __init__(self, total: int, done: int, stream: TextIO | None = None, width: int = 24,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.done = total, done
        self.stream = stream or sys.stderr
        self.width = width
        self.live = self.stream.isatty()
        self.best: tuple[str, int] | None = None  # ("12,345 samples/s", trial number)
        self.running: dict[int, float] = {}       # trial number -> when it started
        self.clock = clock

    def _bar(self) -> str:
        filled = int(self.width * self.done / max(1, self.total))
        text = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}"
        if self.best:
            text += f"  best {self.best[0]} (#{self.best[1]})"
        if len(self.running) == 1:
            number, since = next(iter(self.running.items()))
            text += f"  trial #{number} running {self.clock() - since:.0f} s"
        elif self.running:
            text += f"  trials {', '.join(f'#{n}' for n in sorted(self.running))} running"
        columns = shutil.get_terminal_size((100, 20)).columns
        return text[: columns - 1]

    def _draw(self) -> None:
        if self.live:
            self.stream.write("\r\033[K" + self._bar())
            self.stream.flush()

    def started(self, number: int) -> None:
        self.running[number] = self.clock()
        self._draw()

    def tick(self) -> None:
        self._draw()

    def finished(self, line: str, number: int | None = None) -> None:
        self.done += 1
        self.running.pop(number, None) if number is not None else self.running.clear()
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        self._draw()
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
