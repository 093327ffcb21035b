"""The one way the console's screens and widgets reach the console: a small typed facade over SparkConsoleApp (as
nvitop's TUI reaches what lies below it through one API), so a screen depends on what it reads and asks for, not on
the app's mixins, its start-up attributes or its other screens.

    class LogsScreen(OnConsole, Screen):
        def on_mount(self) -> None:
            name = self.facade.cluster.nodes[0].name
            self.facade.confirm("Stop …?", "docker stop …", then)

Textual's own App API that a widget needs as a widget (a key's display, the bell, simulate_key) stays on
`self.app`. tests/test_tui_facade.py fails on a screen or widget that reaches the app any other way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel
    from textual.screen import Screen
    from textual.worker import Worker

    from ..bench.results import ThermalNote
    from ..config import ClusterConfig
    from ..launch.lint import Facts
    from ..launch.steps import Plan
    from ..nodes.guard import GuardResult
    from ..nodes.launches import LaunchGroup
    from ..nodes.monitor import ClusterMonitor, NodeMonitor
    from ..recorder.feed import Recorder
    from .widgets.alert_log import AlertLog


class _Running(Protocol):
    """What the facade reads of the recipes screen: the workloads it lists and the plans it launched."""
    running_plans: dict[str, Plan]

    def running_groups(self) -> list[Any]: ...

    def _chosen_launch(self) -> Any: ...


class _Dashboard(Protocol):
    @property
    def events(self) -> AlertLog: ...


class Console(Protocol):
    """What the facade reads of the App it wraps (tui/app.py's SparkConsoleApp), named here so that the facade
    does not import the App that builds it."""
    cluster: ClusterConfig
    simulated: bool
    read_only: bool
    replay_at: float | None
    monitor: Any
    restart_stages: dict[tuple[str, str], str]
    sub_title: Any

    @property
    def dashboard(self) -> _Dashboard: ...

    @property
    def recipes_screen(self) -> _Running: ...

    @property
    def recorder(self) -> Any: ...

    def node_monitor(self, name: str) -> Any: ...

    def node_facts(self) -> Any: ...

    def thermal_note(self) -> Any: ...

    def mark_all_dirty(self) -> None: ...

    def notify(self, message: str, *, title: str = ..., severity: SeverityLevel = ...,
               timeout: float | None = ..., markup: bool = ...) -> None: ...

    def confirm(self, title: str, command: str, then: Callable[[], Any], detail: str = "") -> None: ...

    def confirm_guard_fix(self, node_name: str, result: Any) -> None: ...

    def confirm_container(self, node_name: str, action: str) -> None: ...

    def open_logs(self, node_name: str) -> None: ...

    def action_show(self, mode: str) -> Any: ...

    def push_screen(self, screen: Any, callback: Any = ..., wait_for_dismiss: bool = ...) -> Any: ...

    def run_worker(self, work: Any, *args: Any, **kw: Any) -> Worker[Any]: ...


class ConsoleFacade:
    """What the screens read of the console and what they ask it to do."""

    def __init__(self, app: Console) -> None:
        self._app = app

    # --- what the console shows ---------------------------------------------------------------------------
    @property
    def cluster(self) -> ClusterConfig:
        return self._app.cluster

    @property
    def simulated(self) -> bool:
        return self._app.simulated

    @property
    def read_only(self) -> bool:
        return self._app.read_only

    @property
    def replay_at(self) -> float | None:
        """The past moment shown (console --at, or scrubbed back with [ ), else None: live."""
        return self._app.replay_at

    @property
    def monitor(self) -> ClusterMonitor | None:
        """The node monitors drawn now (a replay's while scrubbed back); None before the first frame is up."""
        return self._app.monitor

    def nodes(self) -> Mapping[str, NodeMonitor]:
        """Each node's monitor drawn now; none before the first frame is up."""
        mon = self._app.monitor
        return mon.nodes if mon is not None else {}

    def node_monitor(self, name: str) -> NodeMonitor | None:
        return self._app.node_monitor(name)

    def node_facts(self) -> Facts:
        """What preflight learns from the live nodes (launch/lint.py's Facts)."""
        return self._app.node_facts()

    def thermal_note(self) -> ThermalNote | None:
        return self._app.thermal_note()

    @property
    def recorder(self) -> Recorder | None:
        """This console's flight recorder while it records (collector/duties.py), else None."""
        return self._app.recorder

    @property
    def events(self) -> AlertLog:
        """The dashboard's events pane."""
        return self._app.dashboard.events

    def workloads(self) -> list[LaunchGroup]:
        """The workloads running on the nodes now (their containers' labels), wherever they were started from."""
        return self._app.recipes_screen.running_groups()

    def chosen_workload(self) -> LaunchGroup | None:
        """The running workload the recipes screen's r / s act on (highlighted, the chosen recipe's, or the only one)."""
        return self._app.recipes_screen._chosen_launch()

    def launched_plan(self, workload: str) -> Plan | None:
        """The plan this console launched `workload` with, if it did."""
        return self._app.recipes_screen.running_plans.get(workload)

    @property
    def restart_stages(self) -> dict[tuple[str, str], str]:
        """(node, container) -> its stage while a restart from this console runs (the launch bar shows it)."""
        return self._app.restart_stages

    @restart_stages.setter
    def restart_stages(self, stages: dict[tuple[str, str], str]) -> None:
        self._app.restart_stages = stages

    # --- what the screens ask the console to do --------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None) -> None:
        self._app.notify(message, title=title, severity=severity, timeout=timeout)

    def confirm(self, title: str, command: str, then: Callable[[], Any], detail: str = "") -> None:
        """Every node-changing action asks here: refused read-only or on a past moment, else confirmed first."""
        self._app.confirm(title, command, then, detail)

    def confirm_guard_fix(self, node_name: str, result: GuardResult) -> None:
        self._app.confirm_guard_fix(node_name, result)

    def confirm_container(self, node_name: str, action: str) -> None:
        self._app.confirm_container(node_name, action)

    def open_logs(self, node_name: str) -> None:
        self._app.open_logs(node_name)

    def show(self, mode: str) -> None:
        """Switch to a screen: dashboard, recipes, bench, logs."""
        self._app.run_worker(self._app.action_show(mode))

    def push_screen(self, screen: Screen[Any], callback: Callable[[Any], Any] | None = None) -> None:
        self._app.push_screen(screen, callback)

    def run_worker(self, work: Any, **kw: Any) -> Worker[Any]:
        """A worker of the console's (it outlives a screen switch)."""
        return self._app.run_worker(work, **kw)

    def watch_title(self, widget: Any, callback: Callable[[str], None]) -> None:
        """callback(sub_title) each time the console's title line changes (a REPLAY and its time): what a widget
        that takes the header's row (the SIMULATED badge) says."""
        widget.watch(self._app, "sub_title", callback)

    def mark_all_dirty(self) -> None:
        """Redraw every node panel at the next frame (a scroll or a focus change may have shown others)."""
        self._app.mark_all_dirty()


class OnConsole:
    """Mixed into the console's screens and widgets: `self.facade`, the console they are drawn in."""

    if TYPE_CHECKING:
        app: Any

    @property
    def facade(self) -> ConsoleFacade:
        return self.app.facade
