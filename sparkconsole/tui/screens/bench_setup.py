"""`b` on the bench screen: what the sweep will run (endpoint, concurrency levels, batches per level, where the
results go), each level editable, before anything is sent. Enter starts it, Escape cancels."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

MAX_CONCURRENCY = 1024
MAX_RUNS = 20


@dataclass(frozen=True)
class SweepChoice:
    concurrency: tuple[int, ...]
    runs: int
    model: str | None = None           # through the gateway: the served model name the sweep asks for


def parse_choice(concurrency: str, runs: str, model: str | None = None,
                 models: tuple[str, ...] = ()) -> SweepChoice | str:
    """The form's fields as a SweepChoice, or the one line that says what is wrong with them."""
    try:
        levels = tuple(int(x) for x in concurrency.replace(" ", ",").split(",") if x)
    except ValueError:
        levels = ()
    if not levels or any(not 1 <= c <= MAX_CONCURRENCY for c in levels):
        return f"concurrency: comma-separated whole numbers from 1 to {MAX_CONCURRENCY}, e.g. 1,4,16"
    try:
        n = int(runs)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_RUNS:
        return f"runs: a whole number from 1 to {MAX_RUNS}"
    if models:
        model = (model or "").strip()
        if model not in models:
            return f"model: one the gateway lists: {', '.join(models)}"
    return SweepChoice(tuple(dict.fromkeys(levels)), n, model or None)


def shown_path(path: str) -> str:
    """A path under the working directory as relative to it (and said so), any other as it is."""
    import os
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else f"{rel} (in the working directory)"


class BenchSetupScreen(ModalScreen[SweepChoice | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, target: str, results: str, choice: SweepChoice, models: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.target, self.results, self.choice, self.models = target, shown_path(results), choice, models

    def compose(self) -> ComposeResult:
        with Vertical(id="bench-setup"):
            yield Static(Text(f"Sweep {self.target}?", style="bold"), id="bench-setup-title")
            yield Static(Text(f"Each level: one warm-up batch, then the runs, every request streamed. Results are "
                              f"written to {self.results} as each level lands; x stops the sweep, keeping them.",
                              style="dim"), id="bench-setup-detail")
            with Horizontal(classes="bench-setup-row"):
                yield Label("concurrency levels ")
                yield Input(",".join(map(str, self.choice.concurrency)), id="bench-concurrency")
            with Horizontal(classes="bench-setup-row"):
                yield Label("runs per level      ")
                yield Input(str(self.choice.runs), id="bench-runs")
            if self.models:
                with Horizontal(classes="bench-setup-row"):
                    yield Label("model               ")
                    yield Input(self.choice.model or self.models[0], id="bench-model",
                                placeholder=", ".join(self.models))
            yield Static("", id="bench-setup-error")
            with Horizontal(id="bench-setup-buttons"):
                yield Button("Start (enter)", variant="primary", id="start")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#bench-concurrency", Input).focus()

    def _start(self) -> None:
        model = self.query_one("#bench-model", Input).value if self.models else None
        got = parse_choice(self.query_one("#bench-concurrency", Input).value,
                           self.query_one("#bench-runs", Input).value, model, self.models)
        if isinstance(got, str):
            self.query_one("#bench-setup-error", Static).update(Text(got, style="red"))
            return
        self.dismiss(got)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._start()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self._start()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
