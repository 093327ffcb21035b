"""What a redraw costs the screen while many nodes stream: only the rows that changed and are on screen are
updated (docs/PERFORMANCE.md §4). Fed by the recorded session, as tests/test_tui_app.py is."""

from __future__ import annotations

from textual._compositor import Compositor
from textual.widget import Widget

from sparkconsole.tui.widgets.node_panel import NodePanel
from tests.helpers import wait_for
from tests.test_tui_app import SIZE, make_app, recording, state_dir, widget_text  # noqa: F401 (fixtures)


async def test_streaming_nodes_never_rearrange_the_screen_and_rows_below_the_edge_catch_up(recording, monkeypatch):
    """Eight nodes at 20 Hz in a terminal that shows the first panels, the last row of them cut off by the bottom
    edge. A redraw must not make Textual arrange every widget again (its full map: ~5 ms with 32 panels, and it
    happened whenever a row below the edge was updated), nor repaint a LIVE panel whose border did not change;
    the rows below the edge are drawn once they are scrolled into view."""
    rebuilds, panel_refreshes = [], []
    full_map = Compositor.full_map.fget

    def counted_full_map(compositor):
        if compositor._full_map_invalidated:
            rebuilds.append(compositor)
        return full_map(compositor)

    refresh = Widget.refresh

    def counted_refresh(widget, *regions, **kwargs):
        if isinstance(widget, NodePanel):
            panel_refreshes.append(widget.node_name)
        return refresh(widget, *regions, **kwargs)

    app, _, mon = make_app(recording, 8)
    async with app.run_test(size=SIZE) as pilot:
        panels = app.dashboard.panels
        await wait_for(pilot, lambda: all(len(nm.history) >= 8 for nm in mon.nodes.values()), what="8 ticks each")
        await wait_for(pilot, lambda: "°C" in widget_text(panels["spark1"]), what="spark1 drawn")
        drawn = app.dashboard.drawn()
        cut = [name for name, p in panels.items()
               if p in drawn and any(row.display and row not in drawn for row in p.children)]
        assert cut, "the terminal should cut a panel at its bottom edge"
        below = [row for row in panels[cut[0]].children if row.display and row not in drawn]

        monkeypatch.setattr(Compositor, "full_map", property(counted_full_map))
        monkeypatch.setattr(Widget, "refresh", counted_refresh)
        before = {name: len(nm.history) for name, nm in mon.nodes.items()}
        await wait_for(pilot, lambda: all(len(nm.history) >= before[n] + 20 for n, nm in mon.nodes.items()),
                       what="20 more ticks each")
        await pilot.pause(0.5)      # two redraws after them
        assert rebuilds == []
        assert panel_refreshes == []
        monkeypatch.undo()

        # Scrolled into view, the rows that were below the edge show the node's current readings.
        app.dashboard.query_one("#nodes").scroll_to_widget(panels[cut[0]], animate=False, top=True)
        await wait_for(pilot, lambda: all(row in app.dashboard.drawn() for row in below), what="rows scrolled in")
        text = lambda: widget_text(panels[cut[0]])    # noqa: E731
        await wait_for(pilot, lambda: "GiB free" in text() and "vLLM " in text(), what="memory and container rows")
        await pilot.press("q")
