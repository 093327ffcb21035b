"""Screen 2: bundled and user recipes with their preflight verdict; a recipe × topology shows its plan node by
node; Enter launches it beside what runs (after a confirmation that shows where placement puts it and why) with a
progress line per node. Below the recipes, every running workload (nodes, port, model, state): r / s restart /
stop the highlighted one. Above the plan, each node's memory budget bar (placement/bars.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Input, OptionList, Static
from textual.widgets.option_list import Option

from ... import severity
from ...errors import UserError
from ..facade import OnConsole
from ..fmt import one_line
from ..widgets.budget_bar import BudgetBars
from ..widgets.key_bar import KeyBar
from ..widgets.sim_badge import SimBadge
from .dashboard import NARROW_COLS
from .recipes_launch import RecipeLaunch, plan_steps, verdict
from .recipes_running import RecipeActions, _Finding

if TYPE_CHECKING:
    from ...launch.runner import Runner
    from ...launch.steps import Plan
    from ...nodes.launches import LaunchGroup
    from ...recipes import Recipe
    from ...recipes.catalog import Entry


class RecipesScreen(RecipeActions, RecipeLaunch, OnConsole, Screen):
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
        self.entries: list[tuple[str, Recipe | None, str | None]] = []   # (key, recipe, load error)
        self.findings: dict[tuple[str, str], list] = {}
        self._placed: dict[tuple[str, str], tuple] = {}    # (recipe, topology) -> where a launch would go now
        self.selected: str | None = None
        self.topology: str | None = None
        self.plan: Plan | None = None
        self.running_plans: dict[str, Plan] = {}   # workload name -> the plan this console launched it with
        self.runner: Runner | None = None
        self.progress: dict[str, str] = {}
        self.restarting: dict[str, str] | None = None   # service key -> its stage, while a restart runs
        self.restart_plan: Plan | None = None
        self.listed: list[str] = []        # the recipe keys the list shows (the filter's matches)
        self._pick_running = False
        self._loaded = False
        self.registry_entries: dict[str, Entry] = {}   # key -> its catalog entry, read in full when chosen

    # --- data -------------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Recipes from the launch layer: bundled and user files (a broken file is listed with its error)."""
        if self._loaded:
            return
        self._loaded = True
        try:
            from ... import recipes as recipe_mod
        except ImportError as exc:
            self.entries = [("(launch layer missing)", None, one_line(exc))]
            return
        try:
            paths = recipe_mod.recipe_paths()
        except UserError as exc:
            self.entries = [("(recipes)", None, one_line(exc))]
            return
        for key, path in sorted(paths.items()):
            try:
                self.entries.append((key, recipe_mod.load_recipe(path), None))
            except UserError as exc:
                self.entries.append((key, None, one_line(exc)))
        # The registries' recipes: listed from the catalog, each read in full only once chosen.
        from ...recipes.catalog import catalog
        try:
            self.registry_entries = {e.key: e for e in catalog() if e.registry not in ("local", "bundled")}
        except UserError:
            self.registry_entries = {}

    def recipe_choices(self) -> list[tuple[str, Recipe]]:
        self.load()
        return [(key, r) for key, r, _ in self.entries if r is not None]

    def topologies(self, recipe) -> tuple[str, ...]:
        if recipe is None:
            return ()
        if recipe.topologies:
            return tuple(recipe.topologies)
        from ...recipes import TOPOLOGIES
        return TOPOLOGIES

    def preflight(self, recipe, topology: str) -> list:
        key = (recipe.key, topology)
        if key not in self.findings:
            try:
                from ...launch import lint
                app = self.facade
                self.findings[key] = list(lint.preflight(recipe, topology, app.cluster.nodes, app.node_facts(),
                                                         plan=self._make_plan(recipe, topology)))
            except UserError as exc:
                self.findings[key] = [_Finding("refuse", one_line(exc), rule="plan")]
            except ImportError:
                self.findings[key] = []
            self.findings[key] += self._in_the_way(recipe, topology) + self._budget(recipe, topology)
        return self.findings[key]

    def _make_plan(self, recipe: Recipe, topology: str) -> Plan | None:
        """The plan as a launch from here would run it: placed beside what runs (its node, port and containers,
        placement/), else as the recipe says when placement cannot say (nothing read yet, or it does not fit)."""
        placed = self.placed(recipe, topology)
        if placed is not None and placed[0] is not None:
            return placed[0]
        from ...launch.plan import make_plan
        try:
            return make_plan(recipe, topology, self.facade.cluster, {"workload": self.new_name(recipe)})
        except UserError:
            return None      # preflight plans again and reports why

    def new_name(self, recipe) -> str:
        """A launch from here is named after its recipe; a second of one recipe gets -2, -3, …"""
        from ...launch.planning import default_workload
        running = {g.name for g in self.running_groups()}
        base = default_workload(recipe)
        name, i = base, 2
        while name in running:
            name, i = f"{base}-{i}", i + 1
        return name

    def placed(self, recipe, topology: str):
        """(plan, placement, None) where placement puts a launch of `recipe` now, or (None, None, why) when it does
        not fit; None when no node has been read yet."""
        key = (recipe.key, topology)
        if key in self._placed:
            return self._placed[key]
        from ...launch.beside import launch_options, place
        from ...launch.plan import make_plan
        from ...placement.fit import Ask
        readings = self.readings()
        if not readings.memory:
            return None
        name = self.new_name(recipe)
        got: tuple[Any, Any, Any]
        try:
            placement = place(readings, [Ask(name, recipe, topology, {"workload": name})])
            plan = make_plan(recipe, topology, self.facade.cluster, {"workload": name, **launch_options(placement, name)})
            got = (plan, placement, None)
        except UserError as exc:
            got = (None, None, exc)
        self._placed[key] = got
        return got

    # --- view -------------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        if self.facade.simulated:
            yield SimBadge()
        yield Input(placeholder="filter recipes (escape clears)", id="recipe-filter")
        with Horizontal():
            with Vertical(id="recipe-side"):
                yield OptionList(id="recipe-list")
                yield OptionList(id="workload-list")
            with Vertical(id="recipe-detail"):
                yield BudgetBars(id="budget")
                with VerticalScroll(id="head-scroll"):      # a long preflight scrolls here, the plan stays
                    yield Static("", id="recipe-head")
                with VerticalScroll(id="plan-scroll"):
                    yield Static("", id="plan")
                yield Static("", id="launch-progress")
        yield KeyBar()

    def on_resize(self, event) -> None:         # events.Resize: a narrow terminal gives the plan the room
        self.set_class(event.size.width < NARROW_COLS, "-narrow")

    def on_mount(self) -> None:
        self.set_class(self.size.width < NARROW_COLS, "-narrow")
        self.load()
        self.query_one("#recipe-list").border_title = "Recipes"
        self.query_one("#workload-list").border_title = "Running (r restart · s stop)"
        self.query_one("#budget").border_title = "Memory budget"
        self.query_one("#plan-scroll").border_title = "Plan"
        self.show_workloads()
        self.set_interval(1.0, self.show_budget)
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
        self._placed.clear()
        if self.is_mounted:
            self.show_workloads()
        if self.is_mounted and self.entries:
            self._fill_list(self.query_one("#recipe-filter", Input).value.strip().lower())
            self._show()

    def _fill_list(self, needle: str) -> None:
        opts = []
        running: dict[str | None, LaunchGroup] = {}
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
        loaded = {k for k, _, _ in self.entries}
        for key, e in self.registry_entries.items():
            if key in loaded or (needle and not all(e.matches(w) for w in needle.split())):
                continue
            line = Text("· ", no_wrap=True, overflow="ellipsis")
            line.append(key, style="bold")
            line.append(f"  {e.model}" + ("" if e.runtime == "vllm" else f" [{e.runtime}]"), style="dim")
            opts.append(Option(line, id=key))
        ol = self.query_one("#recipe-list", OptionList)
        ol.set_options(opts)
        self.listed = [o.id for o in opts if o.id is not None]
        if self.selected not in self.listed:
            # The detail pane and Enter follow what the list shows: never a recipe the filter hid.
            self.selected = next((k for k in self.listed if self._recipe(k) is not None),
                                 self.listed[0] if self.listed else None)
            self.topology = None
            self._show()
        if self.selected in self.listed:
            ol.highlighted = self.listed.index(self.selected)

    def _recipe(self, key: str | None) -> Recipe | None:
        if key is not None and key in self.registry_entries and all(k != key for k, _, _ in self.entries):
            from ...recipes import find_recipe
            try:
                self.entries.append((key, find_recipe(key), None))
            except UserError as exc:
                self.entries.append((key, None, one_line(exc)))
        return next((r for k, r, _ in self.entries if k == key and r is not None), None)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id != "recipe-list":
            return          # the workloads' list highlights a workload, not a recipe (it chose the running one)
        if event.option_index != event.option_list.highlighted:
            return          # a refill moved the highlight since: the newer one stands
        if event.option.id != self.selected:
            self._pick_running = False       # the operator chose: launches coming and going no longer move it
            self.selected = event.option.id
            self.topology = None
            self._show()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_list.id == "recipe-list":
            self.action_launch()

    def choose(self, recipe) -> None:
        """From the command palette: show this recipe's plan on the recipes screen. The operator chose: what runs
        no longer takes the selection back (issue 39: a recipe entry opened the running gpt-oss-120b)."""
        self._pick_running = False
        self.selected, self.topology = recipe.key, None
        self.facade.show("recipes")
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
        topology = self.topology if self.topology in topos else topos[0]
        self.topology = topology
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
            t.append("  preflight and plan below: another launch of it, beside this one (its own name, port and "
                     "memory); r restarts this one as it runs" + (f" (router {g.router})" if g.router else "")
                     + "\n", style="dim")
        findings = self.preflight(r, topology)
        for f in findings:
            sev = severity.of_finding(f)
            t.append(f"{sev.mark} ", style=sev.colour)
            if getattr(f, "node", None):
                t.append(f"{f.node}: ", style="bold")
            t.append(one_line(f.message, 400))
            if getattr(f, "fix", None):
                t.append(f" — fix: {one_line(f.fix)}", style="dim")   # whole: a cut command is not the fix
            t.append("\n")
        if not findings:
            t.append("✓ preflight: nothing to report\n", style="green")
        head.update(t)
        plan_view.update(self._plan_text(r, topology))

    def _plan_text(self, recipe: Recipe, topology: str) -> Text:
        text = Text()
        try:
            from ...launch.plan import make_plan
            self.plan = self._make_plan(recipe, topology) or make_plan(recipe, topology, self.facade.cluster, {})
        except UserError as exc:
            self.plan = None
            text.append(one_line(exc), style="red")
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
        for line in self._memory_fit(recipe):
            text.append(line + "\n", style="red" if "DOES NOT FIT" in line else "dim" if "note:" in line else "")
        if self.plan.endpoint:
            text.append(f"clients use {self.plan.endpoint}\n", style="cyan")
        return text

    def _memory_fit(self, recipe) -> list[str]:
        """The plan's memory fit (placement/estimate.py) from the recipe's metadata and the nodes' MemTotal now;
        `recipe lint` reads the model from each node's own cache."""
        from ...launch.lint import memory_estimates
        from ...placement.estimate import render
        if self.plan is None:
            return []
        try:
            return render(memory_estimates(recipe, self.plan, self.facade.node_facts()))
        except UserError as exc:
            return [f"memory: {one_line(exc)}"]

    # --- actions ----------------------------------------------------------------------------------------------
    def action_next_topology(self) -> None:
        topos = self.topologies(self._recipe(self.selected))
        if topos:
            i = topos.index(self.topology) + 1 if self.topology in topos else 0
            self.topology = topos[i % len(topos)]
            self._show()

    def check_action(self, action: str, parameters) -> bool | None:
        # Read-only console or REPLAY: node-changing keys are hidden from the footer and do nothing.
        return not (action in ("restart", "stop", "launch", "copy_model", "copy_image")
                    and (self.facade.read_only or self.facade.replay_at is not None))

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
