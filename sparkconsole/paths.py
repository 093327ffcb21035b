"""Where sparkconsole keeps its own state (audit log, bench results, caches)."""

from __future__ import annotations

import os
from pathlib import Path

STATE_ENV = "SPARKCONSOLE_STATE_DIR"
# Where `sparkconsole bench` writes by default (relative to the working directory) and where the console's bench
# screen looks for past runs. Here rather than in bench/: the CLI imports this at start-up, so it stays light.
DEFAULT_RESULTS = "runs/bench.sqlite"
DEMO_RESULTS = "runs/demo.sqlite"      # simulated results never share the default file with real ones


def state_dir() -> Path:
    """$SPARKCONSOLE_STATE_DIR, else ~/.local/state/sparkconsole (XDG_STATE_HOME honoured); created 0700."""
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        path = Path(explicit).expanduser()
    else:
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        path = Path(base).expanduser() / "sparkconsole"
    existed = path.is_dir()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not existed:
        # mkdir's mode is masked by the umask; the audit log may name hosts and commands, keep it private.
        os.chmod(path, 0o700)
    return path
