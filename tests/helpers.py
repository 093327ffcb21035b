"""Small helpers the test modules share (ports on loopback, waiting inside a Textual pilot)."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now (the OS picks it; a race with other binders is unlikely on loopback)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def wait_for(pilot, cond, timeout: float = 10.0, what: str = "condition", step: float = 0.05) -> None:
    """Let the app run until cond() holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(step)
