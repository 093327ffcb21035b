"""Restarts that drop no request (launch/rolling.py): the plan in words, and on the real test engine a rolling
restart of 2x-solo behind the real vllm-router with a client sending requests through it the whole time.

The servers are test_runner.py's stdlib stand-in, extended here with what a drain reads: a /metrics with vLLM's
`vllm:num_requests_running` / `vllm:num_requests_waiting`, completions that take a while (a prompt "sleep N"
holds one N seconds), and a death on start-up once a marker file for its address exists (a server that does not
come back). Behind LiteLLM the stand-in answers by the real drain gate's rule (`closed()`, `generates()`, its
header), imported from the one file the plan mounts into its container; the gate's ASGI class itself runs in front
of vLLM 0.32's own app (the test bed's vLLM venv), loaded by vLLM's `--middleware`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import httpx
import pytest

from sparkconsole import audit
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.rolling import restart, restart_text, rolls
from sparkconsole.launch.runner import LaunchError, Runner
from tests.helpers import longest_alone
from tests.test_runner import containers, fake_recipe, local_cluster, local_transports, started_at, state  # noqa: F401 (fixtures)

SERVER = '''\
import json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
try:                                   # the real drain gate's rule, from the one file the plan mounts (behind LiteLLM)
    import sparkconsole_drain_gate as gate
except ImportError:
    gate = None
port, host, model, delay, fail_host = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
print(f"INFO starting {model} on {host}:{port}", file=sys.stderr, flush=True)
time.sleep(delay)
if host == fail_host or os.path.exists(os.path.join(os.path.dirname(__file__), "fail-" + host)):
    print("Traceback (most recent call last):", file=sys.stderr)
    print(f"ValueError: boom on {host}", file=sys.stderr, flush=True)
    sys.exit(1)
running = 0
lock = threading.Lock()

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def closed(self):
        return gate is not None and gate.closed()

    def reply(self, body, ctype="application/json"):
        self.send_response(200)
        if self.closed():
            self.send_header(gate.HEADER, "closed")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.reply(b"")
        elif self.path == "/v1/models":
            self.reply(json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode())
        elif self.path == "/metrics":
            with lock:
                n = running
            self.reply((f'vllm:num_requests_running{{model_name="{model}"}} {n}.0\\n'
                        f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\\n').encode(), "text/plain")
        else:
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()

    def do_POST(self):
        global running
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.closed() and gate.generates(self.path.split("?")[0]):     # as the gate answers in vLLM
            self.send_response(503); self.send_header(gate.HEADER, "closed"); self.send_header("Content-Length", "0")
            self.end_headers()
            return
        prompt = str(req.get("prompt", ""))
        with lock:
            running += 1
        try:
            time.sleep(float(prompt.split()[1]) if prompt.startswith("sleep ") else 0.2)
            body = {"id": "c1", "object": "text_completion", "created": 0, "model": model,
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    "choices": [{"index": 0, "text": host, "finish_reason": "length"}]}
            self.reply(json.dumps(body).encode())
        finally:
            with lock:
                running -= 1

    def log_message(self, *a):
        pass

print("INFO Application startup complete.", file=sys.stderr, flush=True)
ThreadingHTTPServer((host, port), H).serve_forever()
'''


def roll_recipe(tmp_path: Path, image: str, router_venv: Path):
    recipe = fake_recipe(tmp_path, image, router_venv=router_venv)
    (tmp_path / "server.py").write_text(SERVER)        # the recipe's command runs this file
    return recipe


# --- the plan in words --------------------------------------------------------------------------------------
def _cluster(tmp_path):
    from sparkconsole.config import ClusterConfig, NodeConfig
    nodes = tuple(NodeConfig(name=f"node{i + 1}", address=f"127.0.0.{i + 2}", role="head" if i == 0 else "worker",
                             container=f"sc_plan_{i + 1}", vllm_port=18000 + i, local=True) for i in range(2))
    return ClusterConfig(nodes=nodes, endpoints=(), source="<plan test>")


def test_restart_plan_of_2x_solo_rolls_one_server_at_a_time(tmp_path):
    recipe = fake_recipe(tmp_path, "img:1", router_venv=tmp_path)
    plan = make_plan(recipe, "2x-solo", _cluster(tmp_path))
    assert rolls(plan)
    text = restart_text(plan, drain_timeout=45)
    assert "rolling, one server at a time behind vllm-router" in text
    first, second = text.index("sc_plan_1 on node1"), text.index("sc_plan_2 on node2")
    assert first < second
    # each server's steps, in order, before the next server's
    block = text[first:second]
    order = [block.index(w) for w in ("POST /remove_worker", "drain", "at most 45 s", "start a new one from the plan",
                                      "one-token completion", "POST /add_worker")]
    assert order == sorted(order)
    assert "does not come back stops the roll" in text


def test_restart_plan_all_at_once_and_without_a_router(tmp_path):
    recipe = fake_recipe(tmp_path, "img:1", router_venv=tmp_path)
    cluster = _cluster(tmp_path)
    text = restart_text(make_plan(recipe, "2x-solo", cluster), all_at_once=True)
    assert "all at once" in text and "requests in flight fail" in text and "remove_worker" not in text
    solo = make_plan(recipe, "solo", cluster)
    assert not rolls(solo)
    text = restart_text(solo, drain_timeout=30)
    assert "graceful" in text and "at most 30 s" in text and "restart (docker restart)" in text
    assert "router" not in text
    assert "drain" not in restart_text(solo, drain_timeout=0)


def test_restart_plan_behind_litellm_closes_each_server_by_its_drain_gate(tmp_path):
    recipe = fake_recipe(tmp_path, "img:1", litellm_venv=tmp_path)
    plan = make_plan(recipe, "2x-solo", _cluster(tmp_path), {"router": "simple-shuffle"})
    text = restart_text(plan)
    assert "rolling" in text and "remove_worker" not in text
    for n in (1, 2):
        assert f"{n}.1 close it to new requests (its drain gate" in text
        assert f"{n}.5 wait until LiteLLM sends to it again" in text


# --- the drain gate itself -----------------------------------------------------------------------------------
async def through_gate(path: str, *, kind: str = "http", method: str = "POST", root_path: str = "") -> tuple:
    """One request through the real DrainGate (launch/drain_gate.py) in front of an app that answers 200:
    (status, headers, reached the app); a websocket refused before it is accepted is ("close", code, False)."""
    from sparkconsole.launch.drain_gate import DrainGate
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[dict] = []

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)
    await DrainGate(app)({"type": kind, "method": method, "path": path, "root_path": root_path, "headers": []},
                         receive, send)
    if sent[0]["type"] == "websocket.close":
        return "close", sent[0]["code"], bool(reached)
    return sent[0]["status"], dict(sent[0]["headers"]), bool(reached)


async def test_the_drain_gate_refuses_what_generates_and_lets_the_rest_through(tmp_path, monkeypatch):
    """Issue 40: the gate refused POST under /v1/ and a few prefixes only: /inference/v1/generate, /generate, the
    realtime websocket and anything under --root-path went through, and LoRA admin calls were refused. Now: the
    paths that generate (GENERATING, vLLM 0.32's), under the root path too, and every websocket; the rest, LoRA
    included, go through marked closed. A flag older than the lease (a roll that is gone) is open."""
    import os
    import time as _time

    from sparkconsole.launch import drain_gate
    flag = tmp_path / "closed"
    monkeypatch.setattr(drain_gate, "FLAG", str(flag))
    assert await through_gate("/v1/completions") == (200, {b"content-type": b"text/plain"}, True)    # open
    flag.touch()
    for path, root in (("/v1/completions", ""), ("/v1/chat/completions", ""), ("/inference/v1/generate", ""),
                       ("/generate", ""), ("/v1/embeddings", ""), ("/pooling", ""), ("/v1/audio/transcriptions", ""),
                       ("/api/v1/completions", "/api"), ("/api/inference/v1/generate", "/api"),
                       ("/v1/completions/", "")):
        status, headers, reached = await through_gate(path, root_path=root)
        assert (status, reached) == (503, False) and headers[b"x-sparkconsole-drain"] == b"closed", path
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/tokenize", "/v1/completions/render",
                 "/abort_requests", "/inference/v1/abort_requests", "/health", "/metrics", "/v1/models"):
        status, headers, reached = await through_gate(path, method="GET" if path in ("/health", "/metrics") else "POST")
        assert (status, reached) == (200, True) and headers[b"x-sparkconsole-drain"] == b"closed", path
    assert await through_gate("/v1/realtime", kind="websocket") == ("close", 1013, False)
    # a flag its roll stopped touching: open again once the lease is over
    old = _time.time() - drain_gate.LEASE_S - 1
    os.utime(flag, (old, old))
    assert await through_gate("/v1/completions") == (200, {b"content-type": b"text/plain"}, True)
    assert await through_gate("/v1/realtime", kind="websocket") == (200, {b"content-type": b"text/plain"}, True)


def test_the_plan_mounts_only_the_gates_file_and_keeps_its_flag_on_a_tmpfs(tmp_path):
    """Issue 40: the gate's node directory was mounted and put first on PYTHONPATH in a privileged container, so a
    sitecustomize.py or .pth left there ran as root in it. Now one file is mounted into an empty directory, and
    the flag's directory is a tmpfs of the container (emptied by `docker restart`)."""
    from sparkconsole.launch import gate
    from sparkconsole.serving.endpoint import DRAIN_HEADER
    recipe = fake_recipe(tmp_path, "img:1", litellm_venv=tmp_path)
    plan = make_plan(recipe, "2x-solo", _cluster(tmp_path), {"router": "simple-shuffle"})
    runs = [st.argv for st in plan.steps if st.argv[:2] == ("docker", "run") and "sc_plan_1_router" not in st.argv]
    assert len(runs) == 2
    for argv in runs:
        vols = [argv[i + 1] for i, a in enumerate(argv) if a == "-v" and "sparkconsole-gate" in argv[i + 1]]
        assert vols == [f'"$HOME"/.cache/sparkconsole/drain-gate/{gate.MODULE}.py:'
                        f"{gate.CONTAINER_DIR}/{gate.MODULE}.py:ro"], vols
        tmpfs = [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]
        assert tmpfs == [f"{gate.FLAG_DIR}:size=64k"] and gate.FLAG.startswith(gate.FLAG_DIR + "/")
    assert DRAIN_HEADER == gate.HEADER         # the console reads the header the gate sends


def test_a_closed_server_reads_closed_with_the_command_that_opens_it(tmp_path):
    """`recipe status` (launch/health.py) and the console (nodes/launches.py) read the gate's header: a healthy
    server that refuses every generation is CLOSED, not SERVING, and the line says how to open it."""
    from sparkconsole.launch import gate
    from sparkconsole.launch.health import MemberState, judge
    from sparkconsole.nodes.launches import Member, gates_closed, launch_groups
    recipe = fake_recipe(tmp_path, "img:1", litellm_venv=tmp_path)
    plan = make_plan(recipe, "2x-solo", _cluster(tmp_path), {"router": "simple-shuffle"})
    members = [MemberState(s, "running", answers=True if s.url else None, closed=s.container == "sc_plan_1"
                           and s.role == "server") for s in plan.services]
    h = judge(plan, members)
    assert h.verdict == "CLOSED" and "sc_plan_1 on node1 is closed to new requests" in h.reason
    assert h.fix == f"docker exec sc_plan_1 rm -f {gate.FLAG} (on node1)"
    assert "CLOSED to new requests" in h.render()
    assert judge(plan, [MemberState(m.service, m.status, answers=m.answers) for m in members]).verdict == "SERVING"

    class Node:
        def __init__(self, name, containers):
            self.name, self.containers = name, containers

    class C:
        def __init__(self, name, role, url):
            self.name, self.state, self.exit_code, self.oom_killed = name, "running", None, None
            self.labels = {"sparkconsole.recipe": "r", "sparkconsole.topology": "2x-solo",
                           "sparkconsole.role": role, "sparkconsole.url": url}
    nodes = [Node("node1", [C("sc_plan_1", "server", "http://a:1"), C("sc_plan_1_router", "router", "http://a:9")]),
             Node("node2", [C("sc_plan_2", "server", "http://b:2")])]
    groups = launch_groups(nodes)
    assert [g.verdict for g in groups] == ["SERVING"]
    closed = gates_closed(groups, {"http://b:2"}, gate.reopen_command)
    assert closed[0].verdict == "CLOSED" and closed[0].reason.endswith(
        f"open it: docker exec sc_plan_2 rm -f {gate.FLAG} (on node2)"), closed[0].reason
    assert isinstance(groups[0].members[0], Member)


async def test_a_roll_cancelled_mid_drain_opens_the_server_it_closed_on_the_simulated_pair():
    """The real runner and roll over the simulator's shims (its servers keep the gate's rule, launch/drain_gate.py):
    a roll behind LiteLLM closes server 1, which `recipe status` reads as CLOSED with the command that opens it;
    cancelled while a long request holds the drain (Ctrl-C), the roll opens it on its way out."""
    from tests.helpers import sim_pair_runner

    async with sim_pair_runner(77, "2x-solo", {"router": "simple-shuffle"}) as (_sim, plan, runner):
        await runner.launch(plan)
        s1 = next(s for s in plan.services if s.role == "server")
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            long = asyncio.ensure_future(client.post(s1.url + "/v1/completions", json={
                "model": s1.model, "prompt": "hi", "max_tokens": 4000, "ignore_eos": True}))
            await asyncio.sleep(1.0)
            roll = asyncio.ensure_future(restart(runner, plan, drain_timeout=120))
            await wait_verdict(runner, plan, "CLOSED", timeout=60)
            verdict, fix = await gate_state(runner, plan)
            assert fix.startswith(f"docker exec {s1.container} rm -f ") and fix.endswith(f"(on {s1.node})"), fix
            roll.cancel()
            with pytest.raises(asyncio.CancelledError):
                await roll
            assert await gate_state(runner, plan) == ("SERVING", "")
            r = await client.post(s1.url + "/v1/completions", json={"model": s1.model, "prompt": "hi",
                                                                    "max_tokens": 2})
            assert r.status_code == 200 and "x-sparkconsole-drain" not in r.headers
            long.cancel()
        await runner.stop(plan)


# What vLLM 0.32 serves that the gate lets through (besides GETs): sorted by hand from its routers' code. A route
# in neither this nor the gate's GENERATING fails the test below: a new vLLM's route is sorted before it ships.
PASSES = frozenset({
    "/tokenize", "/detokenize", "/v1/messages/count_tokens", "/v1/chat/completions/render", "/v1/messages/render",
    "/v1/completions/render", "/v1/responses/render", "/v1/chat/completions/derender", "/v1/completions/derender",
    "/cohere/v2/chat/render", "/v1/responses/{response_id}/cancel", "/abort_requests",
    "/inference/v1/abort_requests", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters",
    "/adapters/{adapter_name}", "/ping",
    "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/collective_rpc", "/sleep",
    "/release_kv_cache_memory", "/wake_up", "/pause", "/resume", "/init_weight_transfer_engine",
    "/shutdown_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update", "/update_weights",
    "/finish_weight_update", "/update_weight_version", "/weight_checker", "/scale_elastic_ep",
    "/is_scaling_elastic_ep", "/fault_tolerance/apply", "/start_profile", "/stop_profile",
})

VLLM_APP = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
flag = os.environ["SPARKCONSOLE_DRAIN_FLAG"]


def sort_routes(root):
    argv = ["--model", "x", "--middleware", "sparkconsole_drain_gate.DrainGate", "--enable-fault-tolerance"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv + (["--root-path", root] if root else []))
    # every task vLLM 0.32 knows, so every router it has is in the app
    app = build_app(args, supported_tasks=("generate", "transcription", "realtime", "embed", "classify", "token_embed",
                                           "token_classify", "render"))
    client = TestClient(app, raise_server_exceptions=False)
    out = []
    for r in app.routes:
        methods = sorted(set(getattr(r, "methods", None) or ()) - {"HEAD", "GET"})
        path = r.path.replace("{response_id}", "resp-1").replace("{adapter_name}", "lora-1")
        if type(r).__name__ == "APIWebSocketRoute":
            open(flag, "w").close()
            try:
                with client.websocket_connect(root + path):
                    got = "accepted"
            except WebSocketDisconnect as exc:
                got = exc.code
            out.append(["WEBSOCKET", r.path, got, None])
            continue
        for m in methods:
            for prefix in ({root, ""} if root else {""}):
                open(flag, "w").close()
                closed = client.request(m, prefix + path, json={})
                os.unlink(flag)
                opened = client.request(m, prefix + path, json={})
                gate = "draining for a restart"            # the gate's own 503, not a handler's
                # no engine runs: a handler that needs it raises, and Starlette's outermost error handler answers
                # 500 past every middleware of the app, the gate's mark too (None for those)
                out.append([m, r.path, closed.status_code == 503 and gate in closed.text,
                            closed.headers.get("x-sparkconsole-drain") if closed.status_code != 500 else "500",
                            gate in opened.text, opened.headers.get("x-sparkconsole-drain")])
    open(flag, "w").close()
    version = client.get(root + "/version")        # a GET that answers without an engine (/health asks the engine)
    return {"routes": out, "version": [version.status_code, version.headers.get("x-sparkconsole-drain")]}


# every root asked for, in one process: one import of vLLM (most of the cost)
print(json.dumps({root: sort_routes(root) for root in sys.argv[1:]}))
"""


ROOT_PATHS = ("", "/api")


@pytest.fixture(scope="module")
def gate_routes(vllm_env, tmp_path_factory) -> dict:
    """The real gate, loaded by vLLM 0.32's own `--middleware` from a directory holding only its file, in front of
    vLLM's own app, for each root path: what every route answered closed and open (VLLM_APP)."""
    import os
    import shutil
    import subprocess

    from sparkconsole.launch import drain_gate
    tmp = tmp_path_factory.mktemp("gate")
    only = tmp / "gate"
    only.mkdir()
    shutil.copy(Path(drain_gate.__file__), only / f"{drain_gate.MODULE}.py")
    env = {**os.environ, "PYTHONPATH": str(only), "SPARKCONSOLE_DRAIN_FLAG": str(tmp / "closed"),
           "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([str(vllm_env.python), "-c", VLLM_APP, *ROOT_PATHS], env=env, capture_output=True, text=True,
                       timeout=500)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("root_path", ROOT_PATHS)
def test_the_gate_in_front_of_vllm_032_sorts_every_route_it_serves(gate_routes, root_path):
    """The real gate in front of vLLM's own app (`build_app` with every task: the test bed's vLLM venv; no engine is
    started, so what a route does past the gate is beside the point). Closed: every route of GENERATING answers 503
    (under --root-path, and without the prefix, as vLLM routes both) and the realtime websocket is refused; every
    other POST route goes through marked closed. A route in neither list (a new vLLM) fails here until it is
    sorted."""
    from sparkconsole.launch import drain_gate
    got = gate_routes[root_path]
    rows = got["routes"]
    assert got["version"] == [200, "closed"]          # a GET through the app's middleware, marked as /health is
    paths = {row[1] for row in rows if row[0] != "WEBSOCKET"}
    unsorted = sorted(paths - drain_gate.GENERATING - PASSES)
    assert not unsorted, f"routes of vLLM the gate does not sort: {unsorted}"
    assert {"/v1/completions", "/v1/chat/completions", "/inference/v1/generate", "/v1/load_lora_adapter"} <= paths
    for row in rows:
        if row[0] == "WEBSOCKET":
            assert row[2] == 1013, row                    # refused before it is accepted
            continue
        method, path, refused, closed_mark, refused_open, opened_mark = row
        assert closed_mark in ("closed", "500") and opened_mark is None and not refused_open, row
        assert refused == (path in drain_gate.GENERATING), row
    assert any(row[3] == "closed" and not row[2] for row in rows), rows       # let through, and marked
    assert any(row[0] == "WEBSOCKET" for row in rows), "no realtime websocket in vLLM's app"


def test_cli_plan_restart_prints_the_steps(tmp_path, monkeypatch, capsys):
    from sparkconsole.cli import main
    recipe = fake_recipe(tmp_path, "img:1", router_venv=tmp_path)
    (tmp_path / "sparkconsole.yaml").write_text(
        "nodes:\n  - {name: node1, address: 127.0.0.2, local: true, container: sc_p_1, vllm_port: 18001}\n"
        "  - {name: node2, address: 127.0.0.3, local: true, container: sc_p_2, vllm_port: 18002}\n")
    rc = main(["--cluster", str(tmp_path / "sparkconsole.yaml"), "recipe", "plan", recipe.source, "-T", "2x-solo",
               "--restart", "--drain-timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 0 and "rolling, one server at a time" in out and "at most 60 s" in out


# --- on the real test engine, behind the real vllm-router ------------------------------------------------------
class Load:
    """A client loop: `workers` requests at a time through the router until stopped; counts what failed."""

    def __init__(self, url: str, workers: int = 4, headers: dict | None = None, model: str = "fake-model",
                 max_tokens: int = 1) -> None:
        self.url, self.workers, self.headers = url, workers, headers or {}
        self.model, self.max_tokens = model, max_tokens
        self.ok = self.failed = 0
        self.errors: list[str] = []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task] = []

    async def _one(self, client: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            try:
                r = await client.post(self.url + "/v1/completions",
                                      json={"model": self.model, "prompt": "hi", "max_tokens": self.max_tokens})
                if r.status_code == 200:
                    self.ok += 1
                    continue
                self.errors.append(f"HTTP {r.status_code} {r.text[:100]}")
            except httpx.HTTPError as exc:
                self.errors.append(type(exc).__name__)
            self.failed += 1
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> Load:
        self.client = httpx.AsyncClient(trust_env=False, timeout=60, headers=self.headers)
        self.tasks = [asyncio.ensure_future(self._one(self.client)) for _ in range(self.workers)]
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.aclose()


class WorkerWatch:
    """Polls the router's /list_workers during a restart: the fewest backends ever in, and for how long one
    backend carried everything."""

    def __init__(self, router_url: str) -> None:
        self.url = router_url
        self.counts: list[tuple[float, int]] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            while not self.stop.is_set():
                try:
                    urls = (await client.get(self.url + "/list_workers")).json()["urls"]
                    self.counts.append((time.monotonic(), len(urls)))
                except httpx.HTTPError:
                    self.counts.append((time.monotonic(), -1))       # the router itself did not answer
                await asyncio.sleep(0.1)

    def longest_alone_s(self) -> float:
        return longest_alone(self.counts)


async def _launch(tmp_path, docker_engine, testbed_base_image, vllm_router_env, cluster, **over):
    recipe = roll_recipe(tmp_path, testbed_base_image, vllm_router_env.path)
    plan = make_plan(recipe, "2x-solo", cluster, over)
    runner = Runner(cluster, await local_transports(cluster), poll_interval=0.3, ready_timeout=120,
                    measure_router=False)
    await runner.launch(plan)
    return plan, runner


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_rolling_restart_under_load_drops_nothing(tmp_path, docker_engine, testbed_base_image,
                                                        vllm_router_env, local_cluster, state):
    plan, runner = await _launch(tmp_path, docker_engine, testbed_base_image, vllm_router_env, local_cluster)
    router = next(s for s in plan.services if s.role == "router")
    events = []
    try:
        before = {n: started_at(docker_engine, n) for n in ("sc_run_1", "sc_run_2")}
        watch = WorkerWatch(router.url)
        poller = asyncio.ensure_future(watch.run())
        async with Load(plan.endpoint) as load:
            await asyncio.sleep(1.0)                      # traffic on both servers before the roll
            report = await restart(runner, plan, events.append, drain_timeout=30)
            await asyncio.sleep(1.0)
        watch.stop.set()
        await poller
        after = {n: started_at(docker_engine, n) for n in ("sc_run_1", "sc_run_2")}
        print(f"rolling: {load.ok} ok, {load.failed} failed; {report.line()}; "
              f"one backend alone at most {watch.longest_alone_s():.1f} s")
        assert load.failed == 0, load.errors[:5]
        assert load.ok > 0
        assert all(before[n] != after[n] for n in before)             # both containers replaced
        assert watch.counts and min(n for _, n in watch.counts) == 1  # one out at a time, never none
        assert watch.counts[-1][1] == 2
        assert [s.ok for s in report.servers] == [True, True] and report.cut == 0
        # the events say each server's state, in order: out, draining, restarting, back
        n1 = [e.stage for e in events if e.service == "node1/server" and e.stage in ("draining", "restarting", "back")]
        assert n1[0] == "draining" and n1[-1] == "back" and "restarting" in n1
        first_back = next(i for i, e in enumerate(events) if e.stage == "back")
        assert all(e.service != "node2/server" or e.stage in ("log",) for e in events[:first_back])
        logged = [e for e in audit.read() if e.action.startswith("rolling restart")]
        assert any("remove_worker" in e.command for e in logged)
        assert any("node1/server back" in e.command and "node2/server back" in e.command for e in logged)
    finally:
        await runner.stop(plan)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_drain_that_times_out_reports_the_requests_cut(tmp_path, docker_engine, testbed_base_image,
                                                                vllm_router_env, local_cluster, state):
    plan, runner = await _launch(tmp_path, docker_engine, testbed_base_image, vllm_router_env, local_cluster)
    server1 = plan.service("node1/server")
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            long = asyncio.ensure_future(client.post(server1.url + "/v1/completions",
                                                     json={"model": "fake-model", "prompt": "sleep 60"}))
            events = []
            await asyncio.sleep(0.5)
            report = await restart(runner, plan, events.append, drain_timeout=2)
            with pytest.raises(httpx.HTTPError):
                await long                               # the request that was cut
        assert report.servers[0].cut == 1 and report.servers[1].cut == 0
        assert any("1 request(s) cut" in e.message for e in events)
        assert any(e.stage == "draining" and "1 request(s) left" in e.message for e in events)
        assert any("cut 1" in e.command for e in audit.read() if e.action.startswith("rolling restart"))
    finally:
        await runner.stop(plan)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_server_that_does_not_come_back_stops_the_roll(tmp_path, docker_engine, testbed_base_image,
                                                               vllm_router_env, local_cluster, state):
    plan, runner = await _launch(tmp_path, docker_engine, testbed_base_image, vllm_router_env, local_cluster)
    router = next(s for s in plan.services if s.role == "router")
    try:
        (tmp_path / "fail-127.0.0.2").write_text("")     # node1's server dies when it starts again
        before2 = started_at(docker_engine, "sc_run_2")
        with pytest.raises(LaunchError) as ei:
            await restart(runner, plan, drain_timeout=10)
        msg = str(ei.value)
        assert "sc_run_1 on node node1: did not come back" in msg and "ValueError: boom on 127.0.0.2" in msg
        assert "sc_run_2 still serving" in msg and ei.value.node == "node1"
        assert started_at(docker_engine, "sc_run_2") == before2          # the roll stopped before node2
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            assert (await client.get(router.url + "/list_workers")).json()["urls"] == [plan.service("node2/server").url]
            for _ in range(4):
                r = await client.post(plan.endpoint + "/v1/completions", json={"model": "fake-model", "prompt": "hi"})
                assert r.status_code == 200 and r.json()["choices"][0]["text"] == "127.0.0.3"
            # with node2 taken out by hand too, a roll refuses to empty the router: nothing is restarted
            await client.post(router.url + "/remove_worker", params={"url": plan.service("node2/server").url})
            with pytest.raises(LaunchError) as ei:
                await restart(runner, plan, drain_timeout=10)
            assert "would leave the router with no server" in str(ei.value)
            assert started_at(docker_engine, "sc_run_2") == before2
    finally:
        await runner.stop(plan)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_all_at_once_for_contrast_fails_requests(tmp_path, docker_engine, testbed_base_image,
                                                       vllm_router_env, local_cluster, state):
    # a server that takes 3 s to come up, as a real one takes minutes: longer than the router's retries
    plan, runner = await _launch(tmp_path, docker_engine, testbed_base_image, vllm_router_env, local_cluster,
                                 delay=3)
    try:
        async with Load(plan.endpoint) as load:
            await asyncio.sleep(1.0)
            task = asyncio.ensure_future(restart(runner, plan, all_at_once=True))
            for _ in range(600):                # until the first failures are in (not the router's whole outage)
                if load.failed >= 10 or task.done():
                    break
                await asyncio.sleep(0.1)
        print(f"all at once: {load.ok} ok, {load.failed} failed before the test stopped looking "
              f"({sorted(set(load.errors))[:3]})")
        assert load.failed > 0
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await runner.stop(plan)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_graceful_restart_of_solo_lets_the_request_in_flight_finish(tmp_path, docker_engine,
                                                                          testbed_base_image, vllm_router_env,
                                                                          local_cluster, state):
    recipe = roll_recipe(tmp_path, testbed_base_image, vllm_router_env.path)
    plan = make_plan(recipe, "solo", local_cluster)
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3, ready_timeout=120)
    await runner.launch(plan)
    try:
        before = started_at(docker_engine, "sc_run_1")
        events = []
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            slow = asyncio.ensure_future(client.post(plan.endpoint + "/v1/completions",
                                                     json={"model": "fake-model", "prompt": "sleep 3"}))
            await asyncio.sleep(0.5)
            report = await restart(runner, plan, events.append, drain_timeout=30)
            assert (await slow).status_code == 200          # finished before the stop
        assert report.mode == "graceful" and report.servers[0].drained == 1 and report.cut == 0
        assert started_at(docker_engine, "sc_run_1") != before
        assert any(e.stage == "draining" and "1 request(s) left" in e.message for e in events)
        assert any(e.action.startswith("graceful restart") and "drained 1, cut 0" in e.command for e in audit.read())
    finally:
        await runner.stop(plan)


def test_negative_drain_timeout_is_refused(tmp_path, capsys):
    from sparkconsole.cli import main
    recipe = fake_recipe(tmp_path, "img:1", router_venv=tmp_path)
    (tmp_path / "sparkconsole.yaml").write_text(
        "nodes:\n  - {name: node1, address: 127.0.0.2, local: true, container: sc_p_1, vllm_port: 18001}\n")
    rc = main(["--cluster", str(tmp_path / "sparkconsole.yaml"), "recipe", "restart", recipe.source, "-T", "solo",
               "--yes", "--drain-timeout", "-1"])
    err = capsys.readouterr().err
    assert rc != 0 and "--drain-timeout" in err and "Traceback" not in err



@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_cli_restart_rolls_by_default_behind_the_router(tmp_path, docker_engine, testbed_base_image,
                                                              vllm_router_env, local_cluster, state, monkeypatch,
                                                              capsys):
    from sparkconsole.cli import main
    from tests.test_runner import docker_env
    plan, runner = await _launch(tmp_path, docker_engine, testbed_base_image, vllm_router_env, local_cluster)
    rows = "".join(f"  - {{name: {n.name}, address: {n.address}, local: true, container: {n.container}, "
                   f"vllm_port: {n.vllm_port}}}\n" for n in local_cluster.nodes)
    (tmp_path / "sparkconsole.yaml").write_text("nodes:\n" + rows)
    for k, v in docker_env(docker_engine):
        monkeypatch.setenv(k, v)
    try:
        before = {n: started_at(docker_engine, n) for n in ("sc_run_1", "sc_run_2")}
        rc = await asyncio.to_thread(main, ["--cluster", str(tmp_path / "sparkconsole.yaml"), "recipe", "restart",
                                            str(tmp_path / "fake.yaml"), "-T", "2x-solo", "--yes",
                                            "--drain-timeout", "20"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert "rolling, one server at a time" in out.split("rolling restart in")[0]     # shown before it runs
        assert "rolling restart in" in out and "node2/server back" in out and "ready again" in out
        assert all(started_at(docker_engine, n) != before[n] for n in before)
    finally:
        await runner.stop(plan)


def test_a_plan_with_mods_relaunches_one_server_from_its_own_steps(tmp_path):
    from sparkconsole.launch.rolling import relaunch_steps, router_of
    from tests.test_runner import write_mod
    write_mod(tmp_path, "patch", "echo patched\n")
    recipe = fake_recipe(tmp_path, "img:1", router_venv=tmp_path, mods=("mods/patch",))
    plan = make_plan(recipe, "2x-solo", _cluster(tmp_path))
    assert not plan.restartable_in_place
    assert "start a new one from the plan" in restart_text(plan)
    steps = relaunch_steps(plan, plan.service("node1/server"), router_of(plan))
    whats = [s.what for s in steps]
    assert all(s.node == "node1" for s in steps)
    assert any(s.service == "node1/server" for s in steps)                 # its docker run
    assert any(w.startswith("mod patch: run its run.sh") for w in whats)
    assert any(w.startswith("start vLLM in sc_plan_1") for w in whats)     # the gate opened after the mods
    assert not any("router" in w for w in whats)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_rolling_restart_of_a_plan_with_mods_relaunches_each_server(tmp_path, docker_engine,
                                                                          testbed_base_image, vllm_router_env,
                                                                          local_cluster, state):
    from tests.test_runner import write_mod
    write_mod(tmp_path, "mark", 'date +%s%N > "$WORKSPACE_DIR/mod-ran.txt"\n')
    recipe = fake_recipe(tmp_path, testbed_base_image, router_venv=vllm_router_env.path, mods=("mods/mark",))
    (tmp_path / "server.py").write_text(SERVER)
    plan = make_plan(recipe, "2x-solo", local_cluster)
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3, ready_timeout=120,
                    measure_router=False)
    await runner.launch(plan)
    try:
        ids = {n: docker_engine.inspect(n)["Id"] for n in ("sc_run_1", "sc_run_2")}
        async with Load(plan.endpoint) as load:
            await asyncio.sleep(1.0)
            report = await restart(runner, plan, drain_timeout=30)
        print(f"rolling with mods: {load.ok} ok, {load.failed} failed; {report.line()}")
        assert load.failed == 0, load.errors[:5]
        for n in ids:                                    # new containers, each with its mod applied again
            assert docker_engine.inspect(n)["Id"] != ids[n]
            assert docker_engine.run(["exec", n, "sh", "-c", 'cat "$PWD/mod-ran.txt"']).stdout.strip()
        assert docker_engine.inspect("sc_run_1_router")["State"]["Running"] is True
    finally:
        await runner.stop(plan)


def gated_cluster(cluster, tmp_path: Path, engine):
    """The runner test's nodes with a HOME of this test's own (the gate's node directory, where a file is planted)
    and a `docker` first on PATH that refuses `docker stop` of a container while a marker file names it (a stop
    that fails after a drain timeout); everything else goes to the test engine's real docker."""
    from dataclasses import replace as dc_replace
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(f"""#!/bin/sh
if [ "$1" = stop ]; then for a in "$@"; do
  if [ -e "{tmp_path}/refuse-stop-$a" ]; then echo "Error response from daemon: cannot stop container $a" >&2; exit 1; fi
done; fi
exec {engine.cli} "$@"
""")
    shim.chmod(0o755)
    import os
    path = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return dc_replace(cluster, nodes=tuple(dc_replace(n, env=(*n.env, ("HOME", str(home)), ("PATH", path)))
                                           for n in cluster.nodes)), home


async def gate_state(runner: Runner, plan) -> tuple[str, str]:
    """(`recipe status`'s verdict, the first closed server's fix or "")."""
    h = await runner.health(plan)
    return h.verdict, h.fix or ""


async def wait_verdict(runner: Runner, plan, want: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (got := (await gate_state(runner, plan))[0]) != want:
        assert time.monotonic() < deadline, f"recipe status said {got}, not {want}, after {timeout} s"
        await asyncio.sleep(0.3)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_rolling_restart_behind_litellm_drains_and_restarts_one_at_a_time(tmp_path, docker_engine,
                                                                                testbed_base_image, litellm_env,
                                                                                local_cluster, state, monkeypatch):
    """LiteLLM cannot take a server out without its database: the roll closes each server's drain gate (the
    stand-in answers by the real gate's rule, from the file the plan mounts), drains and restarts it, and LiteLLM
    sends the refused requests to the other server. Then, on the same launch (issue 40): nothing but the gate's
    file is importable from its directory (a sitecustomize.py planted beside it on the node never runs); a closed
    server reads CLOSED with the command that opens it, which does; `docker restart` opens it (the flag's tmpfs);
    a flag its roll stopped touching opens by itself; a roll cancelled mid-drain opens the server on its way out,
    and so does one that fails after a drain timeout (its `docker stop` refused)."""
    import secrets as pysecrets

    from sparkconsole.launch import gate
    key = "sk-" + pysecrets.token_hex(16)
    monkeypatch.setenv("LITELLM_MASTER_KEY", key)
    cluster, home = gated_cluster(local_cluster, tmp_path, docker_engine)
    planted = home / ".cache/sparkconsole/drain-gate"
    planted.mkdir(parents=True)
    (planted / "sitecustomize.py").write_text("import sys\nprint('PLANTED-SITECUSTOMIZE-RAN', file=sys.stderr)\n")
    (planted / "zz-planted.pth").write_text("import sys; print('PLANTED-PTH-RAN', file=sys.stderr)\n")
    recipe = fake_recipe(tmp_path, testbed_base_image, litellm_venv=litellm_env.path)
    (tmp_path / "server.py").write_text(SERVER)
    plan = make_plan(recipe, "2x-solo", cluster, {"router": "simple-shuffle", "router_dir": str(tmp_path / "routers")})
    runner = Runner(cluster, await local_transports(cluster), poll_interval=0.5, ready_timeout=300,
                    measure_router=False)
    await runner.launch(plan)
    s1 = plan.service("node1/server")
    try:
        before = {n: started_at(docker_engine, n) for n in ("sc_run_1", "sc_run_2")}
        async with Load(plan.endpoint, headers={"Authorization": f"Bearer {key}"}) as load:
            await asyncio.sleep(1.0)
            report = await restart(runner, plan, drain_timeout=3)
        print(f"rolling behind LiteLLM: {load.ok} ok, {load.failed} failed ({sorted(set(load.errors))[:2]}); "
              f"{report.line()}")
        assert [s.ok for s in report.servers] == [True, True] and load.ok > 0
        assert load.failed == 0 and report.cut == 0, load.errors[:5]
        assert all(started_at(docker_engine, n) != before[n] for n in before)
        # only the gate's file is in its container directory (and Python's bytecode of it); what was planted beside
        # it on the node never ran
        found = docker_engine.run(["exec", "sc_run_1", "find", gate.CONTAINER_DIR, "-mindepth", "1"]).stdout.split()
        assert f"{gate.CONTAINER_DIR}/{gate.MODULE}.py" in found, found
        assert all(f.startswith((f"{gate.CONTAINER_DIR}/{gate.MODULE}.py", f"{gate.CONTAINER_DIR}/__pycache__"))
                   and ("__pycache__/" not in f or f.split("/")[-1].startswith(gate.MODULE)) for f in found), found
        logs = docker_engine.run(["logs", "sc_run_1"]).stderr + docker_engine.run(["logs", "sc_run_1"]).stdout
        assert "PLANTED" not in logs, logs[-500:]
        assert await gate_state(runner, plan) == ("SERVING", "")
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            async def answers() -> int:
                r = await client.post(s1.url + "/v1/completions", json={"model": "fake-model", "prompt": "hi"})
                return r.status_code
            # closed by hand, as a roll closes it: CLOSED, with the line that opens it, which does
            docker_engine.run(["exec", "sc_run_1", "touch", gate.FLAG])
            verdict, fix = await gate_state(runner, plan)
            assert verdict == "CLOSED" and fix == f"docker exec sc_run_1 rm -f {gate.FLAG} (on node1)", (verdict, fix)
            assert await answers() == 503
            docker_engine.run(fix.split(" (on ")[0].split()[1:])
            assert await gate_state(runner, plan) == ("SERVING", "") and await answers() == 200
            # `docker restart` on the real engine empties the flag's tmpfs: open again
            docker_engine.run(["exec", "sc_run_1", "touch", gate.FLAG])
            assert (await gate_state(runner, plan))[0] == "CLOSED"
            docker_engine.run(["restart", "-t", "1", "sc_run_1"])
            await wait_verdict(runner, plan, "SERVING")
            assert await answers() == 200
            # a flag no roll touches any more (its console was killed): open once the lease is over
            docker_engine.run(["exec", "sc_run_1", "touch", "-d", f"{gate.LEASE_S + 1:.0f} seconds ago", gate.FLAG])
            assert await gate_state(runner, plan) == ("SERVING", "") and await answers() == 200
            docker_engine.run(["exec", "sc_run_1", "rm", "-f", gate.FLAG])

            async def roll_while(long_s: int, drain_timeout: float) -> tuple[asyncio.Task, asyncio.Future]:
                """A roll started while a long request holds server 1, once the roll has closed it."""
                long = asyncio.ensure_future(client.post(s1.url + "/v1/completions",
                                                         json={"model": "fake-model", "prompt": f"sleep {long_s}"}))
                await asyncio.sleep(0.5)
                roll = asyncio.ensure_future(restart(runner, plan, drain_timeout=drain_timeout))
                await wait_verdict(runner, plan, "CLOSED")
                return roll, long
            # cancelled mid-drain (Ctrl-C): the server is open again when the roll has stopped, not a lease later
            roll, long = await roll_while(20, drain_timeout=60)
            roll.cancel()
            with pytest.raises(asyncio.CancelledError):
                await roll
            assert await gate_state(runner, plan) == ("SERVING", "") and await answers() == 200
            await long
            # a drain timeout, then its `docker stop` refused: the roll fails, and the server it closed is open
            (tmp_path / "refuse-stop-sc_run_1").write_text("")
            roll, long = await roll_while(10, drain_timeout=1)
            with pytest.raises(LaunchError, match="did not come back"):
                await roll
            (tmp_path / "refuse-stop-sc_run_1").unlink()
            assert docker_engine.inspect("sc_run_1")["State"]["Running"] is True       # the old one, still there
            assert await gate_state(runner, plan) == ("SERVING", "") and await answers() == 200
            with contextlib.suppress(httpx.HTTPError):
                await long
    finally:
        await runner.stop(plan)
