"""The recipes screen's actions on what runs: the workloads found on the nodes (their containers' labels, whoever
started them) listed with their nodes, port, model and state, r / s on the highlighted one, each node's memory
budget bar, preflight's word on a container already in a plan's way, and m / i (the model or image to the plan's
nodes). A mixin of RecipesScreen: it uses the screen's app, selection, plan and progress."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import UserError
from ..facade import OnConsole
from ..fmt import one_line

if TYPE_CHECKING:
    from textual.screen import Screen

    from ...launch.runner import Runner
    from ...launch.steps import Plan
    from ...recipes import Recipe

    _Screen = Screen[None]
else:
    _Screen = object

RESTART_STAGES = ("draining", "restarting", "back", "failed")


class _Finding:
    """A finding of the screen's own (a container in the way, a plan that cannot be made), shaped as preflight's."""

    def __init__(self, severity: str, message: str, node: str | None = None, fix: str | None = None,
                 rule: str = "in_the_way") -> None:
        self.severity, self.message, self.node, self.fix, self.rule = severity, message, node, fix, rule


class RecipeActions(OnConsole, _Screen):
    if TYPE_CHECKING:       # what RecipesScreen (screens/recipes.py) gives its actions
        selected: str | None
        plan: Plan | None
        running_plans: dict[str, Plan]
        runner: Runner | None
        progress: dict[str, str]
        restarting: dict[str, str] | None
        restart_plan: Plan | None

        def _make_plan(self, recipe: Recipe, topology: str) -> Plan | None: ...

        def _recipe(self, key: str | None) -> Recipe | None: ...

        def _runner(self) -> Runner: ...

        def _on_progress(self, ev: Any) -> None: ...

        def _draw_progress(self) -> None: ...

        def placed(self, recipe: Recipe, topology: str) -> tuple[Any, ...] | None: ...

    def _monitors(self) -> list:
        mon = self.facade.monitor
        return list(mon.nodes.values()) if mon is not None else []

    def running_groups(self) -> list:
        """The launches running on the nodes now (their containers' labels), wherever they were started from."""
        from ...nodes.launches import launch_groups
        return launch_groups(self._monitors())

    def running_of(self, key: str | None):
        return next((g for g in self.running_groups() if g.recipe == key), None)

    def _in_the_way(self, recipe, topology: str) -> list:
        """A container of the plan's names already running on its node: the launch would fail on it, so say
        which launch it is and how to stop it (the runner's own hint can only name the recipe being launched)."""
        plan = self._make_plan(recipe, topology)
        if plan is None:
            return []
        from ...nodes.launches import in_the_way
        out = []
        for hit in in_the_way(self._monitors(), [(svc.node, svc.container) for svc in plan.services]):
            g = hit.group
            if g is not None and g.recipe == recipe.key and g.topology == topology:
                fix = "it is this launch, running: r restarts it, s stops it"
            elif g is not None:
                fix = (f"stop {g.recipe} first: choose it here and press s, or sparkconsole recipe stop {g.recipe} "
                       f"--topology {g.topology}")
            else:
                fix = f"stop it on {hit.node} first: docker stop {hit.container}"
            out.append(_Finding("block", f"{hit.words()}: a launch here would fail on the name", hit.node, fix))
        return out

    # --- the running workloads and the nodes' memory -----------------------------------------------------------
    def readings(self):
        """What the app's node monitors say now, for placement (launch/beside.py)."""
        from ...launch.beside import Readings
        mon = self.facade.monitor
        return Readings(self.facade.cluster, mon.nodes if mon is not None else {})

    def show_workloads(self) -> None:
        """One row per running workload: name, recipe × topology, nodes, port, model, verdict."""
        from rich.text import Text
        from textual.widgets import OptionList
        from textual.widgets.option_list import Option
        ol = self.query_one("#workload-list", OptionList)
        keep = self.highlighted_workload()
        rows = []
        for g in self.running_groups():
            colour = "green" if g.verdict == "SERVING" else ("red" if g.verdict == "BROKEN" else "yellow")
            ports = sorted({m.port for m in g.members if m.port is not None})
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append("● ", style=colour)
            line.append(g.name, style="bold")
            line.append(f"  {g.model or '?'}  {','.join(g.nodes)}:{','.join(map(str, ports)) or '-'}  ")
            line.append(g.verdict.lower(), style=colour)
            rows.append(Option(line, id=g.name))
        ol.set_options(rows or [Option(Text("nothing runs", style="dim"), id="", disabled=True)])
        names = [o.id for o in rows]
        if keep in names:
            ol.highlighted = names.index(keep)
        elif names:
            ol.highlighted = 0
        self.show_budget()

    def highlighted_workload(self) -> str | None:
        from textual.widgets import OptionList
        ol = self.query_one("#workload-list", OptionList)
        if ol.highlighted is None or ol.option_count == 0:
            return None
        return ol.get_option_at_index(ol.highlighted).id or None

    def show_budget(self) -> None:
        if not self.is_mounted or not self.is_current:
            return
        from ...placement.bars import bars
        from ..widgets.budget_bar import BudgetBars
        r = self.readings()
        self.query_one("#budget", BudgetBars).show(bars([r.budgets[n.name] for n in self.facade.cluster.nodes], r.running))

    def _budget(self, recipe, topology: str) -> list:
        """Preflight's word on the node's budget beside what runs (launch/lint_workloads.py)."""
        placed = self.placed(recipe, topology)
        if placed is None:
            return []
        _, placement, err = placed
        from ...launch.lint_workloads import budget_notes
        return budget_notes(err if err is not None else placement)

    def _chosen_launch(self):
        """The running workload r / s act on: the one highlighted in the running list, else the chosen recipe's,
        else the only one running."""
        groups = self.running_groups()
        name = self.highlighted_workload() if self.is_mounted else None
        chosen = next((g for g in groups if g.name == name), None)
        return chosen or self.running_of(self.selected) or (groups[0] if len(groups) == 1 else None)

    def _running_plan(self, verb: str = "restart"):
        """The plan of what r / s act on: the chosen workload as this console launched it, else planned again from
        its recipe and labels (nodes, port, router, containers); a stop needs no recipe (its containers alone)."""
        g = self._chosen_launch()
        if g is None:
            # a launch this console is starting, whose containers the nodes do not list yet
            return self.running_plans.get(self.plan.name) if self.plan is not None else None
        if g.name in self.running_plans:
            return self.running_plans[g.name]
        from ...launch.workloads import plan_of, running_options
        if verb == "stop":
            return plan_of(g)
        r = self._recipe(g.recipe)
        if r is None:
            self.notify(f"{g.name} runs recipe {g.recipe}, which is not among the recipes here: restart it with "
                        f"sparkconsole recipe restart PATH --name {g.name}", severity="error")
            return None
        try:
            from ...launch.plan import make_plan
            return make_plan(r, g.topology, self.facade.cluster, running_options(g))
        except UserError as exc:
            self.notify(one_line(f"{g.name} ({g.recipe} × {g.topology}) runs, but cannot be planned here: {exc}", 300),
                        severity="error")
            return None

    def _unlisted(self, g) -> str | None:
        """What of a launch found on the nodes no node lists yet; None when it is whole, or this console launched it
        (its own plan then says every member)."""
        return None if g is None or g.name in self.running_plans else g.missing

    def _not_whole(self) -> bool:
        """A launch found on the nodes that some node does not list whole yet: its router (which starts after the
        servers, and whose labels say how a restart takes a server out), or a member on a node whose agent has
        not listed it yet. Planned from what is listed, the restart would miss a node or take the wrong router.
        Says what is missing."""
        g = self._chosen_launch()
        missing = self._unlisted(g)
        if missing is None:
            return False
        self.notify(f"{g.recipe} × {g.topology}: {missing}; r restarts the launch once every member is listed "
                    "(s stops what runs now)", severity="warning")
        return True

    def _confirm_running(self, verb: str) -> None:
        if verb == "restart" and self._not_whole():
            return
        plan = self._running_plan(verb)
        if plan is None:
            running = self.running_groups()
            self.notify("nothing running was launched from a recipe" if not running else
                        "several workloads run: highlight the one to " + verb, severity="warning")
            return
        if self.runner is None:
            self.runner = self._runner()
        runner = self.runner
        if verb == "restart":
            self._confirm_restart(plan, runner)
            return
        stops = [st for svc in [x for x in plan.services if x.role == "router"]
                 + [x for x in reversed(plan.services) if x.role != "router"] for st in svc.stop_steps()]
        shown = "\n".join(f"{st.node}$ {st.shell()}" for st in stops[:8])
        if len(stops) > 8:
            shown += f"\n… and {len(stops) - 8} more"
        group = self._chosen_launch()

        async def go() -> None:
            try:
                await self._stop_workload(plan, group, runner)
                self.facade.notify(f"{plan.name}: stop done", title="recipes")
                self.running_plans.pop(plan.name, None)
            except Exception as exc:
                self.facade.notify(one_line(exc, 300), title="stop failed", severity="error", timeout=20)
        missing = self._unlisted(group)     # planned from what the nodes list: a member not listed is not stopped
        self.facade.confirm(f"Stop {plan.name} ({plan.recipe} × {plan.topology}) on {', '.join(plan.nodes)}?", shown, go,
                            "Out of the gateway first, then routers, then the servers; only this workload's containers "
                            "are removed, every other keeps serving."
                            + (f" Only what the nodes list is stopped: {missing}." if missing else ""))

    async def _stop_workload(self, plan: Plan, group: Any, runner: Runner) -> None:
        """What the stop should give back recorded (the next launch waits for it), out of the gateway, stopped."""
        from ...launch.beside import record_stop
        from ...launch.gateway import keep_current
        from ...paths import state_dir
        from ...placement.recovery import StopLog
        if group is not None:
            record_stop(StopLog(state_dir(), self.facade.cluster.source), self.readings(), group)
            await keep_current(self.facade.cluster, runner.transports, without=group.name)
        await runner.stop(plan, self._on_progress)

    def _confirm_restart(self, plan: Plan, runner: Runner) -> None:
        """Rolling behind a router, drained everywhere else (launch/rolling.py); the modal shows its steps."""
        from ...launch import rolling

        detail = ("One server at a time: the others keep serving, nothing in flight is dropped."
                  if rolling.rolls(plan) else
                  "Requests in flight finish first (at most the drain timeout), then the launch restarts.")

        async def go() -> None:
            self.restarting, self.restart_plan = {}, plan
            try:
                report = await rolling.restart(runner, plan, self._on_progress)
                self.facade.notify(one_line(report.line(), 300) if report else f"{plan.recipe}: restart done", title="recipes")
            except Exception as exc:
                self.facade.notify(one_line(exc, 300), title="restart failed", severity="error", timeout=20)
            finally:
                self.restarting, self.restart_plan = None, None
                self.facade.restart_stages = {}
        self.facade.confirm(f"Restart {plan.recipe} ({plan.topology}) on {', '.join(plan.nodes)}?",
                            rolling.restart_text(plan), go, detail)

    def restart_progress(self, ev) -> None:
        """A restart's stage per server (draining, restarting, back, failed): on the launch bar while it lasts,
        and each change of stage once in the events pane."""
        plan = self.restart_plan
        if self.restarting is None or plan is None or ev.stage not in RESTART_STAGES:
            return
        svc = next((x for x in plan.services if x.key == ev.service), None)
        if svc is None:
            return
        self.facade.restart_stages = {**self.facade.restart_stages, (svc.node, svc.container): ev.stage}
        if self.restarting.get(svc.key) != ev.stage:
            self.restarting[svc.key] = ev.stage
            recorder = self.facade.recorder      # kept with the readings: replay and post-mortems
            if recorder is not None:
                recorder.note(svc.node, "restart", {"recipe": plan.recipe, "topology": plan.topology,
                                                    "container": svc.container, "stage": ev.stage,
                                                    "message": ev.message})
            events = self.facade.events
            if events is not None:
                events.note(f"{svc.node}: {ev.message}", "red" if ev.stage == "failed" else "yellow")

    def copy_argv(self, what: str) -> list[str] | None:
        """`sparkconsole model|image pull X --node …` for the plan's nodes: the command preflight names when a
        node lacks the model or the image (distribute/), run from here as the operator would run it."""
        if self.plan is None:
            return None
        from ...launch.lint import plan_model
        item = (plan_model(self.plan) if what == "model"
                else self.plan.image)
        if not item:
            return None
        argv = ["sparkconsole", what, "pull", item, *[a for n in self.plan.nodes for a in ("--node", n)], "--yes"]
        source = self.facade.cluster.source
        if source and not source.startswith("<"):
            argv += ["--cluster", source]
        return argv

    def _confirm_copy(self, what: str) -> None:
        argv, plan = self.copy_argv(what), self.plan
        if argv is None or plan is None:
            self.notify(f"choose a recipe with a plan (and a {what}) first", severity="warning")
            return
        import shlex

        async def go() -> None:
            import asyncio
            import sys
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", *argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
            stdout = proc.stdout            # a pipe: stdout=PIPE above
            while stdout is not None and (raw := await stdout.readline()):    # progress lines, ETA included
                line = raw.decode(errors="replace").strip()
                if line:
                    self.progress[what] = line[-160:]
                    self._draw_progress()
            ok = await proc.wait() == 0
            self.facade.notify(one_line(f"{what} pull {'done' if ok else 'failed: ' + self.progress.get(what, '')}", 300),
                               title="recipes", severity="information" if ok else "error")
        self.facade.confirm(f"Copy the {what} to {', '.join(plan.nodes)}?", shlex.join(argv), go,
                            "Nodes that have it already are left as they are; progress shows below the plan.")

    def action_copy_model(self) -> None:
        self._confirm_copy("model")

    def action_copy_image(self) -> None:
        self._confirm_copy("image")

    def action_restart(self) -> None:
        self._confirm_running("restart")

    def action_stop(self) -> None:
        self._confirm_running("stop")
