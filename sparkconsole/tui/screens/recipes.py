"""Screen 2: bundled and user recipes with their preflight verdict; a recipe × topology shows its plan node by
node; Enter launches it (after a confirmation) with a progress line per node; r / s restart / stop it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Input, OptionList, Static
from textual.widgets.option_list import Option

from ... import severity
from ...errors import UserError
from ..widgets.key_bar import KeyBar
from ..widgets.sim_badge import SimBadge
from .dashboard import NARROW_COLS
from .recipes_running import RecipeActions, _Finding, _one_line, running_options


def verdict(findings) -> severity.Severity:
    """The recipe's mark in the list: its worst finding's (severity.py), ✓ when there is none."""
    return severity.worst(severity.of_finding(f) for f in findings)


class RecipesScreen(RecipeActions, Screen):
    AUTO_FOCUS = "#recipe-list"
    BINDINGS = [
        Binding("enter", "launch", "Launch", priority=False),
        Binding("t", "next_topology", "Topology"),
        Binding("r", "restart", "Restart running"),
        Binding("s", "stop", "Stop running"),
        Binding("m", "copy_model", "Model to nodes"),
        Binding("i", "copy_image", "Image to nodes"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="recipes")
        self.entries: list[tuple[str, object, str | None]] = []   # (key, Recipe | None, load error)
        self.findings: dict[tuple[str, str], list] = {}
        self.selected: str | None = None
        self.topology: str | None = None
        self.plan = None
        self.running_plan = None
        self.runner = None
        self.progress: dict[str, str] = {}
        self.restarting: dict[str, str] | None = None   # service key -> its stage, while a restart runs
        self.restart_plan = None
        self.listed: list[str] = []        # the recipe keys the list shows (the filter's matches)
        self._pick_running = False
        self._loaded = False

    # --- data -------------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Recipes from the launch layer: bundled and user files (a broken file is listed with its error)."""
        if self._loaded:
            return
        self._loaded = True
        try:
            from ...launch import recipe as recipe_mod
        except ImportError as exc:
            self.entries = [("(launch layer missing)", None, _one_line(exc))]
            return
        try:
            paths = recipe_mod.recipe_paths()
        except UserError as exc:
            self.entries = [("(recipes)", None, _one_line(exc))]
            return
        for key, path in sorted(paths.items()):
            try:
                self.entries.append((key, recipe_mod.load_recipe(path), None))
            except UserError as exc:
                self.entries.append((key, None, _one_line(exc)))

    def recipe_choices(self) -> list[tuple[str, object]]:
        self.load()
        return [(key, r) for key, r, _ in self.entries if r is not None]

    def topologies(self, recipe) -> tuple[str, ...]:
        if recipe is None:
            return ()
        if recipe.topologies:
            return tuple(recipe.topologies)
        from ...launch.recipe import TOPOLOGIES
        return TOPOLOGIES

    def preflight(self, recipe, topology: str) -> list:
        key = (recipe.key, topology)
        if key not in self.findings:
            try:
                from ...launch import lint
                app = self.app
                found = list(lint.preflight(recipe, topology, app.cluster.nodes, app.node_facts(),
                                            plan=self._make_plan(recipe, topology)))
                if self._runs_as(recipe, topology) is not None:
                    # It runs: judged against itself, its own memory in use would read as a refusal. What r does
                    # (a restart frees it first) is what matters; the line under "running as" says so.
                    found = [f for f in found if f.rule != "memory_headroom"]
                self.findings[key] = found
            except UserError as exc:
                self.findings[key] = [_Finding("refuse", _one_line(exc), rule="plan")]
            except ImportError:
                self.findings[key] = []
            self.findings[key] += self._in_the_way(recipe, topology)
        return self.findings[key]

    def _runs_as(self, recipe, topology: str | None):
        """The running launch of this recipe in this topology, if there is one."""
        g = self.running_of(recipe.key)
        return g if g is not None and g.topology == topology else None

    def plan_options(self, recipe, topology: str) -> dict:
        """The plan options of what runs (its router, its port) when this recipe runs in this topology: the plan
        shown is the one running, not the recipe's defaults."""
        g = self._runs_as(recipe, topology)
        return running_options(g) if g is not None else {}

    def _make_plan(self, recipe, topology: str):
        from ...launch.plan import make_plan
        try:
            return make_plan(recipe, topology, self.app.cluster, self.plan_options(recipe, topology))
        except UserError:
            return None      # preflight plans again and reports why

    # --- view -------------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        if self.app.simulated:
            yield SimBadge()
        yield Input(placeholder="filter recipes (escape clears)", id="recipe-filter")
        with Horizontal():
            yield OptionList(id="recipe-list")
            with Vertical(id="recipe-detail"):
                with VerticalScroll(id="head-scroll"):      # a long preflight scrolls here, the plan stays
                    yield Static("", id="recipe-head")
                with VerticalScroll(id="plan-scroll"):
                    yield Static("", id="plan")
                yield Static("", id="launch-progress")
        yield KeyBar()

    def on_resize(self, event) -> None:         # events.Resize: a narrow terminal gives the plan the room
        self.set_class(event.size.width < NARROW_COLS, "-narrow")

    def on_mount(self) -> None:
        self.set_class(self.app.size.width < NARROW_COLS, "-narrow")
        self.load()
        self.query_one("#recipe-list").border_title = "Recipes"
        self.query_one("#plan-scroll").border_title = "Plan"
        self._pick_running = self.selected is None        # until the operator chooses: what runs is shown first
        self._select_running()
        self._fill_list("")
        if self.selected is None and self.recipe_choices():
            self.selected = self.recipe_choices()[0][0]
        self._show()
        self.query_one("#recipe-list").focus()

    def on_screen_resume(self) -> None:
        # Facts (guards, memory) move with the nodes: judge again each time the screen is shown.
        self.launches_changed()

    def _select_running(self) -> None:
        g = next(iter(self.running_groups()), None)
        if self._pick_running and g is not None and self._recipe(g.recipe) is not None:
            self.selected, self.topology = g.recipe, g.topology

    def launches_changed(self) -> None:
        """A launch started, stopped or changed verdict on the nodes: running marks and preflight judged again."""
        self._select_running()
        self.findings.clear()
        if self.is_mounted and self.entries:
            self._fill_list(self.query_one("#recipe-filter", Input).value.strip().lower())
            self._show()

    def _fill_list(self, needle: str) -> None:
        opts = []
        running = {}
        for g in self.running_groups():
            running.setdefault(g.recipe, g)
        for key, r, err in self.entries:
            if needle and needle not in key.lower() and (r is None or needle not in r.name.lower()):
                continue
            line = Text(no_wrap=True, overflow="ellipsis")
            if r is None:
                line.append("✗ ", style="red")
                line.append(key, style="bold")
                line.append(f"  {err}", style="red")
            else:
                g = running.get(key)
                if g is not None:
                    # Running: its own launch's verdict, not a preflight of launching it again over itself.
                    colour = "green" if g.verdict == "SERVING" else ("red" if g.verdict == "BROKEN" else "yellow")
                    line.append("● ", style=colour)
                    line.append(key, style="bold")
                    line.append(f"  {g.topology} {g.verdict.lower()}", style=colour)
                else:
                    topo = (self.topology if self.selected == key and self.topology else None) or self.topologies(r)[0]
                    v = verdict(self.preflight(r, topo))
                    line.append(f"{v.mark} ", style=v.colour)
                    line.append(key, style="bold")
                line.append(f"  {r.name}", style="dim")
            opts.append(Option(line, id=key))
        ol = self.query_one("#recipe-list", OptionList)
        ol.set_options(opts)
        self.listed = [o.id for o in opts]
        if self.selected not in self.listed:
            # The detail pane and Enter follow what the list shows: never a recipe the filter hid.
            self.selected = next((k for k in self.listed if self._recipe(k) is not None),
                                 self.listed[0] if self.listed else None)
            self.topology = None
            self._show()
        if self.selected in self.listed:
            ol.highlighted = self.listed.index(self.selected)

    def _recipe(self, key: str | None):
        return next((r for k, r, _ in self.entries if k == key and r is not None), None)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_index != event.option_list.highlighted:
            return          # a refill moved the highlight since: the newer one stands
        if event.option.id != self.selected:
            self._pick_running = False       # the operator chose: launches coming and going no longer move it
            self.selected = event.option.id
            self.topology = None
            self._show()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_launch()

    def choose(self, recipe) -> None:
        """From the command palette: show this recipe's plan on the recipes screen. The operator chose: what runs
        no longer takes the selection back (issue 39: a recipe entry opened the running gpt-oss-120b)."""
        self._pick_running = False
        self.selected, self.topology = recipe.key, None
        self.app.run_worker(self.app.action_show("recipes"))
        if self.is_mounted:
            box = self.query_one("#recipe-filter", Input)
            box.value, box.display = "", False          # a filter hiding it would choose another
            self._fill_list("")
            self._show()

    def _show(self) -> None:
        if not self.is_mounted:
            return
        head = self.query_one("#recipe-head", Static)
        plan_view = self.query_one("#plan", Static)
        r = self._recipe(self.selected)
        if r is None:
            err = next((e for k, _, e in self.entries if k == self.selected), None)
            needle = self.query_one("#recipe-filter", Input).value.strip()
            empty = f"no recipe matches {needle!r} (escape clears the filter)" if needle and not self.listed \
                else "no recipe chosen"
            head.update(Text(err or empty, style="red" if err else "dim"))
            plan_view.update("")
            self.plan = None
            return
        topos = self.topologies(r)
        if self.topology not in topos:
            self.topology = topos[0]
        t = Text()
        t.append(r.name, style="bold")
        t.append(f"  [{r.key}]  {r.model or ''}\n", style="dim")
        if r.description:
            t.append(r.description.strip().splitlines()[0] + "\n")
        t.append("topology: ")
        for name in topos:
            t.append(f" {name} ", style="reverse bold" if name == self.topology else "dim")
        t.append("   (t: next)\n", style="dim")
        g = self.running_of(r.key)
        if g is not None:
            t.append(f"● running as {g.topology} on {', '.join(dict.fromkeys(m.node for m in g.members))}: "
                     f"{g.verdict}{': ' + g.reason if g.reason else ''}", style="green" if g.verdict == "SERVING"
                     else "yellow")
            t.append("   (r: restart, s: stop)\n", style="dim")
            if g.topology == self.topology:
                t.append("  preflight below judges a relaunch, leaving out the memory this launch holds itself; the "
                         "plan is the running one" + (f" (router {g.router})" if g.router else "") + "\n", style="dim")
        findings = self.preflight(r, self.topology)
        for f in findings:
            sev = severity.of_finding(f)
            t.append(f"{sev.mark} ", style=sev.colour)
            if getattr(f, "node", None):
                t.append(f"{f.node}: ", style="bold")
            t.append(" ".join(f.message.split())[:220])
            if getattr(f, "fix", None):
                t.append(f" — fix: {' '.join(f.fix.split())[:120]}", style="dim")
            t.append("\n")
        if not findings:
            t.append("✓ preflight: nothing to report\n", style="green")
        head.update(t)
        plan_view.update(self._plan_text(r))

    def _plan_text(self, recipe) -> Text:
        text = Text()
        try:
            from ...launch.plan import make_plan
            self.plan = make_plan(recipe, self.topology, self.app.cluster, self.plan_options(recipe, self.topology))
        except UserError as exc:
            self.plan = None
            text.append(_one_line(exc), style="red")
            return text
        except ImportError as exc:
            self.plan = None
            text.append(f"planning is not available: {exc}", style="dim")
            return text
        for node, steps in plan_steps(self.plan):
            text.append(f"{node}\n", style="bold cyan")
            for i, step in enumerate(steps, 1):
                text.append(f" {i:>2}. {step.what}\n", style="" if step.change else "dim")
                text.append(f"     $ {step.shell()}\n", style="dim")
        for note in getattr(self.plan, "notes", ()):
            text.append(f"note: {note}\n", style="yellow")
        if getattr(self.plan, "endpoint", None):
            text.append(f"clients use {self.plan.endpoint}\n", style="cyan")
        return text

    # --- actions ----------------------------------------------------------------------------------------------
    def action_next_topology(self) -> None:
        topos = self.topologies(self._recipe(self.selected))
        if topos:
            i = topos.index(self.topology) + 1 if self.topology in topos else 0
            self.topology = topos[i % len(topos)]
            self._show()

    def action_launch(self) -> None:
        r = self._recipe(self.selected) if self.selected in self.listed else None
        if r is None or self.plan is None:
            self.notify("choose a recipe with a plan first", severity="warning")
            return
        if verdict(self.preflight(r, self.topology)).refuses:
            self.notify("preflight refuses this launch: fix the ✗ findings first", severity="error")
            return
        plan = self.plan
        nodes = ", ".join(plan.nodes)
        changes = [s for s in plan.steps if s.change]
        shown = "\n".join(f"{s.node}$ {s.shell()}" for s in changes[:6])
        more = f"\n… and {len(changes) - 6} more (see the plan)" if len(changes) > 6 else ""
        self.app.confirm(f"Launch {r.key} as {self.topology} on {nodes}?", shown + more,
                         lambda: self._launch(r, plan), f"{len(changes)} changing steps; progress shows below the plan.")

    def _runner(self):
        from ...launch.runner import Runner
        app = self.app
        transports = {name: nm.transport for name, nm in app.monitor.nodes.items() if nm.transport is not None}
        return Runner(app.cluster, transports)

    def _on_progress(self, ev) -> None:
        # One line per node: the runner's latest word on it wins.
        self.progress[ev.node or "cluster"] = " ".join(f"{ev.stage}: {ev.message}".split())[:160]
        self._draw_progress()
        self.restart_progress(ev)

    def _draw_progress(self) -> None:
        t = Text()
        for node, msg in self.progress.items():
            t.append(f"{node:>12} ", style="bold")
            t.append(msg + "\n", style="red" if "fail" in msg.lower() or "error" in msg.lower() else "")
        self.query_one("#launch-progress", Static).update(t)

    async def _launch(self, recipe, plan) -> None:
        self.progress = {n: "queued" for n, _ in plan_steps(plan)}
        self._draw_progress()
        try:
            self.runner = self._runner()
            await self.runner.launch(plan, self._on_progress)
            self.running_plan = plan
            self.app.notify(f"{recipe.key} launched", title="recipes")
        except Exception as exc:
            self.progress["launch"] = f"failed: {_one_line(exc)}"
            self._draw_progress()
            self.app.notify(_one_line(exc)[:300], title="launch failed", severity="error", timeout=20)

    def check_action(self, action: str, parameters) -> bool | None:
        # Read-only console or REPLAY: node-changing keys are hidden from the footer and do nothing.
        return not (action in ("restart", "stop", "launch", "copy_model", "copy_image")
                    and (getattr(self.app, "read_only", False) or getattr(self.app, "replay_at", None) is not None))

    def action_filter(self) -> None:
        box = self.query_one("#recipe-filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#recipe-filter", Input)
        box.value = ""
        box.display = False
        self.query_one("#recipe-list").focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.value.strip():
            self._pick_running = False       # a filter typed: the list follows it, not the launches
        self._fill_list(event.value.strip().lower())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one("#recipe-list").focus()


def plan_steps(plan) -> list[tuple[str, list]]:
    """(node, its ordered steps) for each node of the plan."""
    return [(n, plan.for_node(n)) for n in plan.nodes]
