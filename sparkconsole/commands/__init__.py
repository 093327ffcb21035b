"""One module per subcommand; each `register(subparsers)` must stay cheap (argparse only, no product
imports at module level), because `sparkconsole --help` and argument errors must answer at interpreter speed.
Heavy imports belong inside the `run` functions."""

from __future__ import annotations

import importlib
from collections.abc import Iterator


class LazyChoices:
    """An argparse `choices=` that imports `module.attr` only when a value is checked or the choices are
    listed (an invalid choice, `--help`), so registering a parser imports nothing. Give the argument a
    `metavar` as well, or the usage line of every argument error lists (and imports) the choices."""

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr
        self._values: tuple[str, ...] | None = None

    def values(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(getattr(importlib.import_module(self.module), self.attr))
        return self._values

    def __contains__(self, item: object) -> bool:
        return item in self.values()

    def __iter__(self) -> Iterator[str]:
        return iter(self.values())

    def __len__(self) -> int:
        return len(self.values())
