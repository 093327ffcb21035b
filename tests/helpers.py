"""Small helpers the test modules share (ports on loopback, waiting on the event loop or inside a Textual pilot)."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import time

import pytest


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


async def until(pred, timeout: float, what: str) -> float:
    """Poll pred() on the event loop; the seconds it took, or fail the test naming `what` after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def levels_done(path) -> int:
    """Finished levels in a results file, read-only while a sweep in another process writes it (0 if not there yet)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT count(*) FROM levels").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0
