"""A tmux server of a benchmark run's own (console.py, demo_start.py): the real console in a real terminal.

On the default server another user of tmux (the suite runs the benchmarks side by side) closing its last session
ends the server under this run's next command ("server exited unexpectedly"), so each run names its own (-L).
A new server has also exited as it started, once in a full suite run (tmux 3.3a, "server exited unexpectedly" at
the first new-session, nothing else of this run's yet): `new_session` starts it again, at most three times, and
otherwise fails with tmux's own words. A helper, not a benchmark: run alone it does nothing.
"""

from __future__ import annotations

import os
import subprocess
import time

TMUX = ["tmux", "-L", f"sc-bench-{os.getpid()}"]
ATTEMPTS = 3


def new_session(name: str, cmd: str, env: dict[str, str], size: tuple[int, int] = (200, 60)) -> None:
    """A detached session `name` running `cmd` in a size[0] x size[1] terminal."""
    argv = [*TMUX, "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]), cmd]
    for attempt in range(1, ATTEMPTS + 1):
        r = subprocess.run(argv, env={**env, "TERM": "xterm-256color"}, capture_output=True, text=True)
        if r.returncode == 0:
            return
        if "server exited unexpectedly" not in r.stderr or attempt == ATTEMPTS:
            raise RuntimeError(f"tmux new-session failed ({attempt} attempt(s)): {r.stderr.strip()[:300]}")
        time.sleep(0.5)


def capture(name: str) -> str:
    """What session `name`'s pane shows now ('' once it is gone)."""
    return subprocess.run([*TMUX, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout


def kill_session(name: str) -> None:
    subprocess.run([*TMUX, "kill-session", "-t", name], capture_output=True)


def kill_server() -> None:
    subprocess.run([*TMUX, "kill-server"], capture_output=True)
