"""Screen 1: one panel per node (two side by side, more scroll), a serving panel per endpoint, the event log."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header

from ..facade import OnConsole
from ..widgets.alert_log import AlertLog
from ..widgets.endpoint_panel import EndpointPanel
from ..widgets.guard_list import GuardList
from ..widgets.key_bar import KeyBar
from ..widgets.launch_bar import LaunchBar
from ..widgets.node_panel import NodePanel
from ..widgets.sim_badge import SimBadge

if TYPE_CHECKING:
    from textual.widgets import Input, Static


SHORT_ROWS = 40      # 80×24 and 100×30 are short; 160×48 and 220×60 are not
NARROW_COLS = 120


class DashboardScreen(OnConsole, Screen):
    AUTO_FOCUS = "NodePanel"
    BINDINGS = [Binding("slash", "filter", "Filter nodes"), Binding("escape", "clear_filter", "Clear filter", show=False)]

    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.panels: dict[str, NodePanel] = {}
        self.endpoint_panels: dict[str, EndpointPanel] = {}

    def compose(self) -> ComposeResult:
        app = self.facade
        yield Header()
        if app.simulated:
            yield SimBadge()
        yield LaunchBar(id="launches")
        with VerticalScroll(id="nodes"), Grid(id="node-grid"):
            for node in app.cluster.nodes:
                panel = NodePanel(node.name, node.container, id=f"node-{_safe(node.name)}", classes="node")
                self.panels[node.name] = panel
                yield panel
        if app.cluster.endpoints:
            with VerticalScroll(id="serving"):
                for ep in app.cluster.endpoints:
                    p = EndpointPanel(ep.name, ep.url, ep.kind, id=f"ep-{_safe(ep.name)}", classes="endpoint")
                    self.endpoint_panels[ep.name] = p
                    yield p
        yield AlertLog(id="events")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#nodes").border_title = f"Nodes · {self.facade.cluster.source}"
        self._size_classes(self.size.width, self.size.height)
        if self.panels:
            next(iter(self.panels.values())).focus()

    def on_resize(self, event) -> None:         # events.Resize
        self._size_classes(event.size.width, event.size.height)

    def _size_classes(self, width: int, height: int) -> None:
        """What each size shows (docs/UX.md): below SHORT_ROWS rows the node panels leave out the temperature
        graph and their ok guards (one row says how many are ok; a guard that is not ok always has its row) and
        the Events pane is reached with `e`; below NARROW_COLS columns the panels' rows drop their least needed
        figures whole."""
        self.set_class(height < SHORT_ROWS, "-short")
        self.set_class(width < NARROW_COLS, "-narrow")
        self.facade.mark_all_dirty()        # rows fitted to the new width, guards to the new height

    @property
    def short(self) -> bool:
        return self.has_class("-short")

    @property
    def events_only(self) -> bool:
        return self.has_class("-events")

    def show_events(self, on: bool) -> None:
        """The Events pane over the whole dashboard (`e`), or the nodes back."""
        self.set_class(on, "-events")
        if on:
            self.events.focus()
            self.events.scroll_end(animate=False)
        elif self.panels:
            shown = [p for p in self.panels.values() if p.display]
            (shown or list(self.panels.values()))[0].focus()
        self.facade.mark_all_dirty()

    async def follow_endpoints(self, endpoints: dict, added: list[str], moved: list[str], removed: list[str]) -> None:
        """Panels for the endpoints the serving monitor now polls (ServingMonitor.follow's answer)."""
        for name in removed:
            panel = self.endpoint_panels.pop(name, None)
            if panel is not None:
                await panel.remove()
        for name in moved:
            if name in self.endpoint_panels:
                ep = endpoints[name]
                self.endpoint_panels[name].retarget(ep.url, ep.kind)
        if not added:
            return
        if not self.query("#serving"):
            await self.mount(VerticalScroll(id="serving"), before=self.query_one("#events"))
        box = self.query_one("#serving")
        for name in added:
            ep = endpoints[name]
            p = EndpointPanel(ep.name, ep.url, ep.kind, id=f"ep-{_safe(ep.name)}", classes="endpoint")
            self.endpoint_panels[name] = p
            await box.mount(p)

    async def action_filter(self) -> None:
        found = self.query("#node-filter")
        if found:
            box = found.first()
        else:
            # Made on the first `/`: hidden until then, and the first frame is quicker without it (its import and
            # stylesheet are a tenth of a second on a 2-core machine).
            from textual.widgets import Input, Static
            box = Input(placeholder="filter nodes by name (escape clears)", id="node-filter")
            await self.mount(box, before=self.query_one(LaunchBar))
            await self.query_one("#nodes").mount(Static("", id="node-nomatch"))
            self.query_one("#node-nomatch").display = False
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        if self.events_only:        # escape brings the nodes back from the Events pane
            self.show_events(False)
        found = self.query("#node-filter")
        if not found:
            return
        box = cast("Input", found.first())      # made on the first `/` (action_filter)
        box.value = ""
        box.display = False
        # Shown again here, not when the Input's Changed message arrives: the focus below needs a panel on screen.
        self.apply_filter("")
        if self.panels:
            next(iter(self.panels.values())).focus()

    def apply_filter(self, needle: str) -> None:
        """Only the panels whose node name holds `needle`; a line that says so when none does."""
        needle = needle.strip().lower()
        shown = 0
        for name, panel in self.panels.items():
            panel.display = not needle or needle in name.lower()
            shown += panel.display
        for empty in cast("list[Static]", list(self.query("#node-nomatch"))):
            empty.display = bool(self.panels) and not shown
            # Text, not markup: what the operator typed (`[/`, say) is shown as typed, never parsed as a tag
            empty.update(Text(f"no node matches {needle!r} (escape clears the filter)"))

    def on_input_changed(self, event) -> None:      # Input.Changed
        if event.input.id == "node-filter":
            self.apply_filter(event.value)

    def on_input_submitted(self, event) -> None:    # Input.Submitted
        if event.input.id == "node-filter":
            shown = [p for p in self.panels.values() if p.display]
            if shown:
                shown[0].focus()

    def on_guard_list_fix_requested(self, event: GuardList.FixRequested) -> None:
        panel = next((p for p in event.guard_list.ancestors if isinstance(p, NodePanel)), None)
        if panel is not None:
            self.facade.confirm_guard_fix(panel.node_name, event.result)

    def drawn(self) -> Collection[Widget]:
        """The widgets worth updating now: those the last frame drew, at least in part (the compositor's cached
        map), and none while another screen is on top. Updating a widget outside it (the rows of a panel cut off
        by the bottom edge, say) would make Textual arrange every widget of the screen again on its next update:
        ~5 ms with 32 panels, several times a second."""
        return self._compositor.visible_widgets.keys() if self.is_current else ()

    def on_screen_resume(self) -> None:
        self.facade.mark_all_dirty()

    def on_descendant_focus(self) -> None:
        self.facade.mark_all_dirty()     # focus may scroll other panels into view

    def complete(self) -> bool:
        """Composed, with the focused panel's keys on the key bar."""
        return self.is_mounted and self.focused is not None and bool(self.query_one(KeyBar).keys)

    @property
    def launches(self) -> LaunchBar:
        return self.query_one(LaunchBar)

    @property
    def events(self) -> AlertLog:
        return self.query_one(AlertLog)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
