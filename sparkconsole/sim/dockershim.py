"""The `docker` CLI of a simulated node: what the agent and the recipe runner call, answered from files.

`install(node_dir)` writes `<node_dir>/bin/docker`, a two-line script that runs this module for that node;
a sim node's PATH puts it first, so the real agent and the real runner reach it as plain `docker`.

Containers are directories (`<node_dir>/containers/NAME/container.json` + `log`); a running container is a
detached process: a simulated vLLM server (`vllm serve MODEL …`, the vllm/vllm-openai entrypoint or
`python -m vllm.entrypoints.openai.api_server`), a simulated router (vllm-router, LiteLLM), or an idle
placeholder for anything else (`ray start --block`, `sleep infinity`). There is no daemon: state that docker
would track (exit code, OOMKilled) is read back from the files the processes leave.

Supported: ps, inspect, container inspect/ls, run, start, stop, kill, rm, restart, logs, exec (vllm serve),
image inspect/ls, images, pull (local images only), version, info. Output shapes follow docker's
(`--format` Go templates: fields, json, index, lower/upper, if/else/end; table headers).

The pieces: sim/dockerfmt.py (docker's output formats, Go templates), sim/containers.py (the container store and the
processes), sim/dockercmds.py (the subcommands and `dispatch`); this module is the CLI's entry and `install`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from .containers import Store
from .dockercmds import dispatch
from .dockerfmt import DockerError
from .files import write_atomic

SHIM_MARK = "sparkconsole simulated docker CLI"

__all__ = ["install", "main", "dispatch", "Store", "DockerError", "SHIM_MARK"]


def install(node_dir: Path) -> Path:
    """Write the node's `docker` script (first on the sim node's PATH)."""
    node_dir = Path(node_dir)
    path = node_dir / "bin" / "docker"
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = shlex.join([sys.executable, "-m", "sparkconsole.sim.dockershim", "--node-dir", str(node_dir)])
    write_atomic(path, f"#!/bin/sh\n# {SHIM_MARK} for {node_dir.name} (not a real docker)\nexec {argv} \"$@\"\n")
    path.chmod(0o755)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "--node-dir":
        sys.stderr.write("usage: python -m sparkconsole.sim.dockershim --node-dir DIR DOCKER-ARGS...\n")
        return 2
    store = Store(Path(argv[1]))
    try:
        return dispatch(store, argv[2:])
    except DockerError as e:
        sys.stderr.write(f"{e}\n")
        return e.rc
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
