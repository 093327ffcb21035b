"""The OOM-guard checklist of one node: each guard's mark (severity.py: ✓ ? ! ✗) with the one-line reason; Enter on
a row asks to run its fix."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from ... import severity
from ..fmt import clip_words


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

    def set_results(self, results: Sequence, stale: bool = False, compact: bool = False) -> None:
        """compact (a short terminal): only the guards that are not ok have rows, worst first, and one row says
        how many are ok; `self.results` are the rows shown, in order (Enter on a row fixes its guard)."""
        key = (tuple(results), stale, self.size.width, compact)
        if key == getattr(self, "_key", None):
            return
        self._key = key
        keep = self.highlighted
        self._stale = stale
        shown = list(results)
        ok = 0
        if compact:
            judged = [(severity.of_guard(r), i, r) for i, r in enumerate(results)]
            shown = [r for s, i, r in sorted(judged, key=lambda x: (-x[0].rank, x[1])) if s is not severity.OK]
            ok = len(results) - len(shown)
        self.results = tuple(shown)
        # One row per guard, never wrapped (a wrapped row pushes the others out of the panel): the full reason is
        # in the confirmation that Enter opens. Cut between words, so a figure is shown whole or not at all.
        width = max(self.size.width - 1, 16) if self.size.width else 200
        options = []
        for r in self.results:
            sev = severity.of_guard(r)          # the one mark every view draws (severity.py)
            tail = ("  ⏎ fix" if width >= 40 else " ⏎") if r.fix else ""
            title = clip_words(r.title, width - 2 - len(tail) - 1)
            room = width - 2 - len(title) - 2 - len(tail)
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(f"{sev.mark} ", style="grey50" if stale else sev.colour)
            line.append(f"{title}: " if room >= 2 else title, style="grey50" if stale else "bold")
            if room >= 2:
                line.append(clip_words(r.reason, room), style="grey50" if stale else "")
            if tail:
                line.append(tail, style="dim")
            options.append(Option(line, id=r.key))
        if compact and ok:
            summary = Text(no_wrap=True, overflow="ellipsis")
            summary.append(f"{severity.OK.mark} ", style="grey50" if stale else severity.OK.colour)
            summary.append(f"{ok} of {len(results)} OOM guards ok" if shown else f"every OOM guard ok ({ok})",
                           style="grey50" if stale else "dim")
            options.append(Option(summary, id="ok-guards", disabled=True))
        if self.styles.height is None or self.styles.height.value != max(len(options), 1):
            self.styles.height = max(len(options), 1)   # a fixed height: new reasons repaint, never re-layout
        self.set_options(options)
        if keep is not None and keep < len(options):
            self.highlighted = keep

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if 0 <= event.option_index < len(self.results):
            self.post_message(self.FixRequested(self, self.results[event.option_index]))
