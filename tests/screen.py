"""What the terminal shows, as plain text, through Textual's public screenshot (the SVG `App.export_screenshot`
writes): no reading of the compositor's private strips. Each text run of the SVG sits at its row (its clip path,
`line-N`) and column (x over the cell width Rich's SVG export uses)."""

from __future__ import annotations

import html
import re

CELL_W = 12.2        # Rich's export_svg: char_width = 0.61 × font_size 20
_RUN = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                  r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>')


def screen_lines(app) -> list[str]:
    width, height = app.size
    rows = [[" "] * width for _ in range(height)]
    for x, line, content in _RUN.findall(app.export_screenshot()):
        row, col = int(line), round(float(x) / CELL_W)
        text = html.unescape(content).replace("\xa0", " ").replace("\n", "")
        if row < height:
            for i, ch in enumerate(text[: max(width - col, 0)]):
                rows[row][col + i] = ch
    return ["".join(r).rstrip() for r in rows]


def screen_text(app) -> str:
    return "\n".join(screen_lines(app))


def widget_text(widget) -> str:
    """The part of the screen a widget (with its children) covers."""
    region = widget.screen.find_widget(widget).region
    lines = screen_lines(widget.app)
    return "\n".join(line[region.x:region.right] for line in lines[region.y:region.bottom])
