"""The launches running on the cluster, one line each across its nodes: a multi-node launch read as one thing."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

STYLE = {"SERVING": "green", "STARTING": "yellow", "BROKEN": "bold red", "CLOSED": "bold yellow"}
# A restart's stage of one server, shown instead of its container's state while the restart runs.
RESTART_WORDS = {"draining": ("draining", "yellow"), "restarting": ("restarting", "yellow"),
                 "back": ("back in", "green"), "failed": ("restart failed", "bold red")}


class LaunchBar(Static):
    DEFAULT_CSS = "LaunchBar { height: auto; padding: 0 1; }"

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self._shown: tuple = ()
        self.display = False

    def show(self, groups, restarting: dict[tuple[str, str], str] | None = None) -> None:
        restarting = restarting or {}
        lines = (*(g.line() for g in groups), *sorted(f"{k}={v}" for k, v in restarting.items()))
        if lines == self._shown:
            return
        self._shown = lines
        self.display = bool(groups)
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, g in enumerate(groups):
            if i:
                text.append("\n")
            text.append("launch ", style="bold")
            text.append(f"{g.recipe} × {g.topology}  ")
            for j, m in enumerate(g.members):
                text.append(" · " if j else "", style="dim")
                text.append(f"{m.node} {m.role} ")
                stage = RESTART_WORDS.get(restarting.get((m.node, m.container), ""))
                if stage is not None:
                    text.append(*stage)
                else:
                    text.append(m.words().split(" ", 2)[2], style="green" if m.running else "red")
            text.append(f"  {g.verdict}", style=STYLE.get(g.verdict, ""))
            if g.reason:
                text.append(f": {g.reason}", style=STYLE.get(g.verdict, ""))
        self.update(text)
