"""The simulated `vllm serve` command line: vLLM's flags (and the simulator's own), the model profile a model name
maps to, and log lines shaped like vLLM's."""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import UserError
from .profiles import MODELS, ModelProfile

VLLM_VERSION = "0.11.0"
SIM_VERSION = f"{VLLM_VERSION}+sim"


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve (simulated)", add_help=True, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key")
    p.add_argument("--middleware", action="append", default=[])
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=lambda s: int(float(s.lower().replace("k", "")) * (1024 if "k" in s.lower() else 1)))
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true", default=True)
    p.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false")
    p.add_argument("--prefix-caching", dest="prefix_caching", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=int)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--distributed-executor-backend")
    p.add_argument("--seed", type=int, default=0)
    # simulator-only flags (the docker shim adds the node ones)
    p.add_argument("--sim-speed", type=float)
    p.add_argument("--sim-profile", help="model profile name (default: matched from the model name)")
    p.add_argument("--sim-node-dir")
    p.add_argument("--sim-container")
    p.add_argument("--sim-memory-limit", type=int, default=0)
    p.add_argument("--sim-idle", action="store_true")
    p.add_argument("--sim-exec", action="store_true", help="started by docker exec: not the container's main process")
    p.add_argument("--sim-load-speedup", type=float)
    return p


def profile_for(model: str, override: str | None = None) -> ModelProfile:
    if override:
        if override not in MODELS:
            raise UserError(f"no simulated profile {override!r}", field="--sim-profile", fix="use one of " + ", ".join(MODELS))
        return MODELS[override]
    norm = model.lower().rstrip("/").rsplit("/", 1)[-1]
    for key in sorted(MODELS, key=len, reverse=True):
        if norm.startswith(key) or key in norm:
            return MODELS[key]
    raise UserError(f"the simulator has no profile for model {model!r}", field="model",
                    fix="serve one of " + ", ".join(MODELS) + " (or pass --sim-profile NAME)")


# ---------------------------------------------------------------------------------------------------
# logging like vLLM's

def log(msg: str, where: str = "api_server.py", level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stdout.write(f"{level} {stamp} [{where}] {msg}\n")
    sys.stdout.flush()

