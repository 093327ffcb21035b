"""Each runtime's part of a plan: whether it runs in the topology and backend asked, and the arguments a
multi-node launch gives each rank (sparkconsole/runtimes.py holds their flag vocabulary).

- vLLM, mp: `--nnodes N --node-rank R --master-addr HEAD --master-port P`, `--headless` on every rank but the
  first (spark-vllm-docker's launch-cluster.sh); Ray: the topology starts Ray and adds the executor flag.
- SGLang: `--nnodes N --node-rank R --dist-init-addr HEAD:P` (sglang.launch_server's own multi-node init); its
  ranks after the first run the scheduler only and serve no HTTP. No Ray, no vLLM prefill/decode split.
- llama.cpp: one node.
A command never receives another runtime's flag: each list below is built from its own runtime's table.
"""

from __future__ import annotations

from ..errors import UserError
from ..runtimes import SGLANG, VLLM, Runtime
from .steps import url_host


def check(runtime: Runtime, topology: str, backend: str, router: str | None, source: str | None) -> None:
    """Refuse, in one line naming the runtime, what it cannot run as."""
    runtime.refuse_topology(topology, source)
    if topology == "cluster-tp2" and backend not in runtime.backends:
        raise UserError(f"--backend {backend} is vLLM's; {runtime.title} spreads over nodes its own way",
                        file=source, field="--backend", fix="launch with --backend mp (or leave it out)")
    if topology == "2x-solo" and runtime.name != VLLM and router != "vllm-router":
        # Behind LiteLLM each server carries the drain gate, which is vLLM middleware (launch/gate.py).
        raise UserError(f"behind {router}, a rolling restart closes vLLM's drain gate, which {runtime.title} has not",
                        file=source, field="--router", fix="use --router vllm-router")


def multi_node_args(runtime: Runtime, rank: int, nnodes: int, master: str, master_port: int) -> list[str]:
    """What rank `rank` of an mp (runtime-native) cluster launch adds to its command."""
    if runtime.name == SGLANG:
        return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr",
                f"{url_host(master)}:{master_port}"]
    if runtime.name == VLLM:
        return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", master,
                "--master-port", str(master_port), *(["--headless"] if rank > 0 else [])]
    raise UserError(f"{runtime.title} runs on one node", field="--topology", fix="use --topology solo")

