"""One node: temperature and its history against the slowdown line, throttle reasons with how long each has been
active, power / SM clock / utilization, unified-memory headroom, the OOM-guard checklist, the vLLM container row and
what each workload holds (its processes' GPU memory + its cgroup, nodes/workload_memory.py).
A STALE or DOWN node says so and keeps its last values, greyed; once the flight recorder has explained an incident
(DOWN, a reboot, a dead container), its post-mortem's verdict stays on the panel until a newer one."""

from __future__ import annotations

import itertools
import time
from collections.abc import Collection, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from ...config import Thresholds
from ...nodes.samples import NodeState
from ...nodes.view import NodeView, fix_wanted, node_view
from ...timefmt import duration
from ..facade import OnConsole
from ..fmt import DASH, fit, gib, num, one_line
from .guard_list import GuardList
from .memory_bar import MemoryBar
from .temp_graph import TempGraph


def _g(b: float | None) -> str:
    """GiB without the unit (the row says GiB once); `?` where not measured."""
    return "?" if b is None else f"{b / 2**30:.1f}"


class NodePanel(OnConsole, Vertical, can_focus=True):
    BINDINGS = [
        Binding("l", "logs", "Logs"),
        Binding("r", "restart", "Restart vLLM"),
        Binding("s", "stop", "Stop vLLM"),
        Binding("f", "fix", "Fix guard"),
        Binding("enter", "fix", "Fix guard", show=False),
    ]

    def __init__(self, node_name: str, container_name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.node_name = node_name
        self.container_name = container_name
        self.border_title = node_name
        self.state: str = "CONNECTING"
        self.postmortem: dict | None = None
        self._lines: dict[str, Text] = {}
        # What the border shows, as set: Textual hands a border title back as markup, never equal to a Text, and
        # setting one repaints the whole panel.
        self._border: dict[str, Text] = {}

    def compose(self) -> ComposeResult:
        # Kept by name: show() runs for every panel in view at every redraw, and a query per row adds up.
        self._rows = {name: Static("", classes=name) for name in ("temp-line", "reasons", "power", "container",
                                                                   "workloads", "postmortem")}
        self._rows["temp-line"].update(Text("waiting for the agent…", style="dim"))
        self._graph, self._bar, self._checklist = TempGraph(), MemoryBar(), GuardList()
        yield self._rows["temp-line"]
        yield self._graph
        yield self._rows["reasons"]
        yield self._rows["power"]
        yield self._bar
        yield self._checklist
        yield self._rows["container"]
        yield self._rows["workloads"]
        yield self._rows["postmortem"]

    def _put(self, row: str, text: Text, drawn: Collection | None = None) -> None:
        """Update a one-row line only when it changed and is on screen; its height is fixed, so no layout pass is
        needed. A row off screen keeps its old text and is drawn by the first show() that finds it on screen."""
        if self._lines.get(row) != text:
            line = self._rows[row]
            if drawn is None or line in drawn:
                self._lines[row] = text
                line.update(text, layout=False)

    def _set_border(self, which: str, text: Text) -> None:
        if self._border.get(which) != text:
            self._border[which] = text
            setattr(self, which, text)

    def show(self, nm, guards: Sequence, now: float | None = None, thresholds: Thresholds | None = None,
             drawn: Collection | None = None) -> None:
        """Draw a NodeMonitor's latest state as nodes/view.py judges it (nothing here blocks; cheap enough for 32
        nodes at a few Hz). `drawn`: the widgets on screen (DashboardScreen.drawn); the panel's rows outside it are
        left as they are (a panel cut off by the bottom edge). None draws every row."""
        now = time.time() if now is None else now
        thresholds = thresholds or Thresholds()
        v = node_view(nm, guards, now, thresholds, replay=self.facade.replay_at is not None)
        self.state = nm.state.value if isinstance(nm.state, NodeState) else str(nm.state)
        stale = v.state.stale
        self.set_class(stale, "-stale")
        self.set_class(v.state.label == "DOWN", "-down")
        self._set_border("border_subtitle", self._subtitle(v))
        title = Text(self.node_name, style="bold")
        if v.gpu_name:
            title.append(f" · {v.gpu_name}", style="dim")
        if v.simulated:
            title.append(" · sim", style="magenta")
        self._set_border("border_title", title)
        grey = "grey50" if stale else None
        self._put("temp-line", self._temp_line(v, grey), drawn)
        graph = self._graph
        if drawn is None or graph in drawn:
            graph.set_data(self._recent_temps(nm.history, graph.wanted), v.gpu.slowdown_c if v.gpu else None, stale)
        self._put("reasons", self._reasons_line(v, grey), drawn)
        self._put("power", self._power_line(v, grey), drawn)
        last = nm.last
        bar = self._bar
        if drawn is None or bar in drawn:
            bar.floor_gib = thresholds.headroom_floor_gib
            bar.set_data(last.mem if last else None, last.pressure if last else None, stale)
        checklist = self._checklist
        if drawn is None or checklist in drawn:
            checklist.set_results(guards, stale, compact=getattr(self.screen, "short", False))
        self._put("container", self._container_line(v, grey), drawn)
        self._put("workloads", self._workloads_line(v, grey), drawn)
        if self.postmortem is not None:
            self._draw_postmortem()

    @staticmethod
    def _subtitle(v: NodeView) -> Text:
        sub = Text()
        sub.append(v.state.label, style=v.state.colour)
        if v.state.for_s is not None:
            sub.append(f" {duration(v.state.for_s)}")
        if v.state.error:
            sub.append(f" · {one_line(v.state.error, 60)}", style="red")
        if v.state.last_tick_age_s is not None:
            # Only a node that stopped ticking needs its age; a LIVE subtitle then stays still (no repaint).
            sub.append(f" · last tick {duration(v.state.last_tick_age_s)} ago", style="dim")
        return sub

    def _width(self, row: str) -> int | None:
        """The cells a one-row line has (None before the first layout: the whole row is kept)."""
        return self._rows[row].size.width or None

    def _temp_line(self, v: NodeView, grey: str | None) -> Text:
        g = v.gpu
        if g is None:
            said, _, source = (v.no_gpu or "").partition(" (source: ")
            parts = [("GPU ", "bold", 0), (said if said == "waiting for the agent…" else f"{DASH} {said}", "dim", 0)]
            if source:
                parts.append((f" (source: {source}", "dim", 2))
            if v.gpu_error:
                parts.append((f"  {v.gpu_error}", "red", 1))
            return fit(parts, self._width("temp-line"))
        parts = [("GPU ", "bold", 0), (num(g.temp_c, "°C"), grey or ("bold red" if g.temp_bad else "bold"), 0),
                 (f"  slowdown {num(g.slowdown_c, '°C')}", grey or "", 1)]
        if g.margin_c is not None:
            parts.append((f" ({g.margin_c:.0f}° margin)", grey or "dim", 2))
        if g.shutdown_c is not None:
            parts.append((f"  shutdown {num(g.shutdown_c, '°C')}", grey or "dim", 3))
        if g.count > 1:
            parts.append((f"  GPU 0 of {g.count}", "dim", 4))
        return fit(parts, self._width("temp-line"))

    def _reasons_line(self, v: NodeView, grey: str | None) -> Text:
        parts = [("Clocks ", "bold", 0)]
        if v.gpu is None or v.gpu.reasons is None:
            parts.append((DASH, "dim", 0))
        elif not v.gpu.reasons:
            width = self._width("reasons")
            parts.append(("no clock-event reason active" if not width or width >= 36 else "none active",
                          grey or "green", 0))
        for i, r in enumerate(v.gpu.reasons or () if v.gpu else ()):
            # the worst first; a reason that does not fit is left out whole, with its time
            parts += [(" · " if i else "", "dim", i), (r.word, grey or r.colour, i), (f" {duration(r.active_s)}", "dim", i)]
        return fit(parts, self._width("reasons"))

    def _power_line(self, v: NodeView, grey: str | None) -> Text:
        g = v.gpu
        if g is None:
            return Text()
        parts = [("Power ", "bold", 0), (num(g.power_w, " W"), grey or "", 0)]
        if g.power_limit_w is not None:
            parts.append((f" / {g.power_limit_w:.0f} W", "dim", 3))
        parts += [("  SM ", "bold", 2), (num(g.sm_mhz, " MHz"), grey or "", 2)]
        if g.sm_max_mhz is not None:
            parts.append((f" / {g.sm_max_mhz:.0f}", "dim", 4))
        parts += [("  Util ", "bold", 1), (num(g.util_pct, "%"), grey or "", 1)]
        return fit(parts, self._width("power"))

    @staticmethod
    def _recent_temps(history, wanted: int) -> list[float]:
        """The last `wanted` GPU temperatures, oldest first, without copying the whole ring."""
        hist = itertools.islice(reversed(history), min(wanted, len(history)))
        temps = [t.gpus[0].temp_c for t in hist if t.gpus and t.gpus[0].temp_c is not None]
        temps.reverse()
        return temps

    def show_postmortem(self, pm: dict) -> None:
        """The recorder's post-mortem of this node (recorder/postmortem.py's dict)."""
        self.postmortem = pm
        self.add_class("-postmortem")
        self._draw_postmortem()

    def _draw_postmortem(self) -> None:
        """One row: red while the node is still out, yellow once it is back."""
        pm, live = self.postmortem, self.state == "LIVE"
        if pm is None:
            return
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("Post-mortem ", style="bold")
        line.append(time.strftime("%H:%M:%S ", time.localtime(pm["time"])), style="dim")
        line.append(pm["verdict"], style="yellow" if live else "bold red")
        if pm.get("evidence"):     # the whole of it: `sparkconsole postmortem NODE`, as the events pane says
            line.append(f" — {pm['evidence'][0]}")
        self._put("postmortem", line)

    def _container_line(self, v: NodeView, grey: str | None) -> Text:
        c = v.container
        if c is None:
            return fit([("vLLM ", "bold", 0), (f"{v.container_name}: not reported", "dim", 0)],
                       self._width("container"))
        parts = [("vLLM ", "bold", 0), (f"{c.name} ", grey or "", 5), (c.state or DASH, grey or c.state_colour, 0)]
        if c.health:
            parts.append((f" {c.health}", grey or c.health_colour, 1))
        if c.up_s is not None:
            parts.append((f"  up {duration(c.up_s)}", grey or "", 2))
        parts.append((f"  restarts {num(c.restarts)}", grey or ("yellow" if c.restarts else ""), 3 if not c.restarts else 1))
        parts.append((f"  cap {gib(c.cap_b) if c.cap_b else 'none'}", grey or ("" if c.cap_b else "yellow"),
                      4 if c.cap_b else 1))
        if c.oom_killed:
            parts.append(("  OOMKilled", "bold red", 0))
        elif c.state == "exited":
            parts.append((f"  exit {num(c.exit_code)}", grey or "red", 0))
        if c.launch:
            # which launch it belongs to: a worker's row alone does not say it serves another node's endpoint
            parts.append((f"  {c.launch}", grey or "cyan", 6))
        return fit(parts, self._width("container"))

    def _workloads_line(self, v: NodeView, grey: str | None) -> Text:
        """What each workload holds, largest first: GPU memory of its processes (NVML) and its cgroup against its cap
        — on a GB10 the cap holds only the cgroup part. A part not measured is `?`, and the reason is said. On a
        narrow panel the smaller workloads go first, each whole."""
        if not v.workloads and not v.loose:
            return fit([("Workloads ", "bold", 0), ("none running" if v.read else DASH, "dim", 0)],
                       self._width("workloads"))
        parts: list[tuple[str, str, int]] = [("Workloads ", "bold", 0)]
        why = None
        for i, w in enumerate(v.workloads):
            # each workload its name and total, then its breakdown, each group whole: the later workloads go first,
            # then the first one's breakdown
            parts += [(" · " if i else "", "dim", 2 * i), (f"{w.container} ", grey or "", 2 * i)]
            if w.measured:
                parts.append((gib(w.total_b), grey or "bold", 2 * i))
            parts.append(((" (" if w.measured else "(") + f"GPU {_g(w.gpu_b)} + CPU {_g(w.cgroup_b)}"
                          + (f" of {_g(w.cap_b)} cap" if w.cap_b else "") + ")", grey or "dim", 2 * i + 1))
            why = why or w.reason
        for j, p in enumerate(v.loose[:2]):
            # a GPU process in no container: its PID and memory whole, its command name the first thing to go
            at = 2 * len(v.workloads) + 2 * j
            parts += [(" · " if v.workloads or j else "", "dim", at), (f"PID {p.pid}", grey or "yellow", at)]
            if p.comm:
                parts.append((f" {p.comm}", grey or "yellow", at + 1))
            parts.append((f" {gib(p.used_b)}", grey or "yellow", at))
        if why:
            parts.append((f"  {why}", grey or "yellow", 99))
        return fit(parts, self._width("workloads"))

    def check_action(self, action: str, parameters) -> bool | None:
        # Read-only console, or a recorded moment (REPLAY): nothing to act on, so the keys are hidden too.
        return not (action in ("restart", "stop", "launch", "fix") and (
            self.facade.read_only or self.facade.replay_at is not None))

    def action_fix(self) -> None:
        """f / Enter: the fix of the worst guard that has one (what Enter on its row in the checklist asks)."""
        results = self._checklist.results
        wanted = fix_wanted(results)
        if wanted is None:
            self.facade.notify(f"{self.node_name}: every guard is ok" if results
                            else f"{self.node_name}: no guard reading yet", title="guards")
            return
        self.facade.confirm_guard_fix(self.node_name, wanted)

    def action_logs(self) -> None:
        self.facade.open_logs(self.node_name)

    def action_restart(self) -> None:
        self.facade.confirm_container(self.node_name, "restart")

    def action_stop(self) -> None:
        self.facade.confirm_container(self.node_name, "stop")
