"""The OOM-guard checklist of one node: each guard's mark (severity.py: ✓ ? ! ✗) with the one-line reason; Enter on
a row asks to run its fix."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from ... import severity


class GuardList(OptionList):
    DEFAULT_CSS = "GuardList { height: auto; border: none; padding: 0; background: transparent; }"

    class FixRequested(Message):
        def __init__(self, guard_list: GuardList, result) -> None:
            super().__init__()
            self.guard_list = guard_list
            self.result = result

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.results: tuple = ()

    def set_results(self, results: Sequence, stale: bool = False) -> None:
        key = (tuple(results), stale, self.size.width)
        if key == (self.results, getattr(self, "_stale", None), getattr(self, "_width", None)):
            return
        keep = self.highlighted
        self.results, self._stale, self._width = key
        width = max(self.size.width - 2, 20)
        options = []
        for r in self.results:
            sev = severity.of_guard(r)          # the one mark every view draws (severity.py)
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(f"{sev.mark} ", style="grey50" if stale else sev.colour)
            line.append(f"{r.title}: ", style="grey50" if stale else "bold")
            tail = "  ⏎ fix" if r.fix else ""
            room = width - len(line) - len(tail)
            # One row per guard: the full reason is in the confirmation that Enter opens.
            reason = r.reason if len(r.reason) <= room else r.reason[:max(room - 1, 0)] + "…"
            line.append(reason, style="grey50" if stale else "")
            if tail:
                line.append(tail, style="dim")
            options.append(Option(line, id=r.key))
        if self.styles.height is None or self.styles.height.value != max(len(options), 1):
            self.styles.height = max(len(options), 1)   # a fixed height: new reasons repaint, never re-layout
        self.set_options(options)
        if keep is not None and keep < len(options):
            self.highlighted = keep

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if 0 <= event.option_index < len(self.results):
            self.post_message(self.FixRequested(self, self.results[event.option_index]))
