"""Screen 3: start / stop sweeps and watch decode t/s, prefill t/s and TTFT against concurrency, one line per
topology, extended as each level lands; levels run while a node throttled are marked; past runs and the
published reference can be overlaid."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..widgets.curve_chart import CurveChart
from ..widgets.sim_badge import SimBadge

# (chart id, title, unit, LevelResult attribute names tried in order)
METRICS = (
    ("decode", "decode", "t/s", ("decode_tps", "gen_tps", "tg_tps")),
    ("prefill", "prefill", "t/s", ("prefill_tps", "prompt_tps", "pp_tps")),
    ("ttft", "TTFT p50", "s", ("ttft_p50_s", "ttft_s", "ttft_median_s")),
)


def level_value(level, names) -> float | None:
    for n in names:
        v = getattr(level, n, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


class BenchScreen(Screen):
    BINDINGS = [
        Binding("b", "start", "Start sweep"),
        Binding("x", "stop", "Stop sweep"),
        Binding("p", "past", "Past runs"),
        Binding("f", "reference", "Reference"),
    ]

    def __init__(self) -> None:
        super().__init__(id="bench")
        self.sweep_worker = None
        self.levels: list = []
        self.show_past = False
        self.show_reference = False

    def compose(self) -> ComposeResult:
        yield Header()
        if self.app.simulated:
            yield SimBadge()
        yield Static(Text("b starts a sweep against the first endpoint; levels appear as they land", style="dim"),
                     id="bench-status")
        with Grid(id="bench-charts"):
            for cid, title, unit, _ in METRICS:
                yield CurveChart(title, unit, id=f"chart-{cid}")
        yield Footer()

    def charts(self) -> dict[str, CurveChart]:
        return {cid: self.query_one(f"#chart-{cid}", CurveChart) for cid, *_ in METRICS}

    def status(self, text: str, style: str = "") -> None:
        if self.is_mounted:
            self.query_one("#bench-status", Static).update(Text(text, style=style))

    def add_level(self, level, label: str | None = None, style: str = "line") -> None:
        """One measured level (the bench layer's LevelResult) onto every chart."""
        self.levels.append(level)
        label = label or str(getattr(level, "topology", None) or getattr(level, "label", None) or "run")
        conc = int(getattr(level, "concurrency", 0) or 0)
        note = getattr(level, "thermal", None) or getattr(level, "thermal_note", None)
        throttled = bool(getattr(level, "throttled", False) or (note is not None and getattr(note, "throttled", False)))
        for cid, _, _, names in METRICS:
            self.charts()[cid].put(label, conc, level_value(level, names), throttled=throttled, style=style)

    def action_start(self) -> None:
        if self.sweep_worker is not None and self.sweep_worker.is_running:
            self.notify("a sweep is already running (x stops it)", severity="warning")
            return
        self.sweep_worker = self.run_worker(self._sweep(), exit_on_error=False, group="sweep")

    def action_stop(self) -> None:
        if self.sweep_worker is None or not self.sweep_worker.is_running:
            self.notify("no sweep is running")
            return
        self.sweep_worker.cancel()
        self.status("sweep stopped; levels already measured are kept", "yellow")

    async def _sweep(self) -> None:
        try:
            from ...bench import sweep as sweep_mod
        except ImportError as exc:
            self.status(f"bench layer not available: {exc}", "red")
            return
        app = self.app
        if not app.cluster.endpoints:
            self.status("no endpoint in the cluster file to benchmark", "red")
            return
        ep = app.cluster.endpoints[0]
        try:
            spec = sweep_mod.SweepSpec(url=ep.url)
            self.status(f"sweeping {ep.name} ({ep.url})…", "cyan")
            await sweep_mod.run_sweep(spec, on_level=lambda lv: self.add_level(lv, ep.name),
                                      thermal_probe=app.thermal_note)
            self.status(f"sweep of {ep.name} done: {len(self.levels)} levels", "green")
        except Exception as exc:
            self.status(" ".join(str(exc).split())[:200], "red")

    def action_past(self) -> None:
        self.show_past = not self.show_past
        if not self.show_past:
            for c in self.charts().values():
                c.drop("past")
        self.notify("past runs " + ("shown" if self.show_past else "hidden"))

    def action_reference(self) -> None:
        self.show_reference = not self.show_reference
        if not self.show_reference:
            for c in self.charts().values():
                c.drop("reference")
        self.notify("published reference " + ("shown" if self.show_reference else "hidden"))
