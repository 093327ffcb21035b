"""SimCluster: start and stop a simulated GB10 cluster with a model already served on it.

    sim = SimCluster(speed=10)                 # spark1 127.0.0.2, spark2 127.0.0.3
    await sim.start()                          # nodes, then the topology through each node's docker shim
    # or, nodes first (the demo's console draws them while the model loads):
    await sim.start_nodes()                    # tens of ms: sim.cluster is complete, endpoints not up yet
    await sim.serve(progress=print)            # containers, router; sim.ready[endpoint] set as each answers
    sim.cluster                                # ClusterConfig(simulated=True): local nodes + endpoints
    await sim.run_load(url, concurrency=8, seconds=30)
    rw = sim.runaway("spark2", "memory")       # memory | thermal | link: the node freezes, shuts down, is cut off
    await sim.stop()                           # containers removed, processes ended, state dir deleted

Nodes are reached by the real agent over the real LocalTransport (NodeConfig.local with agent_args and
env from SimNode); the model is started with the same `docker run … vllm serve …` commands a recipe
plan sends, answered by the node's docker shim.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..config import ClusterConfig, EndpointConfig, NodeConfig
from ..errors import UserError
from ..launch.drain_gate import FLAG_DIR, MIDDLEWARE_ARGS
from ..placement.budget import GB10_MEMTOTAL_B
from .node import NodeTuning, SimNode
from .state import STATE_PREFIX, claim_addresses, claim_port, kill_leftovers, release_ports, sweep_stale

DEFAULT_NODES = (("spark1", "127.0.0.2"), ("spark2", "127.0.0.3"))
CONTAINER = "vllm_node"
ROUTER_CONTAINER = "vllm_node_router"     # the name the recipe's plan gives it (launch/routers.py): its stop finds it
IMAGE = "vllm-node-mxfp4"


@dataclass(frozen=True)
class Serving:
    """What the cluster serves at start: a topology name, the model and its vLLM arguments."""
    topology: str = "2x-solo"                    # none | solo | cluster-tp2 | 2x-solo
    router: str = "litellm-simple-shuffle"       # litellm-simple-shuffle | litellm-least-busy | vllm-router
    model: str = "openai/gpt-oss-120b"
    # The bundled recipe this serving is (the demo's: gpt-oss-120b), put on the containers as a launch's
    # `sparkconsole.*` labels: the console shows that recipe running in that topology, and stops it with its plan.
    recipe: str | None = None
    # Names the servers answer to before `model` (vLLM's --served-model-name takes several and names the first
    # in its answers): the recipe's own served name, as a launch of that recipe serves it, so the recipe's plan
    # finds its model on the demo's servers (readiness, a restart that launches a server again from the plan).
    served_names: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The model name clients ask for."""
        return self.served_names[0] if self.served_names else self.model
    # The published gpt-oss-120b settings (gpt-oss-120b-topologies.csv header).
    vllm_args: tuple[str, ...] = ("--gpu-memory-utilization", "0.70", "--max-model-len", "4096",
                                  "--max-num-batched-tokens", "32768", "--kv-cache-dtype", "fp8",
                                  "--enforce-eager")


TOPOLOGIES = ("none", "solo", "cluster-tp2", "2x-solo")
ROUTERS = ("litellm-simple-shuffle", "litellm-least-busy", "vllm-router")


if TYPE_CHECKING:

    from .runaway import Runaway

# aiohttp (a fifth of a second to import) is only needed to reach the endpoints: it is imported when serve()
# or run_load() first runs, in a thread, so a console drawing the nodes meanwhile does not stall.


async def _aiohttp() -> ModuleType:
    return await asyncio.to_thread(__import__, "aiohttp")


