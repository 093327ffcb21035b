"""The recipes screen's launch: Enter asks first (where placement puts the plan and why, what runs as root on an
untrusted registry's word, the changing steps), waits for the node's previous launch to load and its memory to
come back after a stop, runs the plan and shows one progress line per node. A mixin of RecipesScreen."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import Static

from ... import severity
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


def verdict(findings) -> severity.Severity:
    """The recipe's mark in the list: its worst finding's (severity.py), ✓ when there is none."""
    return severity.worst(severity.of_finding(f) for f in findings)


class RecipeLaunch(OnConsole, _Screen):
    if TYPE_CHECKING:       # what RecipesScreen (screens/recipes.py) and its RecipeActions give the launch
        selected: str | None
        listed: list[str]
        topology: str | None
        plan: Plan | None
        running_plans: dict[str, Plan]
        runner: Runner | None
        progress: dict[str, str]

        def _recipe(self, key: str | None) -> Recipe | None: ...

        def preflight(self, recipe: Recipe, topology: str) -> list[Any]: ...

        def placed(self, recipe: Recipe, topology: str) -> tuple[Any, ...] | None: ...

        def restart_progress(self, ev: Any) -> None: ...

        def running_groups(self) -> list[Any]: ...

    def action_launch(self) -> None:
        r = self._recipe(self.selected) if self.selected in self.listed else None
        if r is None or self.plan is None or self.topology is None:      # a plan is made for a topology
            self.notify("choose a recipe with a plan first", severity="warning")
            return
        if verdict(self.preflight(r, self.topology)).refuses:
            self.notify("preflight refuses this launch: fix the ✗ findings first", severity="error")
            return
        plan = self.plan
        placed = self.placed(r, self.topology)
        where = ""
        if placed is not None and placed[1] is not None:
            from ...placement.render import choice_lines, node_lines
            placement = placed[1]
            lines = choice_lines(placement.choice(plan.name))
            for n in plan.nodes:
                lines += node_lines(placement.rooms[n])
            where = "\n".join(lines) + "\n\n"
        changes = [s for s in plan.steps if s.change]
        shown = "\n".join(f"{s.node}$ {s.shell()}" for s in changes[:6])
        more = f"\n… and {len(changes) - 6} more (see the plan)" if len(changes) > 6 else ""
        # What runs as root on someone else's word is said first; confirming the launch confirms it.
        trust = "".join(f"needs confirmation: {u}\n" for u in plan.untrusted)
        plan = replace(plan, trusted=True) if plan.untrusted else plan
        self.facade.confirm(f"Launch {plan.name} ({r.key} as {self.topology}) on {', '.join(plan.nodes)}?",
                            trust + where + shown + more, lambda: self._launch(r, plan),
                            f"{len(changes)} changing steps; progress shows below the plan.")

    def _runner(self) -> Runner:
        from ...launch.runner import Runner
        app = self.facade
        transports = {name: nm.transport for name, nm in app.nodes().items() if nm.transport is not None}
        return Runner(app.cluster, transports)

    def _on_progress(self, ev) -> None:
        # One line per node: the runner's latest word on it wins.
        self.progress[ev.node or "cluster"] = one_line(f"{ev.stage}: {ev.message}", 160)
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
            await self._before_start(plan)
            self.running_plans[plan.name] = plan     # s stops it while it starts, before the nodes list it
            await self.runner.launch(plan, self._on_progress)
            from ...launch.gateway import keep_current
            await keep_current(self.facade.cluster, self.runner.transports)
            self.facade.notify(f"{plan.name} launched", title="recipes")
        except Exception as exc:
            self.running_plans.pop(plan.name, None)  # the runner cleaned up what it started
            self.progress["launch"] = f"failed: {one_line(exc)}"
            self._draw_progress()
            self.facade.notify(one_line(exc, 300), title="launch failed", severity="error", timeout=20)

    async def _before_start(self, plan) -> None:
        """The node's previous launch loaded, its memory back after a stop (launch/beside.py)."""
        from ...launch.beside import wait_loaded, wait_recovered
        from ...paths import state_dir
        from ...placement.recovery import StopLog

        def say(line: str) -> None:
            self.progress["launch"] = one_line(line, 160)
            self._draw_progress()
        await wait_loaded(self.running_groups(), plan.nodes, say, skip=plan.name)
        log = StopLog(state_dir(), self.facade.cluster.source)
        await wait_recovered(self.facade.nodes(), plan.nodes, log, say)
        for n in plan.nodes:
            log.clear(n)


def plan_steps(plan) -> list[tuple[str, list]]:
    """(node, its ordered steps) for each node of the plan."""
    return [(n, plan.for_node(n)) for n in plan.nodes]
