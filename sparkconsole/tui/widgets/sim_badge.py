"""The SIMULATED label: shown on every screen when the console watches the simulator, never real hardware."""

from __future__ import annotations

from textual.widgets import Static


class SimBadge(Static):
    DEFAULT_CSS = """
    SimBadge { dock: top; width: 100%; height: 1; background: $warning; color: $background; text-style: bold;
               content-align: center middle; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(" SIMULATED — readings come from the simulator, not from hardware ", **kwargs)
