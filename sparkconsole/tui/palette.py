"""Command-palette provider (`:` or ctrl+p): every console action, every node action and every recipe."""

from __future__ import annotations

import inspect
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


async def _call(fn) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


class ConsoleCommands(Provider):
    def _commands(self):
        app = self.app
        return app.palette_commands() if hasattr(app, "palette_commands") else []

    async def discover(self) -> Hits:
        for title, fn, help_text in self._commands():
            yield DiscoveryHit(title, partial(_call, fn), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, fn, help_text in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(_call, fn), help=help_text)
