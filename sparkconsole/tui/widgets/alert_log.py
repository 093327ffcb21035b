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
        super().__init__(max_lines=1000, wrap=True, markup=False, **kwargs)
        self.border_title = "Events"
        self.count = 0
        self.history: collections.deque[str] = collections.deque(maxlen=1000)   # plain text, newest last

    def add(self, alert) -> None:
        self.count += 1
        line = Text()
        line.append(time.strftime("%H:%M:%S ", time.localtime(alert.time)), style="dim")
        if alert.active:
            line.append(f"{alert.severity.upper():5} ", style=_STYLE.get(alert.severity, ""))
        else:
            line.append("CLEAR ", style="green")
        line.append(f"{alert.source}: ", style="bold")
        message = alert.message
        if message.startswith(alert.source + " "):
            message = message[len(alert.source) + 1:]
        line.append(message, style="" if alert.active else "dim")
        self.history.append(line.plain)
        self.write(line)

    def note(self, message: str, style: str = "") -> None:
        """A console event that is not an alert (a command sent, a launch step)."""
        self.count += 1
        line = Text()
        line.append(time.strftime("%H:%M:%S ", time.localtime()), style="dim")
        line.append(message, style=style)
        self.history.append(line.plain)
        self.write(line)
