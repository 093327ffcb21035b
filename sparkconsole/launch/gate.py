"""The drain gate in a plan: servers behind LiteLLM carry launch/drain_gate.py as vLLM middleware, so a rolling
restart can close one of them to new requests (answered 503, which LiteLLM's weighted failover sends to another
server) while the requests it has finish. vllm-router takes a server out through its worker API instead.

On the node the gate is one file in the node user's own cache directory (not /tmp, where another user could
swap the code a privileged container runs), mounted read-only into the container; the container's command runs
with that directory in front of the image's own PYTHONPATH, and vLLM loads the gate with `--middleware`. Closing
a server is `docker exec CONTAINER touch FLAG`: nothing new listens, and only someone who can run docker on the
node can close it. A new container starts open.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .drain_gate import FLAG, MIDDLEWARE_ARGS, MODULE
from .steps import NodeExpr, Step

__all__ = ["FLAG", "MIDDLEWARE_ARGS", "close_step", "mount", "wrap", "write_step"]
CONTAINER_DIR = "/opt/sparkconsole-gate"
NODE_DIR = '"$HOME"/.cache/sparkconsole/drain-gate'
# The gate's directory goes in front of whatever PYTHONPATH the image sets; then the command runs as PID 1's child
# would have, so the server is still the process whose exit ends the container.
EXEC = f'export PYTHONPATH="{CONTAINER_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"; exec "$@"'


def write_step(node: str) -> Step:
    return Step(node, f"write the drain gate (vLLM middleware for a rolling restart behind LiteLLM) to "
                      f"~/.cache/sparkconsole/drain-gate/{MODULE}.py",
                ("sh", "-c", f'mkdir -p -- "$1" && cat > "$1/{MODULE}.py"', "sh", NodeExpr(NODE_DIR)),
                input=Path(__file__).with_name("drain_gate.py").read_bytes())


def mount() -> NodeExpr:
    return NodeExpr(f"{NODE_DIR}:{CONTAINER_DIR}:ro")


def wrap(command: Sequence[str]) -> tuple[str, ...]:
    return ("sh", "-c", EXEC, "sh", *command)


def close_step(node: str, container: str) -> Step:
    return Step(node, f"close {container} to new requests (drain gate: they are answered 503 and LiteLLM sends "
                      "them to another server)", ("docker", "exec", container, "touch", FLAG))
