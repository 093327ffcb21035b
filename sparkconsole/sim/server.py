"""A simulated vLLM OpenAI-compatible server: aiohttp on loopback, token timing from SimEngine.

    python -m sparkconsole.sim.server MODEL [vLLM serve args] [--sim-speed F] [--sim-node-dir DIR ...]

Speaks what vLLM speaks: POST /v1/chat/completions and /v1/completions (SSE chunks shaped like vLLM's,
`stream_options.include_usage`, `ignore_eos`, `min_tokens`, `max_tokens`; non-streaming too), /health,
/v1/models (id, max_model_len), /version (says simulated), /tokenize, /metrics (vLLM's metric names in a
prometheus_client registry, with a model_name label), and GET /sim/clock.

Clock: the engine steps in simulated seconds; the server sleeps step/speed of real time, so with
`--sim-speed F` everything runs F× faster than real time. Every figure the server reports itself
(histograms, usage timings, log throughput) is in simulated seconds; a client measuring wall time
multiplies its intervals by the `speed` from GET /sim/clock (also sent as the `X-Sim-Speed` header).

On a simulated node (started through the docker shim: --sim-node-dir/--sim-container) the server also
plays the node's workload: it loads weights into the node's memory, publishes its GPU busy fraction
for the thermal model and slows down while the node's GPU is thermally throttled.

This module is the process: `main()` reads the command line and runs the server (sim/vllm_server.py, its HTTP
routes in sim/vllm_http.py), a headless rank or a Ray worker that mirrors its head (here), or an idle placeholder
container. The pieces: sim/tokens.py (tokenizer), sim/vllm_args.py (command line, profiles, log lines),
sim/vllm_metrics.py (clock, metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

from ..errors import UserError
from .files import pid_alive, read_json
from .node import write_load
from .tokens import chat_prompt, count_tokens, token_ids, word_for
from .vllm_args import SIM_VERSION, VLLM_VERSION, log, profile_for, vllm_parser
from .vllm_metrics import Metrics, SimClock
from .vllm_server import ENGINE_WAKEUP_S, SimVllmServer

__all__ = ["main", "mirror_head", "SimVllmServer", "SimClock", "Metrics", "ENGINE_WAKEUP_S", "VLLM_VERSION",
           "SIM_VERSION", "vllm_parser", "profile_for", "log", "token_ids", "count_tokens", "chat_prompt", "word_for"]

# ---------------------------------------------------------------------------------------------------
# workers and placeholders (no HTTP)

def _node_by_address(node_dir: Path, address: str) -> Path | None:
    for other in node_dir.parent.iterdir():
        sim = read_json(other / "sim.json")
        if isinstance(sim, dict) and sim.get("address") == address:
            return other
    return None


async def mirror_head(node_dir: Path | None, key: str | None, head_addr: str | None, what: str) -> int:
    """A headless rank (vLLM --headless, or a Ray worker) holds its share of a head's model: mirror the
    head's memory and busy fraction on this node until stopped."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log(f"{what}: waiting for head at {head_addr or '?'}", "multiproc_executor.py")
    sim = (read_json(node_dir / "sim.json") if node_dir else None) or {}
    owner = sim.get("owner_pid")
    joined = False
    try:
        while not stop.is_set():
            if node_dir and key and head_addr:
                head_dir = _node_by_address(node_dir, head_addr)
                best = None
                for p in (head_dir / "load").glob("*.json") if head_dir else ():
                    d = read_json(p)
                    if isinstance(d, dict) and (d.get("tp_nodes") or 1) > 1 and pid_alive(d.get("pid")):
                        best = d
                reserved = int(best.get("reserved_b", 0)) if best else 0
                busy = float(best.get("gpu_busy", 0.0)) if best else 0.0
                compute = float(best.get("compute_frac", 0.0)) if best else 0.0
                write_load(node_dir, key, pid=os.getpid(), reserved_b=reserved, gpu_busy=busy, compute_frac=compute,
                           loaded=reserved > 0, phase="worker", mirror_of=head_addr)
                if best and not joined:
                    joined = True
                    log(f"{what}: joined head at {head_addr}", "multiproc_executor.py")
            # the simulated cluster that owns this node is gone: nothing will ever stop us otherwise
            if (node_dir and not node_dir.is_dir()) or (owner and not pid_alive(owner)):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
    finally:
        if node_dir and key:
            (node_dir / "load" / f"{key}.json").unlink(missing_ok=True)
    return 0


def _ray_head_address(cmd: list[str]) -> str | None:
    text = " ".join(cmd)
    if "ray" not in text or "start" not in text or "--head" in text:
        return None
    m = re.search(r"--address[= ]['\"]?([^:'\" ]+)", text)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--sim-idle" in argv:
        # A placeholder container (anything that is not a vLLM server): stays up until stopped.
        i = argv.index("--")
        ns, _ = vllm_parser().parse_known_args(argv[:i])
        cmd = argv[i + 1:]
        log(f"simulated container runs: {' '.join(cmd) or '(image default)'}", "sim")
        node_dir = Path(ns.sim_node_dir) if ns.sim_node_dir else None
        code = asyncio.run(mirror_head(node_dir, ns.sim_container, _ray_head_address(cmd), "ray worker"))
        _write_exit(ns, code)
        return code
    ns, unknown = vllm_parser().parse_known_args(argv)
    if unknown:
        log(f"simulated vLLM ignores arguments: {' '.join(unknown)}", "arg_utils.py", "WARNING")
    if ns.headless:
        node_dir = Path(ns.sim_node_dir) if ns.sim_node_dir else None
        code = asyncio.run(mirror_head(node_dir, ns.sim_container, ns.master_addr, f"headless rank {ns.node_rank}"))
        _write_exit(ns, code)
        return code
    try:
        server = SimVllmServer(ns)
        code = asyncio.run(server.run())
    except UserError as exc:
        log(f"ValueError: {exc.problem}" + (f" ({exc.fix})" if exc.fix else ""), "core.py", "ERROR")
        code = 1
    except OSError as exc:
        log(f"OSError: {exc}", "api_server.py", "ERROR")
        code = 1
    _write_exit(ns, code)
    return code


def _write_exit(ns: argparse.Namespace, code: int) -> None:
    if ns.sim_node_dir and ns.sim_container and not ns.sim_exec:
        d = Path(ns.sim_node_dir) / "containers" / ns.sim_container
        try:
            if d.is_dir():
                (d / "exitcode").write_text(f"{code}\n")
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
