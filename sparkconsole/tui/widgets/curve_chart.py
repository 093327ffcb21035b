"""One bench curve chart (a metric against concurrency on a log-2 axis), one line per series (topology, past run,
published reference); points measured while a node throttled are drawn as red crosses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from textual_plotext import PlotextPlot


@dataclass
class Series:
    label: str
    points: dict[int, float] = field(default_factory=dict)   # concurrency -> value
    throttled: set[int] = field(default_factory=set)
    style: str = "line"                                        # line | reference | past
    colour: str | None = None                                  # a plotext colour name


class CurveChart(PlotextPlot):
    def __init__(self, title: str, unit: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chart_title = title
        self.unit = unit
        self.series: dict[str, Series] = {}

    def on_mount(self) -> None:
        super().on_mount()
        self.replot()

    def put(self, label: str, concurrency: int, value: float | None, *, throttled: bool = False,
            style: str = "line", colour: str | None = None) -> None:
        if value is None or concurrency <= 0:
            return
        s = self.series.setdefault(label, Series(label, style=style, colour=colour))
        s.points[concurrency] = value
        if throttled:
            s.throttled.add(concurrency)
        self.replot()

    def drop(self, style: str) -> None:
        for k in [k for k, s in self.series.items() if s.style == style]:
            del self.series[k]
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(f"{self.chart_title} ({self.unit})")
        levels = sorted({c for s in self.series.values() for c in s.points})
        for s in self.series.values():
            xs = sorted(s.points)
            if not xs:
                continue
            lx = [math.log2(c) for c in xs]
            ys = [s.points[c] for c in xs]
            marker = "dot" if s.style == "reference" else ("braille" if s.style == "past" else "hd")
            plt.plot(lx, ys, label=s.label, marker=marker, color=s.colour or "default")
            hot = sorted(s.throttled)
            if hot:
                plt.scatter([math.log2(c) for c in hot], [s.points[c] for c in hot], marker="x", color="red")
        if levels:
            plt.xticks([math.log2(c) for c in levels], [str(c) for c in levels])
        else:
            plt.xticks([math.log2(c) for c in (1, 2, 4, 8, 16, 32, 64)], ["1", "2", "4", "8", "16", "32", "64"])
            plt.xlim(0, 6)
        plt.xlabel("concurrency")
        self.refresh()
