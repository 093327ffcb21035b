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
from ...nodes.samples import REASON_SEVERITY, REASON_WORDS, NodeState, Tick
from ...nodes.thermal import reason_durations
from ...nodes.workload_memory import host_gpu_processes, workload_memory
from ..facade import OnConsole
from ..fmt import DASH, duration, gib, num, since_iso
from .guard_list import GuardList
from .memory_bar import MemoryBar
from .temp_graph import TempGraph


def _g(b: float | None) -> str:
    """GiB without the unit (the row says GiB once); `?` where not measured."""
    return "?" if b is None else f"{b / 2**30:.1f}"


_SEVERITY_STYLE = {"bad": "bold red", "warn": "yellow", "dim": "dim", "info": "cyan"}
_STATE_STYLE = {"LIVE": "green", "CONNECTING": "yellow", "STALE": "bold yellow", "DOWN": "bold red"}


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
        """Draw a NodeMonitor's latest state (nothing here blocks; cheap enough for 32 nodes at a few Hz).
        `drawn`: the widgets on screen (DashboardScreen.drawn); the panel's rows outside it are left as they are
        (a panel cut off by the bottom edge). None draws every row."""
        now = time.time() if now is None else now
        thresholds = thresholds or Thresholds()
        state = nm.state.value if isinstance(nm.state, NodeState) else str(nm.state)
        self.state = state
        stale = state in ("STALE", "DOWN")
        self.set_class(stale, "-stale")
        self.set_class(state == "DOWN", "-down")
        last: Tick | None = nm.last
        info = nm.info
        sub = Text()
        if state == "LIVE" and self.facade.replay_at is not None:
            sub.append("REPLAY", style="bold magenta")     # a recorded moment plays: nothing here is live
        else:
            sub.append(state, style=_STATE_STYLE.get(state, ""))
        if state != "LIVE":
            sub.append(f" {duration(now - nm.since)}")
            if nm.last_error and state == "DOWN":
                sub.append(f" · {nm.last_error[:60]}", style="red")
        if last is not None and state != "LIVE":
            # Only a node that stopped ticking needs its age; a LIVE subtitle then stays still (no repaint).
            sub.append(f" · last tick {duration(now - last.received)} ago", style="dim")
        self._set_border("border_subtitle", sub)
        gname = info.gpu_names[0] if info and info.gpu_names else None
        title = Text(self.node_name, style="bold")
        if gname:
            title.append(f" · {gname}", style="dim")
        if info and info.simulated:
            title.append(" · sim", style="magenta")
        self._set_border("border_title", title)

        grey = "grey50" if stale else None
        gpu = last.gpus[0] if last and last.gpus else None
        temp_line = Text(no_wrap=True, overflow="ellipsis")
        if gpu is None:
            temp_line.append("GPU ", style="bold")
            if last is None:
                temp_line.append("waiting for the agent…", style="dim")
            else:
                source = info.gpu_source if info and info.gpu_source else "?"
                temp_line.append(f"{DASH} no GPU readings (source: {source})", style="dim")
                if last.errors:
                    temp_line.append(f"  {last.errors[0][:80]}", style="red")
        else:
            margin = gpu.slowdown_margin_c
            t_style = grey or ("bold red" if margin is not None and margin <= thresholds.temp_margin_c else "bold")
            temp_line.append("GPU ", style="bold")
            temp_line.append(num(gpu.temp_c, "°C"), style=t_style)
            temp_line.append(f"  slowdown {num(gpu.slowdown_c, '°C')}", style=grey or "")
            if margin is not None:
                temp_line.append(f" ({margin:.0f}° margin)", style=grey or "dim")
            if gpu.shutdown_c is not None:
                temp_line.append(f"  shutdown {num(gpu.shutdown_c, '°C')}", style=grey or "dim")
            if last and len(last.gpus) > 1:
                temp_line.append(f"  GPU 0 of {len(last.gpus)}", style="dim")
        self._put("temp-line", temp_line, drawn)

        graph = self._graph
        if drawn is None or graph in drawn:
            graph.set_data(self._recent_temps(nm.history, graph.wanted), gpu.slowdown_c if gpu else None, stale)

        reasons = Text(no_wrap=True, overflow="ellipsis")
        reasons.append("Clocks ", style="bold")
        if gpu is None or gpu.reasons_mask is None and not gpu.reasons:
            reasons.append(DASH, style="dim")
        elif not gpu.reasons:
            reasons.append("no clock-event reason active", style=grey or "green")
        else:
            spans = reason_durations(nm.history, last) if last is not None else {}
            for i, r in enumerate(sorted(gpu.reasons, key=lambda r: ("bad", "warn", "info", "dim").index(
                    REASON_SEVERITY.get(r, "info")))):
                if i:
                    reasons.append(" · ", style="dim")
                reasons.append(REASON_WORDS.get(r, r), style=grey or _SEVERITY_STYLE.get(REASON_SEVERITY.get(r, ""), ""))
                reasons.append(f" {duration(spans.get(r))}", style="dim")
        self._put("reasons", reasons, drawn)

        power = Text(no_wrap=True, overflow="ellipsis")
        if gpu is not None:
            power.append("Power ", style="bold")
            power.append(num(gpu.power_w, " W"), style=grey or "")
            if gpu.power_limit_w is not None:
                power.append(f" / {gpu.power_limit_w:.0f} W", style="dim")
            power.append("  SM ", style="bold")
            power.append(num(gpu.sm_clock_mhz, " MHz"), style=grey or "")
            if gpu.sm_clock_max_mhz is not None:
                power.append(f" / {gpu.sm_clock_max_mhz:.0f}", style="dim")
            power.append("  Util ", style="bold")
            power.append(num(gpu.util_pct, "%"), style=grey or "")
        self._put("power", power, drawn)

        bar = self._bar
        if drawn is None or bar in drawn:
            bar.floor_gib = thresholds.headroom_floor_gib
            bar.set_data(last.mem if last else None, last.pressure if last else None, stale)
        checklist = self._checklist
        if drawn is None or checklist in drawn:
            checklist.set_results(guards, stale)
        self._put("container", self._container_line(nm.containers, now, grey), drawn)
        self._put("workloads", self._workloads_line(last, grey), drawn)
        if self.postmortem is not None:
            self._draw_postmortem()

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

    def _container_line(self, containers, now: float, grey: str | None) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("vLLM ", style="bold")
        c = next((c for c in containers if c.name == self.container_name), None)
        if c is None:
            line.append(f"{self.container_name}: not reported", style="dim")
            return line
        state_style = grey or ("green" if c.state == "running" else "red")
        line.append(f"{c.name} ", style=grey or "")
        line.append(c.state or DASH, style=state_style)
        if c.health:
            line.append(f" {c.health}", style=grey or {"healthy": "green", "unhealthy": "red"}.get(c.health, "yellow"))
        if c.state == "running":
            line.append(f"  up {duration(since_iso(c.started_at, now))}", style=grey or "")
        line.append(f"  restarts {num(c.restart_count)}", style=grey or ("yellow" if c.restart_count else ""))
        line.append(f"  cap {gib(c.memory_limit_b) if c.memory_limit_b else 'none'}",
                    style=grey or ("" if c.memory_limit_b else "yellow"))
        if c.oom_killed:
            line.append("  OOMKilled", style="bold red")
        elif c.state == "exited":
            line.append(f"  exit {num(c.exit_code)}", style=grey or "red")
        labels = dict(c.labels)
        if labels.get("sparkconsole.topology"):
            # which launch it belongs to: a worker's row alone does not say it serves another node's endpoint
            line.append(f"  {labels.get('sparkconsole.recipe', '?')} × {labels['sparkconsole.topology']} "
                        f"{labels.get('sparkconsole.role', '')}", style=grey or "cyan")
        return line

    @staticmethod
    def _workloads_line(last: Tick | None, grey: str | None) -> Text:
        """What each workload holds, largest first: GPU memory of its processes (NVML) and its cgroup against its cap
        — on a GB10 the cap holds only the cgroup part. A part not measured is `?`, and the reason is said."""
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("Workloads ", style="bold")
        works = sorted(workload_memory(last).values(), key=lambda w: -(w.total_b or 0)) if last else []
        loose = host_gpu_processes(last) if last else ()
        if not works and not loose:
            line.append(DASH if last is None else "none running", style="dim")
            return line
        why = None
        for i, w in enumerate(works):
            if i:
                line.append(" · ", style="dim")
            line.append(f"{w.container} ", style=grey or "")
            if w.measured:
                line.append(gib(w.total_b), style=grey or "bold")
            line.append(" (" if w.measured else "(", style="dim")
            line.append(f"GPU {_g(w.gpu_b)}", style=grey or "")
            line.append(f" + CPU {_g(w.cgroup_b)}" + (f" of {_g(w.cap_b)} cap" if w.cap_b else ""), style=grey or "dim")
            line.append(")", style="dim")
            why = why or w.reason
        for p in loose[:2]:
            line.append(" · ", style="dim")
            line.append(f"PID {p.pid}" + (f" {p.comm}" if p.comm else "") + f" {gib(p.used_b)}", style=grey or "yellow")
        if why:
            line.append(f"  {why}", style=grey or "yellow")
        return line

    def check_action(self, action: str, parameters) -> bool | None:
        # Read-only console, or a recorded moment (REPLAY): nothing to act on, so the keys are hidden too.
        return not (action in ("restart", "stop", "launch", "fix") and (
            self.facade.read_only or self.facade.replay_at is not None))

    def action_fix(self) -> None:
        """f / Enter: the fix of the first guard that is not ok (what Enter on its row in the checklist asks)."""
        results = self._checklist.results
        wanted = next((r for r in results if r.status in ("bad", "warn") and r.fix), None) \
            or next((r for r in results if r.status != "ok"), None)
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
