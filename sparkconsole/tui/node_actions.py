"""The node-changing actions of the console: each asks first (ConfirmScreen shows the exact command), is refused in
a read-only console, is written to the audit log before it is sent, and says how it ended in the events pane.

A mixin of SparkConsoleApp: it uses the app's cluster, node monitors, dashboard and notify.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .fmt import one_line
from .screens.confirm import ConfirmScreen

if TYPE_CHECKING:
    from textual.app import App

    from ..config import ClusterConfig
    from .screens.dashboard import DashboardScreen

    _App = App[None]
else:
    _App = object


class NodeActions(_App):
    if TYPE_CHECKING:       # what SparkConsoleApp (tui/app.py) gives its actions
        cluster: ClusterConfig
        dashboard: DashboardScreen
        read_only: bool
        replay_at: float | None
        _live_monitor: Any
        core: Any

        def node_monitor(self, name: str) -> Any: ...

    def confirm_container(self, node_name: str, action: str) -> None:
        from ..nodes.launches import alone_words
        node = self.cluster.node(node_name)
        argv = ["docker", action, node.container]
        launches = self.core.launches if self.core is not None else []     # the core's groups of the last change
        self.confirm(f"{action.capitalize()} the vLLM container on {node_name}?", shlex.join(argv),
                     lambda: self.run_on_node(node_name, f"container-{action}", argv),
                     alone_words(launches, node_name, node.container, action) if action in ("stop", "restart") else "")

    def confirm_guard_fix(self, node_name: str, result) -> None:
        if not result.fix:
            self.notify(f"{result.title}: {result.reason} (no command fixes this from here)", title=node_name)
            return
        self.confirm(f"Fix '{result.title}' on {node_name}?", result.fix,
                     lambda: self.run_on_node(node_name, f"guard-fix:{result.key}", result.fix), result.reason)

    def confirm(self, title: str, command: str, then: Callable[[], Awaitable[object]], detail: str = "") -> None:
        # Every node-changing action (container restart/stop, guard fixes, recipe launch/restart/stop) asks here.
        if self.read_only:
            self.notify("read-only console: nothing was run", severity="warning", timeout=4)
            return
        if self.replay_at is not None:
            self.notify("REPLAY shows a past moment: nothing was run" +
                        ("; ] returns to live" if self._live_monitor is not None else ""), severity="warning", timeout=5)
            return
        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(then(), exit_on_error=False)
            else:
                self.notify("cancelled: nothing was run", timeout=3)
        self.push_screen(ConfirmScreen(title, command, detail), answered)

    async def run_on_node(self, node_name: str, action: str, command) -> None:
        """Run one confirmed command on a node through its transport; audit-logged before it is sent."""
        nm = self.node_monitor(node_name)
        transport = getattr(nm, "transport", None)
        text = command if isinstance(command, str) else shlex.join(command)
        if self.read_only:
            return
        if transport is None:
            self.notify(f"{node_name} is not connected: nothing was run", severity="error")
            return
        from .. import audit
        audit.record(action, node_name, text)
        self.dashboard.events.note(f"{node_name}: $ {text}", "cyan")
        try:
            result = await transport.run(command, timeout=120)
        except Exception as exc:
            self.notify(f"{node_name}: {one_line(exc, 200)}", severity="error")
            self.dashboard.events.note(f"{node_name}: failed: {exc}", "red")
            return
        out = one_line(result.stderr or result.stdout, 200)
        if result.rc == 0:
            self.notify(f"{node_name}: {action} done", title="ok")
            self.dashboard.events.note(f"{node_name}: {action} done", "green")
        else:
            self.notify(f"{node_name}: {action} failed (rc {result.rc}) {out}", severity="error", timeout=15)
            self.dashboard.events.note(f"{node_name}: {action} rc {result.rc}: {out}", "red")
