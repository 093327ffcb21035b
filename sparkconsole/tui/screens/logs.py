"""Screen 4: the vLLM container log of one node, followed (`docker logs -f --tail 200`), searchable with `/`."""

from __future__ import annotations

import collections
import shlex

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Input, RichLog, Static

from ... import secrets
from ..facade import OnConsole
from ..fmt import one_line, plural
from ..widgets.key_bar import KeyBar
from ..widgets.sim_badge import SimBadge

MAX_LINES = 5000


def logs_command(container: str) -> str:
    # vLLM logs to stderr; the transport streams stdout, so fold them together.
    return f"docker logs -f --tail 200 {shlex.quote(container)} 2>&1"


class LogsScreen(OnConsole, Screen):
    AUTO_FOCUS = "#log"
    BINDINGS = [
        Binding("slash", "search", "Search"),
        Binding("escape", "clear_search", "Clear search"),
        Binding("n", "next_node", "Next node"),
        Binding("f", "toggle_follow", "Follow"),
    ]

    def __init__(self) -> None:
        super().__init__(id="logs")
        self.node_name: str | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=MAX_LINES)
        self.needle = ""
        self._stream = None

    def compose(self) -> ComposeResult:
        yield Header()
        if self.facade.simulated:
            yield SimBadge()
        yield Static("", id="logs-status")
        yield Input(placeholder="search the log (escape clears)", id="log-search")
        yield RichLog(id="log", max_lines=MAX_LINES, wrap=False, markup=False, auto_scroll=True)
        yield KeyBar()

    def on_mount(self) -> None:
        name = self.node_name or (self.facade.cluster.nodes[0].name if self.facade.cluster.nodes else None)
        if name:
            self._tail(name)

    def follow(self, node_name: str) -> None:
        if node_name == self.node_name and self._stream is not None:
            return
        self.node_name = node_name
        if not self.is_mounted:
            return                      # on_mount starts the tail
        self.lines.clear()
        if self.is_mounted:
            self.query_one(RichLog).clear()
        self._tail(node_name)

    def _status(self, text: str, style: str = "") -> None:
        line = Text()
        line.append(f"{self.node_name} ", style="bold")
        line.append(text, style=style)
        if self.needle:
            line.append(f"   search: {self.needle!r} ({plural(sum(self.needle in ln.lower() for ln in self.lines), 'line')})", style="cyan")
        self.query_one("#logs-status", Static).update(line)

    @work(exclusive=True, group="log-tail")
    async def _tail(self, node_name: str) -> None:
        self.node_name = node_name
        nm = self.facade.node_monitor(node_name)
        node = self.facade.cluster.node(node_name)
        transport = getattr(nm, "transport", None) if nm else None
        if transport is None:
            self._status("no connection to the node yet; press n or l again once it is LIVE", "yellow")
            return
        cmd = logs_command(node.container)
        self._status(f"$ {cmd}", "dim")
        stream = transport.stream(cmd)
        self._stream = stream
        try:
            async for raw in stream:
                self.add_line(raw)
            self._status(f"log ended (rc {stream.returncode})", "yellow")
        except Exception as exc:  # a lost connection ends the tail, not the console
            self._status(f"log stopped: {one_line(exc, 120)}", "red")
        finally:
            self._stream = None
            await stream.close()

    def add_line(self, raw: str) -> None:
        line = secrets.redact(raw.rstrip("\n"))
        self.lines.append(line)
        if not self.needle or self.needle in line.lower():
            self.query_one(RichLog).write(self._styled(line))

    def _styled(self, line: str) -> Text:
        style = "red" if ("ERROR" in line or "Traceback" in line) else ("yellow" if "WARNING" in line else "")
        text = Text(line, style=style)
        if self.needle:
            text.highlight_words([self.needle], style="reverse", case_sensitive=False)
        return text

    def _redraw(self) -> None:
        log = self.query_one(RichLog)
        log.clear()
        for line in self.lines:
            if not self.needle or self.needle in line.lower():
                log.write(self._styled(line))
        self._status("following" if self._stream else "", "dim")

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    def action_clear_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.value = ""
        box.display = False
        self.query_one(RichLog).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.needle = event.value.strip().lower()
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(RichLog).focus()

    def action_next_node(self) -> None:
        names = [n.name for n in self.facade.cluster.nodes]
        if names:
            i = names.index(self.node_name) + 1 if self.node_name in names else 0
            self.node_name = None
            self.follow(names[i % len(names)])

    def action_toggle_follow(self) -> None:
        log = self.query_one(RichLog)
        log.auto_scroll = not log.auto_scroll
        if log.auto_scroll:
            log.scroll_end(animate=False)
        self.notify("following the log" if log.auto_scroll else "paused scrolling (the tail keeps reading)")
