"""What a launch, stop or restart says as it goes: `Progress` events, the callback that receives them, and `Emit`,
the typed function the runner, the rolls, the drain gate and the gateway say each step through."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .. import secrets


@dataclass(frozen=True)
class Progress:
    node: str
    stage: str                    # step | ok | failed | log | waiting | ready | stopping | stopped | info |
                                  # draining | restarting | back (a rolling or graceful restart: launch/rolling.py)
    message: str
    service: str | None = None
    time: float = 0.0

    def __str__(self) -> str:
        return f"{self.node}: {self.message}"


ProgressCallback = Callable[[Progress], Any]


class Emit(Protocol):
    """Says one step: `emit(node, stage, message, service)`."""

    def __call__(self, node: str, stage: str, message: str, service: str | None = None, /) -> None: ...


def emitter(on_progress: ProgressCallback | None) -> Emit:
    """An Emit that hands `on_progress` one Progress per call: its message redacted and on one line, stamped now;
    a display that raises never breaks the launch."""
    def emit(node: str, stage: str, message: str, service: str | None = None, /) -> None:
        if on_progress is None:
            return
        ev = Progress(node, stage, " ".join(secrets.redact(message).split()), service, time.time())
        with contextlib.suppress(Exception):  # a broken display must not break a launch
            on_progress(ev)
    return emit


def emit_to(emit: Emit) -> ProgressCallback:
    """The runner's callbacks take Progress events; `emit` takes their fields."""
    return lambda ev: emit(ev.node, ev.stage, ev.message, ev.service)
