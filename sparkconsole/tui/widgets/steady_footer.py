"""The key bar, rebuilt only when the keys it shows change.

Textual's Footer recomposes on every bindings signal of its screen: a modal opening or closing over the dashboard,
or focus moving between node panels, remounts its ~20 keys, and a mount lays out the whole screen again. With 32
node panels that layout is the slowest thing a key press waits for (docs/PERFORMANCE.md §4). The keys shown seldom
change, so the signal is compared with what is already on screen first.
"""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


def shown_keys(screen: Screen, palette_binding: str | None) -> tuple:
    """What Footer.compose would draw for this screen now: each shown binding with its state."""
    active = screen.active_bindings
    keys = tuple((b.key, b.key_display, b.description, b.action, enabled, tooltip, b.group)
                 for (_, b, enabled, tooltip) in active.values() if b.show)
    palette = active.get(palette_binding) if palette_binding else None
    return keys + ((("palette", palette[2]),) if palette else ())


class SteadyFooter(Footer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._drawn: tuple | None = None
        # Draw the keys in the first frame: Textual's footer stays empty until a bindings signal and then waits a
        # refresh to compose (~0.1 s after the dashboard's first paint); the focused panel's keys join on the signal.
        self.set_reactive(Footer._bindings_ready, True)

    def compose(self):
        self._drawn = shown_keys(self.screen, self.app.COMMAND_PALETTE_BINDING)
        yield from super().compose()

    def bindings_changed(self, screen: Screen) -> None:
        if self.is_attached and screen is self.screen and screen.app.app_focus:
            if shown_keys(screen, screen.app.COMMAND_PALETTE_BINDING) != self._drawn:
                # At once, not a refresh later as Textual's footer does: the focus landing on the first panel
                # at start-up then adds its keys before the first frame is painted.
                self.call_later(self.recompose)
            return
        super().bindings_changed(screen)
