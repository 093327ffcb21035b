"""Each node's memory budget as one bar: each workload's measured share and the rest of its claim, memory held
outside the workloads, what is free, the reserve (placement/bars.py publishes the segments; this only draws)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ...placement.bars import CLAIM, FREE, HELD, OTHER, RESERVE, BudgetBar, cells
from ...placement.fit import gib

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_red")
GLYPH = {HELD: "█", CLAIM: "▒", OTHER: "▓", FREE: "·", RESERVE: "╳"}
FIXED = {OTHER: "grey50", FREE: "grey35", RESERVE: "red"}
NAME_W = 10
TAIL_W = 16


def colour_of(names: list[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def bar_text(bar: BudgetBar, width: int, colours: dict[str, str]) -> Text:
    text = Text(no_wrap=True, overflow="crop")
    text.append(f"{bar.node[:NAME_W]:<{NAME_W}} ", style="bold")
    cols = max(width - NAME_W - 1 - TAIL_W, 8)
    if bar.total_b is None:
        text.append("memory not read", style="dim")
        return text
    for n, seg in cells(bar, cols):
        if n <= 0:
            continue
        style = colours.get(seg.label, "white") if seg.kind in (HELD, CLAIM) else FIXED[seg.kind]
        if seg.kind == CLAIM:
            style = f"dim {style}"
        text.append(GLYPH[seg.kind] * n, style=style)
    tail = f" {gib(bar.free_b)} free" + ("*" if bar.estimated else "")
    text.append(tail[:TAIL_W], style="red" if (bar.free_b or 0) <= 0 else "")
    return text


def legend(bars: list[BudgetBar], colours: dict[str, str]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for name, colour in colours.items():
        held = sum(s.bytes for b in bars for s in b.segments if s.label == name and s.kind == HELD)
        claim = sum(s.bytes for b in bars for s in b.segments if s.label == name and s.kind == CLAIM)
        text.append("█ ", style=colour)
        text.append(f"{name} {gib(held)}" + (f" (+{gib(claim)} claimed)" if claim else "") + "  ")
    text.append("▓ outside  · free  ╳ reserve", style="dim")
    if any(b.estimated for b in bars):
        text.append("  * estimate: node not read", style="yellow")
    return text


class BudgetBars(Widget):
    """One line per node and a legend; redrawn only when the bars or the width change."""

    DEFAULT_CSS = "BudgetBars { height: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.bars: list[BudgetBar] = []
        self._key: tuple = ()

    def show(self, bars: list[BudgetBar]) -> None:
        key = tuple(bars)
        if key == self._key:
            return
        self._key = key
        self.bars = list(bars)
        self.refresh(layout=True)

    def text(self, width: int) -> Text:
        if not self.bars:
            return Text("no node read yet", style="dim")
        names = sorted({s.label for b in self.bars for s in b.segments if s.kind in (HELD, CLAIM)})
        colours = colour_of(names)
        out = Text("\n").join([bar_text(b, width, colours) for b in self.bars])
        out.append("\n")
        out.append_text(legend(self.bars, colours))
        return out

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.bars) + 1 if self.bars else 1

    def render(self) -> Text:
        return self.text(self.size.width or 80)
