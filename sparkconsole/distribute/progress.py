"""Bytes moved → rate and ETA, and the one progress line the commands print (redrawn on a terminal)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Progress:
    """One transfer to one node. `rate` is over the whole transfer so far (steady on a steady link)."""
    what: str                      # e.g. "openai/gpt-oss-120b → spark2"
    total: int                     # bytes to move (already-present bytes of a resumed copy excluded)
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    clock: Callable[[], float] = time.monotonic

    def add(self, n: int) -> None:
        self.done += n

    @property
    def rate(self) -> float:
        elapsed = self.clock() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        r = self.rate
        return (self.total - self.done) / r if r > 0 and self.total >= self.done else None

    def line(self, width: int = 24) -> str:
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        eta = self.eta_s
        return (f"{self.what}  [{bar}] {frac * 100:5.1f}%  {human(self.done)}/{human(self.total)}  "
                f"{human(self.rate)}/s  ETA {clock_text(eta) if eta is not None else '--:--'}")


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def clock_text(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Printer:
    """Prints a Progress: redrawn in place on a terminal, else one line every `every_s` seconds and at the end."""

    def __init__(self, out: TextIO | None = None, every_s: float = 5.0) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.every_s = every_s
        self._last = 0.0

    def __call__(self, p: Progress, final: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            self.out.write("\r" + p.line() + ("\n" if final else ""))
            self.out.flush()
        elif final or now - self._last >= self.every_s:
            self._last = now
            print(p.line(), file=self.out, flush=True)
