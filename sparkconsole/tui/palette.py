"""Command-palette provider (`:` or ctrl+p): every console action, by the words its key is shown with.

Each key of every screen, modal-free, has an entry whose title holds its key-bar words (so typing what the bar
says finds it), and the entries add what an operator types first: "Fix OOM guard on spark2: Swap off" for `f`,
"Replay: back 5 min" for `[`, "Recipes: Model to nodes" for `m`. Each entry names the binding it stands for
(`Command.action`: "owner.action"), which the key-sequence fuzzer checks against every binding. Textual's own
system commands keep Theme, Maximize and Screenshot; Quit and Keys are ours (once each).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from textual.command import DiscoveryHit, Hit, Hits, Provider

from .fmt import one_line


class Command(NamedTuple):
    title: str
    run: Callable[[], object]
    help: str
    action: str             # the binding it stands for: "app.quit", "node.fix", "recipes.copy_model", …


async def _call(fn) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


def console_commands(app: Any) -> list[Command]:
    """Every action of the console, node-changing ones left out where the console may not change anything (read
    only, or a recorded moment on screen)."""
    acting = not app.read_only and app.replay_at is None
    cmds = [
        Command("Show dashboard: the nodes", lambda: app.action_show("dashboard"), "1", "app.show"),
        Command("Show recipes: plans, launch, restart", lambda: app.action_show("recipes"), "2", "app.show"),
        Command("Show bench: sweeps and their curves", lambda: app.action_show("bench"), "3", "app.show"),
        Command("Show logs: a node's vLLM log", lambda: app.action_show("logs"), "4", "app.show"),
        Command("Events: alerts, restarts, collector messages", app.action_events, "e (escape goes back)", "app.events"),
        Command("Help: every key", app.action_help, "?", "app.help"),
        Command("Quit", app.action_quit, "q: agents end, connections close", "app.quit"),
        Command("Replay: back 5 min (the flight recorder)", lambda: app.action_scrub(-5), "[", "app.scrub"),
        Command("Replay: forward 5 min, back to live at 0", lambda: app.action_scrub(5), "]", "app.scrub"),
        Command("Dashboard: Filter nodes by name", lambda: _on(app, "dashboard", "filter"), "/", "dashboard.filter"),
        Command("Bench: Start sweep", lambda: _on(app, "bench", "start"), "b on the bench screen", "bench.start"),
        Command("Bench: Stop sweep", lambda: _on(app, "bench", "stop"), "x on the bench screen", "bench.stop"),
        Command("Bench: Past runs overlaid", lambda: _on(app, "bench", "past"), "p on the bench screen", "bench.past"),
        Command("Bench: Reference (the published table)", lambda: _on(app, "bench", "reference"),
                "f on the bench screen", "bench.reference"),
        Command("Logs: Search the log", lambda: _on(app, "logs", "search"), "/ on the logs screen", "logs.search"),
        Command("Logs: Clear search", lambda: _on(app, "logs", "clear_search"), "escape on the logs screen",
                "logs.clear_search"),
        Command("Logs: Next node", lambda: _on(app, "logs", "next_node"), "n on the logs screen", "logs.next_node"),
        Command("Logs: Follow the end, or stop", lambda: _on(app, "logs", "toggle_follow"), "f on the logs screen",
                "logs.toggle_follow"),
        Command("Recipes: Topology, the next one", lambda: _on(app, "recipes", "next_topology"),
                "t on the recipes screen", "recipes.next_topology"),
        Command("Recipes: Filter recipes by name", lambda: _on(app, "recipes", "filter"), "/ on the recipes screen",
                "recipes.filter"),
    ]
    for node in app.cluster.nodes:
        n = node.name
        cmds.append(Command(f"{n}: Logs of vLLM", partial(app.open_logs, n), f"docker logs -f {node.container}",
                            "node.logs"))
    if acting:
        cmds += [
            Command("Recipes: Launch the chosen recipe", lambda: _on(app, "recipes", "launch"), "asks first",
                    "recipes.launch"),
            Command("Recipes: Restart running launch", lambda: _on(app, "recipes", "restart"), "asks first",
                    "recipes.restart"),
            Command("Recipes: Stop running launch", lambda: _on(app, "recipes", "stop"), "asks first",
                    "recipes.stop"),
            Command("Recipes: Model to nodes (copy the plan's model)", lambda: _on(app, "recipes", "copy_model"),
                    "asks first", "recipes.copy_model"),
            Command("Recipes: Image to nodes (copy the plan's image)", lambda: _on(app, "recipes", "copy_image"),
                    "asks first", "recipes.copy_image"),
        ]
        for node in app.cluster.nodes:
            n = node.name
            cmds += [Command(f"{n}: Restart vLLM", partial(app.confirm_container, n, "restart"), "asks first",
                             "node.restart"),
                     Command(f"{n}: Stop vLLM", partial(app.confirm_container, n, "stop"), "asks first", "node.stop")]
            cmds += _guard_commands(app, n)
    for label, recipe in app.recipes_screen.recipe_choices():
        cmds.append(Command(f"Recipe: {label}", partial(app.recipes_screen.choose, recipe),
                            "show its plan" + ("; enter launches" if acting else ""), "recipes.choose"))
    return cmds


def _on(app: Any, mode: str, action: str) -> object:
    """An action of another screen: that screen first, then its action (as its key would)."""
    screen = {"dashboard": lambda: app.dashboard, "recipes": lambda: app.recipes_screen,
              "bench": lambda: app.bench_screen, "logs": lambda: app.logs_screen}[mode]()

    async def go() -> None:
        await app.action_show(mode)
        await _call(getattr(screen, f"action_{action}"))
    return go()


def _guard_commands(app: Any, node: str) -> list[Command]:
    """One entry per OOM guard of the node, in its own words, so typing "swap" or "guard" finds it: the fix asks
    first; a guard that is ok says so."""
    from .. import severity
    nm = app.node_monitor(node)
    guards = app.guards_for(nm) if nm is not None else []
    if not guards:
        return [Command(f"{node}: Fix guard (OOM): no reading yet", partial(app.notify, f"{node}: no guard reading yet",
                                                                            title="guards"), "f", "node.fix")]
    out = []
    for g in guards:
        sev = severity.of_guard(g)
        if sev is severity.OK or not g.fix:
            out.append(Command(f"{node}: Fix guard (OOM) {sev.mark} {g.title}: {sev.says}",
                               partial(app.notify, f"{node}: {g.title}: {g.reason}", title="guards"), "nothing to run",
                               "node.fix"))
        else:
            out.append(Command(f"{node}: Fix guard (OOM) {sev.mark} {g.title}", partial(app.confirm_guard_fix, node, g),
                               one_line(f"asks first: {g.fix}", 120), "node.fix"))
    return out


class ConsoleCommands(Provider):
    def _commands(self) -> list[Command]:
        app = self.app
        return console_commands(app) if hasattr(app, "cluster") else []

    async def discover(self) -> Hits:
        for c in self._commands():
            yield DiscoveryHit(c.title, partial(_call, c.run), help=c.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for c in self._commands():
            score = matcher.match(c.title)
            if score > 0:
                yield Hit(score, matcher.highlight(c.title), partial(_call, c.run), help=c.help)
