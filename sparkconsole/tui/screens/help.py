"""`?`: every key of the console, by screen."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    ("everywhere", [("1 2 3 4", "dashboard · recipes · bench · logs"), (": or ctrl+p", "command palette: every action, every recipe"),
                    ("?", "this help"), ("/", "filter (nodes, recipes) or search (logs)"), ("tab", "next pane"), ("q", "quit: agents end, connections close")]),
    ("node panel", [("l", "tail the node's vLLM container log"), ("r", "restart the vLLM container (asks first)"),
                    ("s", "stop the vLLM container (asks first)"), ("enter on a guard", "show the fixing command, run it after a confirmation")]),
    ("recipes", [("enter", "launch the chosen recipe on the chosen topology (asks first)"), ("t", "next topology"),
                 ("r / s", "restart / stop the running recipe (asks first)")]),
    ("bench", [("b", "start a sweep"), ("x", "stop the sweep"), ("p", "overlay past runs"), ("f", "overlay the published reference")]),
    ("logs", [("/", "search"), ("n", "next node"), ("f", "follow on/off"), ("escape", "clear the search")]),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for section, rows in KEYS:
            table.add_row(f"[b]{section}[/b]", "")
            for key, what in rows:
                table.add_row(f"  {key}", what)
        with VerticalScroll(id="help"):
            yield Static(table)

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "Keys"

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)
