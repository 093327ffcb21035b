"""Unified-memory headroom: MemAvailable of MemTotal as a bar, with memory pressure beside it."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ...nodes.samples import HostMemory, Pressure
from ..fmt import DASH

MIN_BAR = 4


class MemoryBar(Widget):
    DEFAULT_CSS = "MemoryBar { height: 1; }"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._key: tuple | None = None
        self._shown: Text | None = None
        self.floor_gib = 8.0

    def set_data(self, mem: HostMemory | None, pressure: Pressure | None, stale: bool = False) -> None:
        self._key = (mem, pressure, stale)
        text = self._text(self.size.width)
        if text != self._shown:          # readings move every tick; the drawn bar changes far less often
            self._shown = text
            self.refresh()

    def render(self) -> Text:
        self._shown = self._text(self.size.width)
        return self._shown

    def _text(self, cols: int) -> Text:
        mem, pressure, stale = self._key or (None, None, False)
        text = Text(no_wrap=True, overflow="crop")
        text.append("Mem ", style="bold")
        frac = mem.available_frac if mem else None
        if frac is None:
            text.append(f"headroom {DASH}", style="dim")
            return text
        head = mem.headroom_gib or 0.0
        total = (mem.total_kb or 0) / 1048576
        # The figures whole or not at all (a narrow panel said "PSI" with no value): pressure goes first, then
        # the shorter way of saying what is free; the bar takes what is left, four cells at least.
        psi = (f"  PSI {pressure.some_avg10:.1f}/{(pressure.full_avg10 or 0):.1f}"
               if pressure and pressure.some_avg10 is not None else "")
        tails = [f" {head:.1f} of {total:.1f} GiB free{psi}", f" {head:.1f} of {total:.1f} GiB free",
                 f" {head:.1f}/{total:.0f} GiB free"]
        tail = next((t for t in tails if cols - 4 - len(t) >= MIN_BAR), tails[-1])
        width = max(cols - 4 - len(tail), MIN_BAR)
        used = int(round((1 - frac) * width))
        style = "grey50" if stale else ("red" if head < self.floor_gib else ("yellow" if frac < 0.25 else "green"))
        text.append("█" * used, style=style)
        text.append("░" * (width - used), style="grey35")
        text.append(tail, style="red" if head < self.floor_gib and not stale else "")
        return text
