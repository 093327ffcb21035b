"""The drain gate in a plan: servers behind LiteLLM carry launch/drain_gate.py as vLLM middleware, so a rolling
restart can close one of them to new requests (answered 503, which LiteLLM's weighted failover sends to another
server) while the requests it has finish. vllm-router takes a server out through its worker API instead.

On the node the gate is one file in the node user's own cache directory (not /tmp, where another user could
swap the code a privileged container runs). Only that file is mounted, read-only, into an otherwise empty
directory of the container, which goes in front of the image's own PYTHONPATH: nothing else can be imported from
there (a `sitecustomize.py` or `.pth` left beside it on the node is not in the container, so it never runs as
root inside it). vLLM loads the gate with `--middleware`.

Its flag lives on a tmpfs of the container (FLAG_DIR), so `docker restart` opens a closed server. Closing one is
`docker exec CONTAINER touch FLAG`, and the roll touches it again every LEASE_S / 3 to keep it closed
(`keep_step`, not audit-logged); re-opening is `docker exec CONTAINER rm -f FLAG` (`reopen_step`, the line
`recipe status` and the console show for a closed server). Nothing new listens, and only someone who can run
docker on the node can close or open it. A new container starts open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .drain_gate import FLAG, FLAG_DIR, HEADER, LEASE_S, MIDDLEWARE_ARGS, MODULE, reopen_command
from .progress import Emit
from .steps import NodeExpr, Step

__all__ = ["FLAG", "HEADER", "LEASE_S", "MIDDLEWARE_ARGS", "Held", "close_step", "keep_step", "mount",
           "reopen_command", "reopen_step", "tmpfs", "wrap", "write_step"]
CONTAINER_DIR = "/opt/sparkconsole-gate"
NODE_DIR = '"$HOME"/.cache/sparkconsole/drain-gate'
# The gate's directory goes in front of whatever PYTHONPATH the image sets; then the command runs as PID 1's child
# would have, so the server is still the process whose exit ends the container.
EXEC = f'export PYTHONPATH="{CONTAINER_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"; exec "$@"'
GONE = ("No such container", "is not running")
REOPEN_TIMEOUT_S = 30.0


def write_step(node: str) -> Step:
    return Step(node, f"write the drain gate (vLLM middleware for a rolling restart behind LiteLLM) to "
                      f"~/.cache/sparkconsole/drain-gate/{MODULE}.py",
                ("sh", "-c", f'mkdir -p -- "$1" && cat > "$1/{MODULE}.py"', "sh", NodeExpr(NODE_DIR)),
                input=Path(__file__).with_name("drain_gate.py").read_bytes())


def mount() -> NodeExpr:
    """The gate's one file, not its node directory: the container's directory holds nothing else."""
    return NodeExpr(f"{NODE_DIR}/{MODULE}.py:{CONTAINER_DIR}/{MODULE}.py:ro")


def tmpfs() -> str:
    """The flag's directory, a tmpfs of the container's own: Docker empties it when the container starts again."""
    return f"{FLAG_DIR}:size=64k"


def wrap(command: Sequence[str]) -> tuple[str, ...]:
    return ("sh", "-c", EXEC, "sh", *command)


def close_step(node: str, container: str) -> Step:
    return Step(node, f"close {container} to new requests (drain gate: they are answered 503 and LiteLLM sends "
                      "them to another server)", ("docker", "exec", container, "touch", FLAG))


def keep_step(node: str, container: str) -> Step:
    """The roll still holds it closed (the flag touched again within its lease); not a change to audit."""
    return Step(node, f"keep {container} closed", ("docker", "exec", container, "touch", FLAG), change=False,
                tolerate=GONE)


def reopen_step(node: str, container: str) -> Step:
    return Step(node, f"open {container} to new requests again (drain gate)", ("docker", "exec", container, "rm",
                                                                               "-f", FLAG), tolerate=GONE)


class StepRunner(Protocol):
    """What a held server's touches run through (launch/runner.Runner)."""

    async def run_step(self, step: Step, action: str, emit: Emit) -> str | None: ...


class Held:
    """A server a rolling restart has closed (launch/rolling.py): its flag touched again every LEASE_S / 3 until
    `let_go()` (its container is about to be replaced); `reopen()` when the roll stops before that."""

    def __init__(self, runner: StepRunner, node: str, container: str, key: str, action: str,
                 emit: Emit) -> None:
        self.runner, self.node, self.container, self.key, self.action, self.emit = \
            runner, node, container, key, action, emit
        self._keep: asyncio.Task[None] | None = asyncio.ensure_future(self._keep_closed())

    async def _keep_closed(self) -> None:
        while True:
            await asyncio.sleep(LEASE_S / 3)
            await self.runner.run_step(keep_step(self.node, self.container), self.action, _quiet)

    async def let_go(self) -> None:
        """No more touches; the flag's lease runs out by itself if nothing replaces the container."""
        keep, self._keep = self._keep, None
        if keep is not None:
            keep.cancel()
            await asyncio.gather(keep, return_exceptions=True)

    async def reopen(self) -> None:
        """Open it again now (bounded: the roll is on its way out), and say so, or say how."""
        await self.let_go()
        try:
            why = await asyncio.wait_for(self.runner.run_step(reopen_step(self.node, self.container), self.action,
                                                              self.emit), REOPEN_TIMEOUT_S)
        except TimeoutError:
            why = f"no answer in {REOPEN_TIMEOUT_S:g} s"
        if why is None:
            self.emit(self.node, "info", f"{self.container}: drain gate open again (the roll stopped)", self.key)
        else:
            self.emit(self.node, "failed", f"{self.container} may still be closed to new requests ({why}); it opens "
                                           f"by itself within {LEASE_S:g} s, or now: "
                                           f"{reopen_command(self.node, self.container)}", self.key)


def _quiet(*args: Any, **kwargs: Any) -> None:
    """An emitter that says nothing (the keep-alive touches)."""
