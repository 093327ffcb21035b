"""The recipes screen's actions on what runs: the launches found on the nodes (their containers' labels, whoever
started them), r / s on them, preflight's word on a container already in a plan's way, and m / i (the model or
image to the plan's nodes). A mixin of RecipesScreen: it uses the screen's app, selection, plan and progress."""

from __future__ import annotations

from ...errors import UserError

RESTART_STAGES = ("draining", "restarting", "back", "failed")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class _Finding:
    """A finding of the screen's own (a container in the way, a plan that cannot be made), shaped as preflight's."""

    def __init__(self, severity: str, message: str, node: str | None = None, fix: str | None = None,
                 rule: str = "in_the_way") -> None:
        self.severity, self.message, self.node, self.fix, self.rule = severity, message, node, fix, rule


def running_options(group) -> dict:
    """The plan options of a running launch, from its containers' labels: {"port": P} when every server
    listens on P (a launch started with --port, or a demo whose preferred port was taken), and the router that
    runs (a launch with --router: its restart closes servers behind LiteLLM, takes them out of vllm-router)."""
    from urllib.parse import urlsplit
    ports = {urlsplit(m.url).port for m in group.members if m.role == "server" and m.url}
    out: dict = {"port": ports.pop()} if len(ports) == 1 and None not in ports else {}
    if group.router:
        out["router"] = group.router
    return out


