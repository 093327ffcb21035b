"""GPU temperature history as bars, with the slowdown threshold drawn as a red line across the graph."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from itertools import groupby
from operator import itemgetter

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

_BLOCKS = " ▁▂▃▄▅▆▇█"


def thin(values: Sequence[float], columns: int) -> list[tuple[float, float]]:
    """(min, max) per column over the last `columns` buckets, so a one-tick spike still shows."""
    if columns <= 0 or not values:
        return []
    n = len(values)
    if n <= columns:
        return [(v, v) for v in values]
    out = []
    for c in range(columns):
        a, b = c * n // columns, max((c + 1) * n // columns, c * n // columns + 1)
        chunk = values[a:b]
        out.append((min(chunk), max(chunk)))
    return out


class TempGraph(Widget):
    """Call `set_data(temps, slowdown_c)`; draws only when the data changed."""

    DEFAULT_CSS = "TempGraph { height: 5; }"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._temps: tuple[float, ...] = ()
        self._slowdown: float | None = None
        self.stale = False
        self._strips: list[Strip] | None = None

    def set_data(self, temps: Sequence[float], slowdown_c: float | None, stale: bool = False) -> None:
        temps = tuple(temps)
        if temps == self._temps and slowdown_c == self._slowdown and stale == self.stale:
            return
        self._temps, self._slowdown, self.stale = temps, slowdown_c, stale
        self._strips = None
        self.refresh()

    @property
    def wanted(self) -> int:
        """How many samples are worth handing over: about 2x the width (the rest would be thinned away)."""
        return max(2 * self.size.width, 16)

    def on_resize(self) -> None:
        self._strips = None

    def notify_style_update(self) -> None:
        self._strips = None         # a new theme, or the panel greyed as STALE: the strips carry the base style
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        """Textual's line API, from strips made once per change: the graph changes every tick on every panel in
        view, and going through a Text (then Textual's Content, wrapping and strips) cost ~1.8 ms a graph, most
        of a 32-node screen update (docs/PERFORMANCE.md §4); these segments are made directly."""
        if self._strips is None:
            base = self.rich_style
            width = self.size.width
            self._strips = [Strip([Segment(text, base + _style(name)) for text, name in row]).adjust_cell_length(
                width, base) for row in self.rows(max(width - 6, 1), max(self.size.height, 1))]
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width, self.rich_style)

    def rows(self, w: int, h: int) -> list[list[tuple[str, str]]]:
        """The graph as rows of (text, style) runs, top row first: a 6-cell axis label, then `w` columns."""
        cols = thin(self._temps[-2 * w:], w)
        if not cols:
            return [[("no temperature readings", "dim")]]
        top_v = max(hi for _, hi in cols)
        thr = self._slowdown
        hi_v = max(top_v, thr + 2 if thr is not None else top_v) + 1
        lo_v = float(int((min(lo for lo, _ in cols) - 5) // 10 * 10))
        span = max(hi_v - lo_v, 1.0)
        levels = [max(0.0, (hi - lo_v) / span * h * 8) for _, hi in cols]
        thr_row = None if thr is None else min(h - 1, int((thr - lo_v) / span * h))
        bar_style = "grey50" if self.stale else "cyan"
        pad = w - len(levels)          # newest reading at the right edge
        out = []
        for row in range(h - 1, -1, -1):
            if row == thr_row:
                line = [(f"{thr:>4.0f}° ", "red")]
            elif row == h - 1:
                line = [(f"{hi_v:>4.0f}° ", "dim")]
            elif row == 0:
                line = [(f"{lo_v:>4.0f}° ", "dim")]
            else:
                line = [("      ", "")]
            if pad > 0:
                line.append((("╌" if row == thr_row else " ") * pad, "red"))
            over = thr_row is not None and row >= thr_row
            cells = []
            for lvl in levels:
                cell = lvl - row * 8
                ch = "█" if cell >= 8 else (_BLOCKS[max(int(cell), 1)] if cell > 0 else " ")
                if row == thr_row and ch == " ":
                    cells.append(("╌", "red"))
                else:
                    cells.append((ch, "bold red" if over else bar_style))
            # One segment per run of a style, not one per cell.
            line.extend(("".join(ch for ch, _ in run), style) for style, run in groupby(cells, key=itemgetter(1)))
            out.append(line)
        return out


@cache
def _style(name: str) -> Style:
    return Style.parse(name) if name else Style()
