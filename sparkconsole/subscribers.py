"""The callback lists behind every `subscribe(cb) -> unsubscribe` in the layers below the TUI."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class Subscribers(Generic[T]):
    """Callbacks run synchronously, in the order added; one that raises is logged and the others still run
    (a broken view must not stop the monitor that feeds it)."""

    def __init__(self, what: str) -> None:
        self.what = what               # named in the log line when a callback fails
        self._cbs: list[Callable[[T], None]] = []

    def add(self, cb: Callable[[T], None]) -> Callable[[], None]:
        """Returns unsubscribe (calling it twice is harmless)."""
        self._cbs.append(cb)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._cbs.remove(cb)
        return unsubscribe

    def notify(self, value: T) -> None:
        for cb in tuple(self._cbs):    # a callback may unsubscribe itself
            try:
                cb(value)
            except Exception:
                log.exception("%s subscriber failed", self.what)

    def __len__(self) -> int:
        return len(self._cbs)
