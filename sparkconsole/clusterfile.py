"""Which cluster a command works on, and the one line that says where it came from.

Every command that needs the cluster (console, status, recipe, bench, model, image, exporter, record) asks here:
`--cluster PATH`, then ./sparkconsole.yaml, then ~/.config/sparkconsole/sparkconsole.yaml; with none of those, the
`.env` of a spark-vllm-docker checkout in the current directory (dotenv_cluster.py); else this machine as one node.
The line goes to stderr (a --json answer on stdout stays clean) or, in the console, to the screen.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .config import ClusterConfig, find_config, load_cluster, local_cluster
from .errors import UserError


@dataclass(frozen=True)
class Resolved:
    cluster: ClusterConfig
    origin: str                     # one line: where the cluster came from


def _home_short(p: Path) -> str:
    home = str(Path.home())
    s = str(p)
    return "~" + s[len(home):] if home != "/" and (s == home or s.startswith(home + os.sep)) else s


def resolve(explicit: str | None = None, cwd: Path | None = None) -> Resolved:
    here = (cwd or Path.cwd()).resolve()
    path = find_config(explicit, here)
    if path is not None:
        if not path.is_file():
            raise UserError("cluster file not found", file=str(path), fix="check the path given to --cluster")
        return Resolved(load_cluster(path), f"cluster: {path.resolve()}")
    from .dotenv_cluster import checkout_env, checkout_gap, cluster_from_dotenv
    env = checkout_env(here)
    if env is not None:
        got = cluster_from_dotenv(env)
        n = len(got.cluster.nodes)
        notes = "".join(f"; {note}" for note in got.notes)
        return Resolved(got.cluster, f"cluster: .env of the spark-vllm-docker checkout at {here} "
                                     f"({n} node{'s' if n != 1 else ''}{notes})")
    xdg = _home_short(Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "sparkconsole")
    gap = checkout_gap(here)
    return Resolved(local_cluster(), f"cluster: no sparkconsole.yaml found (looked in ./ and {xdg}/)"
                                     + (f"; {gap}" if gap else "")
                                     + ": watching this machine — write one with `sparkconsole init`")


def cluster_for(args: object, *, say: Callable[[str], object] | None = None) -> ClusterConfig:
    """The cluster for a command's parsed arguments (`--cluster`), its origin said on stderr (or to `say`)."""
    got = resolve(getattr(args, "cluster", None))
    (say or (lambda line: print(line, file=sys.stderr, flush=True)))(got.origin)
    return got.cluster
