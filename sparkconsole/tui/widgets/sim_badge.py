"""The SIMULATED label: shown on every screen when the console watches the simulator, never real hardware. It takes
the header's row, so it also carries what the header would say of a recorded moment: REPLAY and its time."""

from __future__ import annotations

from textual.widgets import Static

from ..facade import OnConsole

LIVE = " SIMULATED — readings come from the simulator, not from hardware "


class SimBadge(OnConsole, Static):
    DEFAULT_CSS = """
    SimBadge { dock: top; width: 100%; height: 1; background: $warning; color: $background; text-style: bold;
               content-align: center middle; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(LIVE, **kwargs)

    def on_mount(self) -> None:
        self.facade.watch_title(self, self._title_changed)

    def _title_changed(self, sub_title: str) -> None:
        # the app's subtitle starts "REPLAY <time> · " while a recorded moment plays (tui/app.py _title)
        replay = sub_title.split(" · ", 1)[0] if sub_title.startswith("REPLAY ") else None
        self.update(f" SIMULATED · {replay} — a recorded moment, not live " if replay else LIVE)
