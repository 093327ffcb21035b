"""`?`: every key of the console, by screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    ("everywhere", [("1 2 3 4", "dashboard · recipes · bench · logs"), (": or ctrl+p", "command palette: every action, every recipe"),
                    ("e", "the Events pane (alerts, restart progress, collector messages) over the dashboard, at any "
                          "terminal size; e or escape brings the nodes back"),
                    ("?", "this help"), ("[ / ]", "back / forward 5 min through the flight recorder (REPLAY; ] to live)"), ("/", "filter (nodes, recipes) or search (logs)"), ("tab", "next pane"), ("q", "quit: agents end, connections close")]),
    ("node panel", [("l", "tail the node's vLLM container log"), ("r", "restart the vLLM container (asks first)"),
                    ("s", "stop the vLLM container (asks first)"),
                    ("f or enter", "fix the worst guard that is not ok: shows the command, runs it after a confirmation"),
                    ("enter on a guard", "that guard's fix, the same way")]),
    ("recipes", [("enter", "launch the chosen recipe on the chosen topology (asks first)"), ("t", "next topology"),
                 ("r / s", "restart / stop the running recipe (asks first)"),
                 ("m / i", "copy the plan's model / image to its nodes (asks first)")]),
    ("bench", [("b", "start a sweep: set its levels and runs, then confirm"), ("x", "stop the sweep"), ("p", "overlay past runs"), ("f", "overlay the published reference")]),
    ("logs", [("/", "search"), ("n", "next node"), ("f", "follow on/off"), ("escape", "clear the search")]),
]


KEY_COL = 22


def help_text(width: int | None) -> Text:
    """Plain padded text, not a Rich table: it opens in one cheap paint, even while 32 nodes stream. `width`: the
    cells it has, each description wrapped under its own column (None: unwrapped)."""
    import textwrap
    text = Text()
    for section, rows in KEYS:
        text.append(f"{section}\n", style="bold")
        for key, what in rows:
            text.append(f"  {key:<{KEY_COL - 2}}", style="bold cyan")
            lines = textwrap.wrap(what, max(width - KEY_COL, 20)) if width else [what]
            text.append(lines[0] + "\n" + "".join(" " * KEY_COL + ln + "\n" for ln in lines[1:]))
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text(None), id="help-text")

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "Keys"
        self.call_after_refresh(self._rewrap)

    def on_resize(self) -> None:
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        # the descriptions wrapped under their own column at the width the help has now (80×24 folded them under
        # the keys)
        width = self.query_one("#help-text").size.width
        if width and width != getattr(self, "_wrapped", None):
            self._wrapped = width
            self.query_one("#help-text", Static).update(help_text(width))

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)
