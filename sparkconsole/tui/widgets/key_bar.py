"""The key bar: the keys of the screen and the focused widget, drawn as one line of text by one widget.

Textual's Footer is a container of one widget per key. Each is composed, styled and laid out on its own, and the
Footer remounts them all on every bindings signal: a modal opening or closing over the dashboard, or focus moving
between node panels, laid the whole screen out again (with 32 node panels, the slowest thing a key press waited
for), and the console's first frame spent a fifth of a second on its eleven keys (docs/PERFORMANCE.md §4). Here a
change of keys is one repaint of one line, and an unchanged signal costs nothing.

It reads like the Footer (same theme colours, disabled keys dimmed, the command palette's key at the right end)
and a click on a key presses it.
"""

from __future__ import annotations

from typing import NamedTuple

from rich.style import Style
from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widget import Widget


class Key(NamedTuple):
    key: str            # what a click presses
    display: str        # how the key is written ("^p", "?")
    description: str
    enabled: bool
    action: str = ""    # the binding's action (which keys the bar always keeps)


# Kept on the bar, with their words, however narrow the terminal: what an operator lost needs first.
ALWAYS = ("help", "quit", "events")


def shown_keys(screen: Screen) -> tuple[tuple[Key, ...], Key | None]:
    """The keys the screen shows now, in binding order, and the command palette's key (drawn apart, at the right)."""
    app = screen.app
    palette_key = app.COMMAND_PALETTE_BINDING if app.ENABLE_COMMAND_PALETTE else None
    keys: list[Key] = []
    palette = None
    for key, (_, binding, enabled, _tooltip) in screen.active_bindings.items():
        if key == palette_key:
            palette = Key(key, app.get_key_display(binding), binding.description, enabled, binding.action)
        elif binding.show:
            keys.append(Key(key, app.get_key_display(binding), binding.description, enabled, binding.action))
    return tuple(keys), palette


DIM = Style(dim=True)


class KeyBar(Widget, can_focus=False):
    COMPONENT_CLASSES = {"key-bar--key", "key-bar--description"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
        .key-bar--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        .key-bar--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.keys: tuple[Key, ...] = ()
        self.palette: Key | None = None
        self.changes = 0                            # how often the keys shown changed (tests/test_tui_keys.py)
        self._spans: list[tuple[int, int, Key]] = []   # where each key was drawn, for clicks
        self._drawn: tuple | None = None
        self._text: Text | None = None

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self.bindings_changed)
        self.bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def bindings_changed(self, screen: Screen) -> None:
        if screen is not self.screen:
            return
        keys, palette = shown_keys(screen)
        if (keys, palette) != (self.keys, self.palette):
            self.keys, self.palette = keys, palette
            self.changes += 1
            self.refresh()

    def render(self) -> Text:
        # Every full update of the screen (a modal closing, a resize) asks again: the same keys, the same line.
        drawn = (self.keys, self.palette, self.size.width)
        if self._text is not None and self._drawn == drawn:
            return self._text
        self._drawn, self._text = drawn, self._draw()
        return self._text

    def fitted(self, width: int) -> tuple[tuple[Key, bool], ...]:
        """The keys drawn in `width` columns, each with whether its words are: all of them when they fit; else the
        keys lose their words from the end of the bar (the app's, then the screen's, then the focused widget's),
        then go, from the end. `? Help`, `q Quit` and `e Events` always stay, with their words."""
        def cells(keys: list[tuple[Key, bool]]) -> int:
            return sum(len(k.display) + 2 + (len(k.description) + 1 if worded and k.description else 0)
                       for k, worded in keys)
        keys = [(k, True) for k in self.keys]
        for i in reversed(range(len(keys))):
            if cells(keys) <= width:
                break
            if not self._always(keys[i][0]):
                keys[i] = (keys[i][0], False)
        while cells(keys) > width and any(not self._always(k) for k, _ in keys):
            keys.pop(max(i for i, (k, _) in enumerate(keys) if not self._always(k)))
        return tuple(keys)

    @staticmethod
    def _always(k: Key) -> bool:
        return k.action.split("(", 1)[0] in ALWAYS

    def _draw(self) -> Text:
        key_style = self.get_component_rich_style("key-bar--key")
        desc_style = self.get_component_rich_style("key-bar--description")
        text = Text(no_wrap=True, overflow="crop", end="")
        spans: list[tuple[int, int, Key]] = []

        def add(k: Key, worded: bool = True) -> None:
            start = text.cell_len
            dim = Style() if k.enabled else DIM
            text.append(f" {k.display} ", key_style + dim)
            if k.description and worded:
                text.append(f"{k.description} ", desc_style + dim)
            spans.append((start, text.cell_len, k))

        for k, worded in self.fitted(self.size.width):
            add(k, worded)
        if self.palette is not None:
            right = len(f" {self.palette.display} {self.palette.description} ") + 1
            gap = self.size.width - text.cell_len - right
            if gap >= 1:
                text.append(" " * gap)
                text.append("▏", "dim")
                add(self.palette)
        self._spans = spans
        return text

    def on_mouse_down(self, event: events.MouseDown) -> None:
        for start, end, k in self._spans:
            if start <= event.x < end:
                if k.enabled:
                    self.app.simulate_key(k.key)
                else:
                    self.app.bell()
                return