class RecipeActions:
    def _monitors(self) -> list:
        mon = getattr(self.app, "monitor", None)
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

    def _chosen_launch(self):
        """The running launch r / s act on when this console did not start one: the chosen recipe's, else the only
        one running."""
        groups = self.running_groups()
        return self.running_of(self.selected) or (groups[0] if len(groups) == 1 else None)

    def _running_plan(self):
        """The plan of what r / s act on: the launch this console started, else the chosen running launch, planned
        again from its recipe and topology as the CLI's stop does."""
        if self.running_plan is not None:
            return self.running_plan
        g = self._chosen_launch()
        r = self._recipe(g.recipe) if g is not None else None
        if g is None or r is None:
            return None
        try:
            from ...launch.plan import make_plan
            return make_plan(r, g.topology, self.app.cluster, running_options(g))
        except UserError as exc:
            self.notify(f"{g.recipe} × {g.topology} runs, but cannot be planned here: {_one_line(exc)}"[:300],
                        severity="error")
            return None

    def _router_unseen(self) -> bool:
        """A routed launch found on the nodes whose router is not listed yet (it starts after the servers): which
        router runs, and so how a restart takes a server out, is read from the router's own labels. Says so."""
        from ...nodes.launches import ROUTED
        g = self._chosen_launch() if self.running_plan is None else None
        if g is None or g.topology not in ROUTED or g.router is not None:
            return False
        self.notify(f"{g.recipe} × {g.topology}: its router is not running yet; r restarts the launch once it is "
                    "(s stops it now)", severity="warning")
        return True

    def _confirm_running(self, verb: str) -> None:
        if verb == "restart" and self._router_unseen():
            return
        plan = self._running_plan()
        if plan is None:
            running = self.running_groups()
            self.notify("nothing running was launched from a recipe" if not running else
                        "several launches run: choose the recipe to " + verb, severity="warning")
            return
        if self.runner is None:
            self.runner = self._runner()
        if verb == "restart":
            self._confirm_restart(plan)
            return
        stops = [st for svc in [x for x in plan.services if x.role == "router"]
                 + [x for x in reversed(plan.services) if x.role != "router"] for st in svc.stop_steps()]
        shown = "\n".join(f"{st.node}$ {st.shell()}" for st in stops[:8])
        if len(stops) > 8:
            shown += f"\n… and {len(stops) - 8} more"

        async def go() -> None:
            try:
                await self.runner.stop(plan, self._on_progress)
                self.app.notify(f"{plan.recipe}: stop done", title="recipes")
                self.running_plan = None
            except Exception as exc:
                self.app.notify(_one_line(exc)[:300], title="stop failed", severity="error", timeout=20)
        self.app.confirm(f"Stop {plan.recipe} ({plan.topology}) on {', '.join(plan.nodes)}?", shown, go,
                         "Routers first, then the servers; every container of the recipe is removed.")

    def _confirm_restart(self, plan) -> None:
        """Rolling behind a router, drained everywhere else (launch/rolling.py); the modal shows its steps."""
        from ...launch import rolling

        detail = ("One server at a time: the others keep serving, nothing in flight is dropped."
                  if rolling.rolls(plan) else
                  "Requests in flight finish first (at most the drain timeout), then the launch restarts.")

        async def go() -> None:
            self.restarting, self.restart_plan = {}, plan
            try:
                report = await rolling.restart(self.runner, plan, self._on_progress)
                self.app.notify(report.line()[:300] if report else f"{plan.recipe}: restart done", title="recipes")
            except Exception as exc:
                self.app.notify(_one_line(exc)[:300], title="restart failed", severity="error", timeout=20)
            finally:
                self.restarting, self.restart_plan = None, None
                self.app.restart_stages = {}
        self.app.confirm(f"Restart {plan.recipe} ({plan.topology}) on {', '.join(plan.nodes)}?",
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
        self.app.restart_stages = {**self.app.restart_stages, (svc.node, svc.container): ev.stage}
        if self.restarting.get(svc.key) != ev.stage:
            self.restarting[svc.key] = ev.stage
            recorder = getattr(self.app, "recorder", None)      # kept with the readings: replay and post-mortems
            if recorder is not None:
                recorder.note(svc.node, "restart", {"recipe": plan.recipe, "topology": plan.topology,
                                                    "container": svc.container, "stage": ev.stage,
                                                    "message": ev.message})
            events = getattr(self.app.dashboard, "events", None)
            if events is not None:
                events.note(f"{svc.node}: {ev.message}", "red" if ev.stage == "failed" else "yellow")

    def copy_argv(self, what: str) -> list[str] | None:
        """`sparkconsole model|image pull X --node …` for the plan's nodes: the command preflight names when a
        node lacks the model or the image (distribute/), run from here as the operator would run it."""
        if self.plan is None:
            return None
        from ...launch.lint import model_source
        item = (model_source(next(iter(self.plan.server_args.values()), ())) if what == "model"
                else self.plan.image)
        if not item:
            return None
        argv = ["sparkconsole", what, "pull", item, *[a for n in self.plan.nodes for a in ("--node", n)], "--yes"]
        source = self.app.cluster.source
        if source and not source.startswith("<"):
            argv += ["--cluster", source]
        return argv

    def _confirm_copy(self, what: str) -> None:
        argv = self.copy_argv(what)
        if argv is None:
            self.notify(f"choose a recipe with a plan (and a {what}) first", severity="warning")
            return
        import shlex

        async def go() -> None:
            import asyncio
            import sys
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", *argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
            async for raw in proc.stdout:          # progress lines, ETA included, one at a time
                line = raw.decode(errors="replace").strip()
                if line:
                    self.progress[what] = line[-160:]
                    self._draw_progress()
            ok = await proc.wait() == 0
            self.app.notify(f"{what} pull {'done' if ok else 'failed: ' + self.progress.get(what, '')}"[:300],
                            title="recipes", severity="information" if ok else "error")
        self.app.confirm(f"Copy the {what} to {', '.join(self.plan.nodes)}?", shlex.join(argv), go,
                         "Nodes that have it already are left as they are; progress shows below the plan.")

    def action_copy_model(self) -> None:
        self._confirm_copy("model")

    def action_copy_image(self) -> None:
        self._confirm_copy("image")

    def action_restart(self) -> None:
        self._confirm_running("restart")

    def action_stop(self) -> None:
        self._confirm_running("stop")
