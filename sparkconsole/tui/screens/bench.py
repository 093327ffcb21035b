"""Screen 3: start / stop sweeps and watch decode t/s, prefill t/s and TTFT against concurrency, one line per
topology, extended as each level lands; levels run while a node throttled are marked; past runs and the
published reference can be overlaid."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Header, Static

from ...nodes.samples import THROTTLING
from ...nodes.thermal import reason_of
from ...paths import DEFAULT_RESULTS, DEMO_RESULTS
from ..facade import OnConsole
from ..fmt import one_line, plural
from ..widgets.curve_chart import CurveChart
from ..widgets.key_bar import KeyBar
from ..widgets.sim_badge import SimBadge

if TYPE_CHECKING:
    from textual.worker import Worker

    from ...launch.steps import Plan

# (chart id, title, unit, LevelResult property)
METRICS = (
    ("decode", "decode", "t/s", "decode_tps"),
    ("prefill", "prefill", "t/s", "prefill_tps"),
    ("ttft", "TTFT", "ms", "ttft_ms"),
)


def level_value(level, name: str) -> float | None:
    v = getattr(level, name, None)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def throttled(level) -> bool:
    note = getattr(level, "thermal", None)
    return bool(note is not None and THROTTLING.intersection(reason_of(r) for r in note.throttle_reasons or ()))


def store_path(simulated: bool = False) -> Path:
    """The same results file the `sparkconsole bench` command writes by default, so past runs show here; a
    simulated cluster's go to the demo's file (as `bench matrix --demo`'s), never mixed with real ones."""
    return Path(DEMO_RESULTS if simulated else DEFAULT_RESULTS).absolute()


PAST_RUNS = 4
# (plotext colour, the same colour for Rich): one per series, the same on all three charts; red marks throttling.
COLOURS = (("cyan+", "bright_cyan"), ("magenta+", "bright_magenta"), ("green+", "bright_green"), ("blue+", "bright_blue"),
           ("orange", "dark_orange"), ("gray+", "grey70"), ("cyan", "cyan"), ("magenta", "magenta"), ("green", "green"))
_STYLE_WORD = {"line": "", "reference": "", "past": " (past)"}   # a reference's label says "published"


class BenchScreen(OnConsole, Screen):
    AUTO_FOCUS = None
    BINDINGS = [
        Binding("b", "start", "Start sweep"),
        Binding("x", "stop", "Stop sweep"),
        Binding("p", "past", "Past runs"),
        Binding("f", "reference", "Reference"),
    ]

    def __init__(self) -> None:
        super().__init__(id="bench")
        self.sweep_worker: Worker[None] | None = None
        self.colours: dict[str, tuple[str, str]] = {}
        self.legend: dict[str, str] = {}           # label -> style
        self.runs = 3
        self.concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
        self.levels: list = []
        self.show_past = False
        self.show_reference = False
        self.model: str | None = None              # through the gateway: the model the sweep asks for

    def compose(self) -> ComposeResult:
        yield Header()
        if self.facade.simulated:
            yield SimBadge()
        yield Static(Text("b starts a sweep against the router (else the first endpoint); levels appear as they "
                          "land; f overlays the published reference, p past runs", style="dim"), id="bench-status")
        yield Static("", id="bench-legend")
        with Grid(id="bench-charts"):
            for cid, title, unit, _ in METRICS:
                yield CurveChart(title, unit, id=f"chart-{cid}")
        yield KeyBar()

    def charts(self) -> dict[str, CurveChart]:
        return {cid: self.query_one(f"#chart-{cid}", CurveChart) for cid, *_ in METRICS}

    def status(self, text: str, style: str = "") -> None:
        if self.is_mounted:
            self.query_one("#bench-status", Static).update(Text(text, style=style))

    def add_level(self, level, label: str | None = None, style: str = "line") -> None:
        """One measured level (the bench layer's LevelResult) onto every chart."""
        if style == "line":
            self.levels.append(level)
        label = label or level.label
        hot = throttled(level)
        if label not in self.colours:
            self.colours[label] = COLOURS[len(self.colours) % len(COLOURS)]
            self.legend[label] = style
            self._draw_legend()
        for cid, _, _, name in METRICS:
            self.charts()[cid].put(label, level.key.concurrency, level_value(level, name), throttled=hot, style=style,
                                   colour=self.colours[label][0])
        if style == "line":
            self.status(f"{label}: c{level.key.concurrency} landed"
                        + ("  (a node throttled during this level)" if hot else ""), "yellow" if hot else "cyan")

    def _draw_legend(self) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        for label, style in self.legend.items():
            t.append("━━ " if style == "line" else "•• ", style=self.colours[label][1])
            t.append(label + _STYLE_WORD.get(style, ""), style="bold" if style == "line" else "")
            t.append("   ")
        if self.legend:
            t.append("x ", style="bold red")
            t.append("a node throttled during the level", style="dim")
        if self.is_mounted:
            self.query_one("#bench-legend", Static).update(t)

    def _forget(self, style: str) -> None:
        for c in self.charts().values():
            c.drop(style)
        for label in [k for k, v in self.legend.items() if v == style]:
            del self.legend[label]
            self.colours.pop(label, None)
        self._draw_legend()

    def target(self) -> tuple[str, str, Plan | None] | None:
        """(label, url, the plan launched from this console or None) of what `b` sweeps; None: nothing to sweep."""
        app = self.facade
        from ...launch import gateway
        via = gateway.url(app.cluster)
        if via is not None and self.models():
            return "gateway", via, None                  # one endpoint for every model: the sweep names its model
        g = app.chosen_workload()
        plan = app.launched_plan(g.name) if g is not None else None   # launched from this console: its topology
        if plan is not None and plan.endpoint:
            return plan.topology, plan.endpoint, plan
        if g is not None and g.endpoint:
            return g.name, g.endpoint, None
        if not app.cluster.endpoints:
            return None
        ep = next((e for e in app.cluster.endpoints if e.kind == "router"), app.cluster.endpoints[0])
        return ep.name, ep.url, None

    def models(self) -> list[str]:
        """The served model names of the workloads that serve now (what the gateway lists)."""
        return sorted({g.model for g in self.facade.workloads() if g.model and g.verdict == "SERVING"})

    def action_start(self) -> None:
        if self.sweep_worker is not None and self.sweep_worker.is_running:
            self.notify("a sweep is already running (x stops it)", severity="warning")
            return
        target = self.target()
        if target is None:
            self.status("no endpoint in the cluster file to benchmark", "red")
            return
        from .bench_setup import BenchSetupScreen, SweepChoice

        def chosen(choice: SweepChoice | None) -> None:
            if choice is None:
                self.notify("sweep cancelled: nothing was sent", timeout=3)
                return
            self.concurrency, self.runs, self.model = choice.concurrency, choice.runs, choice.model
            self.sweep_worker = self.run_worker(self._sweep(), exit_on_error=False, group="sweep")
        label, url, _ = target
        models = tuple(self.models()) if label == "gateway" else ()
        g = self.facade.chosen_workload()
        model = (g.model if g is not None and g.model in models else None) or (models[0] if models else None)
        self.facade.push_screen(BenchSetupScreen(f"{label} ({url})", str(store_path(self.facade.simulated)),
                                                 SweepChoice(self.concurrency, self.runs, model), models), chosen)

    def action_stop(self) -> None:
        if self.sweep_worker is None or not self.sweep_worker.is_running:
            self.notify("no sweep is running")
            return
        self.sweep_worker.cancel()
        self.status("sweep stopped; levels already measured are kept", "yellow")

    async def _sweep(self) -> None:
        try:
            from ...bench import sweep as sweep_mod
            from ...bench.measure import run_sweep
        except ImportError as exc:
            self.status(f"bench layer not available: {exc}", "red")
            return
        app = self.facade
        target = self.target()
        if target is None:
            self.status("no endpoint in the cluster file to benchmark", "red")
            return
        label, url, plan = target
        from ...bench.results import ResultsStore
        path = store_path(app.simulated)
        try:
            model = self.model if label == "gateway" else None
            label = f"{model} via the gateway" if model else label
            spec = sweep_mod.SweepSpec(url=url, label=label, runs=self.runs, model=model,
                                       topology=plan.topology if plan is not None else None,
                                       concurrency=self.concurrency,
                                       recipe=plan.recipe if plan is not None else None)
            self.status(f"sweeping {spec.run_label} ({url})…", "cyan")
            await sweep_mod.check_reachable(url)
            path.parent.mkdir(parents=True, exist_ok=True)
            with ResultsStore(path) as store:
                out = await run_sweep(spec, store, on_level=self.add_level, thermal_probe=app.thermal_note,
                                                on_progress=lambda p: self.status(f"{spec.run_label}: {p.line()}", "cyan"))
            self.status(f"sweep of {spec.run_label} done: {plural(len(out.levels), 'level')} (run {out.run_id}) in "
                        f"{path}; sparkconsole bench report {path}", "green")
        except Exception as exc:
            self.status(one_line(exc, 200), "red")

    def action_past(self) -> None:
        self.show_past = not self.show_past
        self._forget("past")
        if self.show_past:
            from ...bench.results import ResultsStore
            path = store_path(self.facade.simulated)
            if not path.exists():
                self.notify("no past runs yet", severity="warning")
                return
            current = {lv.run_id for lv in self.levels}     # drawn as lines already: not "past"
            with ResultsStore(path) as store:
                runs = [r for r in store.runs() if r.run_id not in current and store.levels(r.run_id)][-PAST_RUNS:]
                for run in runs:
                    for lv in store.levels(run.run_id):
                        self.add_level(lv, f"{run.label} {time.strftime('%m-%d %H:%M', time.localtime(run.created))}",
                                       style="past")
            self.notify(f"{plural(len(runs), 'past run')} overlaid" if runs else "no past runs yet")
        else:
            self.notify("past runs hidden")

    def action_reference(self) -> None:
        self.show_reference = not self.show_reference
        self._forget("reference")
        if not self.show_reference:
            self.notify("published reference hidden")
            return
        from ...bench.benchy_io import bundled_published_csv, import_published_csv
        from ...bench.results import ResultsStore
        with ResultsStore(":memory:") as store:     # the bench layer reads the table; nothing is written
            for run_id in import_published_csv(store, bundled_published_csv()):
                for lv in store.levels(run_id):
                    self.add_level(lv, f"published {lv.label}", style="reference")
        self.notify("published reference shown (gpt-oss-120b, 2x DGX Spark)")