class SimCluster:
    def __init__(self, *, speed: float = 1.0, nodes: tuple[tuple[str, str], ...] = DEFAULT_NODES,
                 serving: Serving | None = None, root: str | Path | None = None, load_speedup: float = 1.0,
                 tunings: dict[str, NodeTuning] | None = None, vllm_port: int = 8000, router_port: int = 4000,
                 keepalive_s: float | None = None, fixed_ports: tuple[int, ...] = ()) -> None:
        if not speed > 0:
            raise UserError(f"speed must be positive, got {speed}", field="--speed", fix="use e.g. 1 or 10")
        self.speed = float(speed)
        self.serving = serving or Serving()
        if self.serving.topology not in TOPOLOGIES:
            raise UserError(f"unknown topology {self.serving.topology!r}", field="--topology",
                            fix="use one of " + ", ".join(TOPOLOGIES))
        if self.serving.router not in ROUTERS:
            raise UserError(f"unknown router {self.serving.router!r}", field="--router", fix="use one of " + ", ".join(ROUTERS))
        if self.serving.topology in ("cluster-tp2", "2x-solo") and len(nodes) < 2:
            raise UserError(f"topology {self.serving.topology} needs two nodes", field="--topology", fix="use solo")
        self._own_root = root is None
        self.root = Path(root) if root else None
        self.node_specs = nodes
        self.load_speedup = load_speedup
        self.tunings = tunings or {}
        self.vllm_port_pref = vllm_port
        self.router_port_pref = router_port
        self.keepalive_s = keepalive_s          # None: SSH's (sim/node.py KEEPALIVE_S)
        # Ports that servers launched on the nodes will bind as given (a recipe's, launched through the runner):
        # start_nodes() then gives the nodes loopback addresses where those are free, in place of `nodes`' own.
        self.fixed_ports = fixed_ports
        self.runaways: list[Runaway] = []
        self.nodes: dict[str, SimNode] = {}
        self.ports: dict[str, int] = {}
        self.router_url: str | None = None
        self._router_port: int | None = None
        self.cluster: ClusterConfig | None = None
        # One event per endpoint of self.cluster, set once it answers /health (serve() sets them).
        self.ready: dict[str, asyncio.Event] = {}
        self._load_tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    # ---- layout ----------------------------------------------------------------------------------
    def node_dir(self, name: str) -> Path:
        return self.nodes[name].dir

    def docker_argv(self, node: str, *args: str) -> list[str]:
        return [str(self.nodes[node].bin_dir / "docker"), *args]

    async def docker(self, node: str, *args: str, check: bool = True) -> tuple[int, str]:
        """Run a docker command on a sim node, as the recipe runner would (its shim first on PATH)."""
        env = dict(os.environ)
        env.update(dict(self.nodes[node].env()))
        proc = await asyncio.create_subprocess_exec("docker", *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        if check and proc.returncode != 0:
            raise UserError(f"docker {args[0]} on {node} failed: {text.strip()[-300:]}")
        return proc.returncode or 0, text

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self, *, wait: bool = True, timeout: float = 300.0) -> None:
        """Nodes, then the topology; with `wait`, until every endpoint serves."""
        await self.start_nodes()
        try:
            await self.serve(wait=wait, timeout=timeout)
        except BaseException:
            await self.stop()
            raise

    async def start_nodes(self) -> None:
        """The simulated nodes only (their agents can be read at once) and the ports the topology will use, so
        `self.cluster` — nodes and endpoints — is complete before anything is served."""
        if self.root is None:
            sweep_stale(Path(tempfile.gettempdir()))
            self.root = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
        try:
            if self.fixed_ports:
                addrs = claim_addresses(len(self.node_specs), self.fixed_ports, self.root)
                self.node_specs = tuple((name, addr) for (name, _), addr in zip(self.node_specs, addrs, strict=True))
            for i, (name, addr) in enumerate(self.node_specs):
                tuning = self.tunings.get(name) or (NodeTuning.hardened() if i == 0 else NodeTuning.stock())
                node = SimNode(name, addr, self.root, speed=self.speed, tuning=tuning, load_speedup=self.load_speedup,
                               keepalive_s=self.keepalive_s)
                await node.start()
                self.nodes[name] = node
                self.ports[name] = claim_port(addr, self.vllm_port_pref, self.root)
            if self.serving.topology == "2x-solo":
                head = self.nodes[next(iter(self.nodes))].address
                self._router_port = claim_port(head, self.router_port_pref, self.root)
                self.router_url = f"http://{head}:{self._router_port}"
            self.cluster = self._config()
            self.ready = {ep.name: asyncio.Event() for ep in self.cluster.endpoints}
        except BaseException:
            await self.stop()
            raise

    async def serve(self, *, wait: bool = True, timeout: float = 300.0,
                    progress: Callable[[str], None] | None = None) -> None:
        """Start the topology's containers through the nodes' docker shims (after start_nodes); with `wait`, until
        every endpoint answers /health. `progress(line)` hears each step as it happens. On failure the nodes stay
        up (the caller decides; stop() ends everything)."""
        say = progress or (lambda line: None)
        if self.serving.topology != "none":
            say(f"starting {self.serving.model} as {self.serving.topology} on "
                f"{', '.join(self.serving_nodes() if self.serving.topology != 'cluster-tp2' else self.nodes)}…")
        await self._launch()
        if self.router_url and self.serving.topology == "2x-solo":
            say(f"router {self.serving.router} starting at {self.router_url}")
        if wait:
            await self.wait_ready(timeout, progress=say)

    def _labels(self, node: str, role: str, url: str | None) -> list[str]:
        """The labels a recipe plan puts on a launch's containers (launch/steps.py launch_labels)."""
        if not self.serving.recipe:
            return []
        labels = [f"recipe={self.serving.recipe}", f"topology={self.serving.topology}", f"role={role}", f"node={node}",
                  f"workload={self.serving.recipe}"]       # a plan's name: its recipe's key unless --name
        if url:
            labels += [f"url={url}", f"model={self.serving.name}"]
        if role in ("server", "worker"):
            # what the server claims of the simulated GB10 (gpu_memory_utilization × MemTotal): the budget bars
            args = list(self.serving.vllm_args)
            if "--gpu-memory-utilization" in args:
                frac = float(args[args.index("--gpu-memory-utilization") + 1])
                labels.append(f"claim={int(frac * GB10_MEMTOTAL_B)}")
        if role == "router":
            labels.append(f"router={self.serving.router.removeprefix('litellm-')}")
        if role in ("server", "worker") and self.serving.topology == "cluster-tp2":
            labels.append("ranks=2")        # the simulated cluster launch: TP 2 over the first two nodes
        return [a for label in labels for a in ("--label", f"sparkconsole.{label}")]

    def _vllm_run(self, node: str, extra: tuple[str, ...] = ()) -> list[str]:
        s = self.serving
        worker = "--headless" in extra
        url = None if worker else f"http://{self.nodes[node].address}:{self.ports[node]}"
        gated = s.topology == "2x-solo" and s.router.startswith("litellm")
        return ["run", "-d", "--name", CONTAINER, *self._labels(node, "worker" if worker else "server", url),
                "--gpus", "all", "--network", "host", "--ipc=host",
                "--memory", "100g", "--shm-size", "16g", "--restart", "no", *(("--tmpfs", FLAG_DIR) if gated else ()),
                IMAGE,
                "vllm", "serve", s.model, "--port", str(self.ports[node]), *s.vllm_args,
                *(("--served-model-name", *s.served_names, s.model) if s.served_names else ()), *extra,
                # as a plan gives a server behind LiteLLM (launch/gate.py): the simulated server honours the drain gate,
                # so `r` in the demo closes, drains and restarts each server behind LiteLLM too
                *(MIDDLEWARE_ARGS if gated else ())]

    async def _launch(self) -> None:
        s = self.serving
        names = list(self.nodes)
        if s.topology == "none":
            return
        if s.topology == "solo":
            await self.docker(names[0], *self._vllm_run(names[0]))
        elif s.topology == "2x-solo":
            for n in names[:2]:
                await self.docker(n, *self._vllm_run(n))
            await self._launch_router(names[:2])
        elif s.topology == "cluster-tp2":
            head, worker = names[0], names[1]
            haddr = self.nodes[head].address
            common = ("--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", haddr, "--master-port", "29501")
            await self.docker(head, *self._vllm_run(head, (*common, "--node-rank", "0")))
            await self.docker(worker, *self._vllm_run(worker, (*common, "--node-rank", "1", "--headless")))

    async def _launch_router(self, backends: list[str]) -> None:
        head = backends[0]
        addr = self.nodes[head].address
        assert self.root is not None           # start_nodes made it
        port = self._router_port or claim_port(addr, self.router_port_pref, self.root)
        urls = [f"http://{self.nodes[n].address}:{self.ports[n]}/v1" for n in backends]
        served = self.serving.name
        if self.serving.router == "vllm-router":
            args = ["run", "-d", "--name", ROUTER_CONTAINER, *self._labels(head, "router", f"http://{addr}:{port}"),
                    "--network", "host", "lmsysorg/vllm-router:latest",
                    "vllm-router", "--host", addr, "--port", str(port), "--policy", "random", "--worker-urls", *urls]
        else:
            strategy = self.serving.router.removeprefix("litellm-")
            cfg = self.node_dir(head) / "litellm.yaml"
            cfg.write_text(json.dumps({   # JSON is YAML: the LiteLLM config
                "model_list": [{"model_name": served, "litellm_params": {"model": f"hosted_vllm/{served}",
                                                                        "api_base": u}} for u in urls],
                "router_settings": {"routing_strategy": strategy}}, indent=1))
            args = ["run", "-d", "--name", ROUTER_CONTAINER, *self._labels(head, "router", f"http://{addr}:{port}"),
                    "--network", "host", "-v", f"{cfg}:/app/config.yaml:ro",
                    "ghcr.io/berriai/litellm:main-stable",
                    "--config", "/app/config.yaml", "--host", addr, "--port", str(port)]
        await self.docker(head, *args)
        self.router_url = f"http://{addr}:{port}"

    def _config(self) -> ClusterConfig:
        nodes = []
        for i, (name, node) in enumerate(self.nodes.items()):
            nodes.append(NodeConfig(name=name, address=node.address, role="head" if i == 0 else "worker",
                                    container=CONTAINER, vllm_port=self.ports[name], local=True,
                                    agent_args=node.agent_args(), env=node.env()))
        eps = []
        if self.router_url:
            eps.append(EndpointConfig(name="router", url=self.router_url, kind="router", node=nodes[0].name))
        for n in self.serving_nodes():
            eps.append(EndpointConfig(name=n, url=f"http://{self.nodes[n].address}:{self.ports[n]}", kind="vllm", node=n))
        return ClusterConfig(nodes=tuple(nodes), endpoints=tuple(eps), source="<simulated>", simulated=True)

    def serving_nodes(self) -> list[str]:
        names = list(self.nodes)
        return {"none": [], "solo": names[:1], "cluster-tp2": names[:1], "2x-solo": names[:2]}[self.serving.topology]

    async def wait_ready(self, timeout: float = 300.0, *, progress: Callable[[str], None] | None = None) -> None:
        """Until every endpoint answers /health with 200 (vLLM binds only once the model is loaded); each one's
        `self.ready` event is set (and `progress` told) as it does."""
        assert self.cluster is not None
        aiohttp = await _aiohttp()
        t0 = deadline = time.monotonic()
        deadline += timeout
        pending = {ep.name: ep.url for ep in self.cluster.endpoints}
        async with aiohttp.ClientSession() as s:
            while pending:
                for name, url in list(pending.items()):
                    try:
                        async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                            if r.status == 200:
                                del pending[name]
                                if name in self.ready:
                                    self.ready[name].set()
                                if progress:
                                    progress(f"{name} serving at {url} ({time.monotonic() - t0:.1f} s)")
                    except (TimeoutError, aiohttp.ClientError, OSError):
                        pass
                if not pending:
                    break
                if time.monotonic() > deadline:
                    logs = ""
                    for n in self.nodes:
                        for c in (CONTAINER, ROUTER_CONTAINER):
                            rc, text = await self.docker(n, "logs", "--tail", "3", c, check=False)
                            if rc == 0 and text.strip():
                                logs += f" [{n}/{c}] " + " | ".join(text.strip().splitlines()[-3:])
                    raise UserError(f"simulated endpoints not ready after {timeout:.0f}s: {', '.join(pending)};{logs}")
                await asyncio.sleep(0.2)

    async def stop(self) -> None:
        # Once only: a second pass would run `docker` with the shims' directory gone, i.e. the host's docker.
        if self._stopped:
            return
        self._stopped = True
        for t in list(self._load_tasks):
            t.cancel()
        async def clear(name: str) -> None:
            try:
                rc, out = await self.docker(name, "ps", "-aq", check=False)
                ids = out.split()
                if ids and rc == 0:
                    await self.docker(name, "rm", "-f", *ids, check=False)
            except OSError:
                pass
        await asyncio.gather(*(clear(n) for n in list(self.nodes)))
        for node in self.nodes.values():
            await node.stop()
        if self.root is not None:
            kill_leftovers(self.root)
            release_ports(self.root)
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    # ---- runaways -------------------------------------------------------------------------------
    def runaway(self, node: str, kind: str, *, duration_s: float | None = None,
                say: Callable[[str], None] | None = None) -> Runaway:
        """Start a runaway on one node while the cluster runs (sim/runaway.py): `memory` (the vLLM process's GPU
        memory grows until the guard stops it or the node freezes), `thermal` (cooling fails, the GPU heats to shutdown, the node powers
        off) or `link` (the node is cut off). `duration_s`: simulated seconds to exhaustion / shutdown (defaults in
        sim/runaway.py). `say(line)` hears what happens. Returns the Runaway: `done`, `outcome`, `ended_at`."""
        from .runaway import KINDS, make
        if kind not in KINDS:
            raise UserError(f"unknown runaway {kind!r}", field="--runaway", fix="use one of " + ", ".join(KINDS))
        if node not in self.nodes:
            raise UserError(f"no simulated node {node!r}", field="--runaway",
                            fix="name one of " + ", ".join(self.nodes))
        sim_node = self.nodes[node]
        if sim_node.silence is not None or (sim_node.runaway is not None and not sim_node.runaway.over):
            raise UserError(f"{node} already has a runaway", field="--runaway", fix="pick another node")
        if duration_s is not None and not duration_s > 0:
            raise UserError(f"runaway duration {duration_s} must be positive", field="duration_s", fix="e.g. 60")
        rw = make(kind, node, duration_s=duration_s, container=CONTAINER, say=say)
        sim_node.runaway = rw
        self.runaways.append(rw)
        return rw

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- load ------------------------------------------------------------------------------------
    async def run_load(self, url: str | None = None, concurrency: int = 4, seconds: float | None = 30.0, *,
                       prompt_words: tuple[int, int] = (200, 1000), max_tokens: tuple[int, int] = (64, 512),
                       seed: int = 0) -> dict[str, int]:
        """Keep `concurrency` streaming chat requests in flight against `url` (default: the first endpoint)
        for `seconds` of real time (None: until cancelled). Returns counts: requests, tokens, errors."""
        assert self.cluster is not None
        url = (url or (self.router_url or self.cluster.endpoints[0].url)).rstrip("/")
        stats = {"requests": 0, "tokens": 0, "errors": 0}
        deadline = None if seconds is None else time.monotonic() + seconds
        rng = random.Random(seed)
        words = ["node", "cluster", "model", "token", "memory", "spark", "bandwidth", "router", "latency", "prefill", "decode", "batch", "cache", "thermal", "power", "clock", "tensor", "parallel", "request", "stream"]

        aiohttp = await _aiohttp()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            async with s.get(url + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]

            async def worker() -> None:
                while deadline is None or time.monotonic() < deadline:
                    n = rng.randint(*prompt_words)
                    body = {"model": model, "stream": True, "max_tokens": rng.randint(*max_tokens), "ignore_eos": True,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(n))}]}
                    try:
                        async with s.post(url + "/v1/chat/completions", json=body) as r:
                            if r.status != 200:
                                stats["errors"] += 1
                                await asyncio.sleep(0.5)
                                continue
                            async for line in r.content:
                                if line.startswith(b"data: {") and b'"usage"' in line:
                                    stats["tokens"] += json.loads(line[6:])["usage"]["completion_tokens"]
                        stats["requests"] += 1
                    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError):
                        stats["errors"] += 1
                        await asyncio.sleep(0.5)

            tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
            self._load_tasks.update(tasks)
            try:
                await asyncio.gather(*tasks)
            except asyncio.CancelledError:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            finally:
                self._load_tasks.difference_update(tasks)
        return stats


__all__ = ["SimCluster", "Serving", "TOPOLOGIES", "ROUTERS"]
