"""Progress of long work (training, prepare, translate, parse): a bar at a terminal, a plain line
every `interval` seconds in a log.

tqdm redraws its bar with carriage returns; written into a file that is not a terminal, every
redraw becomes a line of its own (the demo's log had about 1,300). So `Progress` draws a tqdm bar
only when its stream is a terminal, and otherwise writes one readable line now and then:

    train: 1,200/4,000 step (30%), 5:02 elapsed, 3.97 step/s, 11:45 left; loss=3.912 lr=4.1e-04

and, if it wrote any, a last one when the work ends. Short work in a log stays silent.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

# Seconds between two lines in a log: a 7-minute demo writes about 15, an overnight run ~1,000.
INTERVAL = 30.0


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:,.1f}"


class Progress:
    """`total` units of work (None: unknown), `initial` of them done already (a resumed run).
    Disabled (`enabled=False`), it prints nothing. Use as a context manager, or `close()`."""

    def __init__(self, total: float | None = None, *, desc: str, unit: str = "it",
                 initial: float = 0, enabled: bool = True, file: TextIO | None = None,
                 interval: float = INTERVAL, unit_scale: bool = False, leave: bool = True):
        self.file = file if file is not None else sys.stderr
        self.total, self.n, self.initial = total, initial, initial
        self.desc, self.unit, self.interval = desc, unit.strip(), interval
        self.enabled = enabled
        self.postfix: dict[str, Any] = {}
        self.bar = None
        if enabled and is_terminal(self.file):
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.file,
                            dynamic_ncols=True, unit_scale=unit_scale, leave=leave)
        self.start = self.last = time.monotonic()
        self.lines = 0  # plain lines written
        self.shown: float | None = None  # the count the last line showed

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.monotonic() - self.last >= self.interval:
            self._line()

    def moveto(self, n: float) -> None:
        """Set the count done (for work measured as it goes, such as seconds of a time budget)."""
        if n != self.n:
            self.update(n - self.n)

    def set_postfix(self, fields: dict[str, Any]) -> None:
        """Fields shown after the count (at the next redraw or line)."""
        self.postfix = dict(fields)
        if self.bar is not None:
            self.bar.set_postfix(self.postfix, refresh=False)

    def write(self, message: str) -> None:
        """A message on the stream, above the bar at a terminal."""
        if self.bar is not None:
            self.bar.write(message, file=self.file)
        else:
            print(message, file=self.file, flush=True)

    def describe(self) -> str:
        """The plain line: count, share of the total, time taken, rate, time left, fields."""
        elapsed = time.monotonic() - self.start
        done = f"{_count(self.n)}/{_count(self.total)}" if self.total else _count(self.n)
        parts = [f"{done} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{_clock(elapsed)} elapsed")
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            if self.unit != "s":  # work counted in seconds runs at 1 s/s: nothing to say
                parts.append(f"{rate:,.3g} {self.unit}/s")
            if self.total and self.total > self.n:
                parts.append(f"{_clock((self.total - self.n) / rate)} left")
        line = f"{self.desc}: " + ", ".join(parts)
        if self.postfix:
            line += "; " + " ".join(f"{k}={v}" for k, v in self.postfix.items())
        return line

    def _line(self) -> None:
        print(self.describe(), file=self.file, flush=True)
        self.last = time.monotonic()
        self.lines += 1
        self.shown = self.n

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.enabled and self.lines and self.shown != self.n:  # a log shows the work's end
            self._line()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
