"""Confirmation before anything that changes a node: shows the exact command that will run; y / Enter runs it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Run it"), Binding("n,escape", "answer(False)", "Cancel")]

    def __init__(self, title: str, command: str, detail: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.command = command
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(Text(self.title_text, style="bold"), id="confirm-title")
            if self.detail:
                yield Static(self.detail, id="confirm-detail")
            yield Static(Text(self.command, style="bold cyan"), id="confirm-command")
            with Horizontal(id="confirm-buttons"):
                yield Button("Run (y)", variant="error", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
