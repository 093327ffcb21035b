"""One tab's console started ahead of the tab: most of a tab's wait is its console process starting (the
interpreter and its imports, before Textual draws anything), so the server keeps one such process waiting
(webface/warm.py: imported, nothing read or connected) and hands it to the next tab that opens.

    spare = SpareConsole(command, environment)    # environment(width, height): what textual-serve gives a tab
    await spare.fill()                            # with the server; again REFILL_AFTER_S after each take
    proc = await spare.take(environment(w, h))    # the waiting process, started as this tab's console; or None
    await spare.close()                           # with the server

The taken process is then the tab's, exactly as one textual-serve would have started (its command's arguments,
the tab's environment, the same pipes). A tab that finds none waiting (two at once, the spare still starting or
gone) starts its own as before. The next spare starts REFILL_AFTER_S after a take, so that it does not compete
for the processors with the console the tab is starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from asyncio.subprocess import PIPE, Process
from collections.abc import Callable

log = logging.getLogger(__name__)

REFILL_AFTER_S = 2.0


def start_packet(env: dict[str, str | None]) -> bytes:
    """textual-serve's framing (app_service.encode_packet): b"M", a 4-byte length, the JSON."""
    payload = json.dumps({"type": "start", "env": env}).encode()
    return b"M" + len(payload).to_bytes(4, "big") + payload


class SpareConsole:
    def __init__(self, command: str, environment: Callable[[int, int], dict[str, str]], *,
                 refill_after_s: float = REFILL_AFTER_S) -> None:
        self.command = command
        self.environment = environment
        self.refill_after_s = refill_after_s
        self.taken = 0                       # tabs that got a waiting console
        self._proc: Process | None = None
        self._env: dict[str, str] = {}
        self._refill: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def waiting(self) -> Process | None:
        return self._proc if self._proc is not None and self._proc.returncode is None else None

    async def fill(self) -> None:
        """Start a spare unless one waits."""
        if self._closed or self.waiting is not None:
            return
        self._env = self.environment(80, 24)
        try:
            self._proc = await asyncio.create_subprocess_shell(self.command, stdin=PIPE, stdout=PIPE, stderr=PIPE,
                                                               env=self._env)
        except OSError as exc:          # no spare then: each tab starts its own console, as without one
            log.warning("no spare console: %s", exc)
            self._proc = None

    async def take(self, env: dict[str, str]) -> Process | None:
        """The waiting console, told to start with `env` (the tab's full environment); None if none waits."""
        proc, self._proc = self.waiting, None
        self._refill_later()
        if proc is None:
            return None
        diff: dict[str, str | None] = {k: v for k, v in env.items() if self._env.get(k) != v}
        diff.update({k: None for k in self._env if k not in env})
        assert proc.stdin is not None
        try:
            proc.stdin.write(start_packet(diff))
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError):    # it ended meanwhile: the tab starts its own
            await _end(proc)
            return None
        self.taken += 1
        return proc

    def _refill_later(self) -> None:
        if self._closed or (self._refill is not None and not self._refill.done()):
            return

        async def refill() -> None:
            await asyncio.sleep(self.refill_after_s)
            await self.fill()
        self._refill = asyncio.get_running_loop().create_task(refill(), name="webface:spare")

    async def close(self) -> None:
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)
        proc, self._proc = self._proc, None
        if proc is not None:
            await _end(proc)


async def _end(proc: Process) -> None:
    """A console that waits has imported modules and nothing more (warm.py): killing it loses nothing."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
