"""The event log pane: every alert raised or cleared, newest last, coloured by severity."""

from __future__ import annotations

import collections
import time

from rich.text import Text
from textual.widgets import RichLog

_STYLE = {"bad": "bold red", "warn": "yellow", "info": "cyan"}


class AlertLog(RichLog):
    DEFAULT_CSS = "AlertLog { height: 8; }"

    def __init__(self, **kwargs) -> None:
        # min_width: RichLog's default (78) never wraps narrower, so an 80-column terminal cut every line's end
        super().__init__(max_lines=1000, wrap=True, markup=False, min_width=20, **kwargs)
        self.border_title = "Events"
        self.count = 0
        self.history: collections.deque[str] = collections.deque(maxlen=1000)   # plain text, newest last
        self._lines: collections.deque[Text] = collections.deque(maxlen=1000)    # as written, for a new width
        self._width = 0

    def on_resize(self, event) -> None:         # events.Resize
        """A RichLog wraps a line once, at the width it had when written: a terminal made narrower cut them (a
        URL's port at 80×24), one made wider kept them short. Written again at the new width."""
        super().on_resize(event)
        width = self.scrollable_content_region.width
        if width and width != self._width:
            first, self._width = not self._width, width
            if self._lines and not first:
                self.clear()
                for line in self._lines:
                    super().write(line)

    def add(self, alert) -> None:
        self.count += 1
        line = Text()
        line.append(time.strftime("%H:%M:%S ", time.localtime(alert.time)), style="dim")
        if alert.active:
            line.append(f"{alert.severity.upper():5} ", style=_STYLE.get(alert.severity, ""))
        else:
            line.append("CLEAR ", style="green")
        line.append(f"{alert.source}: ", style="bold")
        line.append(alert.body, style="" if alert.active else "dim")
        self._add(line)

    def _add(self, line: Text) -> None:
        self.history.append(line.plain)
        self._lines.append(line)
        self.write(line)

    def note(self, message: str, style: str = "") -> None:
        """A console event that is not an alert (a command sent, a launch step)."""
        self.count += 1
        line = Text()
        line.append(time.strftime("%H:%M:%S ", time.localtime()), style="dim")
        line.append(message, style=style)
        self._add(line)
