"""Durations in the console's words (2s, 3m05s, 4h12m, 2d03h): the panels, the events pane and the alerts' messages
say them alike."""

from __future__ import annotations

DASH = "—"


def duration(seconds: float | None) -> str:
    """2s, 3m05s, 4h12m, 2d03h; a dash for none."""
    if seconds is None or seconds < 0:
        return DASH
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
