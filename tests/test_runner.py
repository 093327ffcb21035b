"""The runner for real: a real Docker engine, real containers, real HTTP servers, real routers, real sshd nodes.
Launch, readiness, restart, stop, and failing launches that must leave nothing running on any node.

The server here is a small stdlib HTTP server in a container (answers /health and /v1/models like vLLM, starts
in a second, can be told to die with an error line): the runner's mechanics. vLLM itself, launched, restarted,
refused and stopped by the same runner over SSH, is tests/test_topologies*.py's. These need the Docker engine,
hence `slow`.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from sparkconsole import audit
from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.launch.logread import error_line
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.runner import LaunchError, Runner
from sparkconsole.nodes.connect import make_transport
from sparkconsole.nodes.transport import LocalTransport
from sparkconsole.recipes import load_recipe
from tests.helpers import free_port

PY_HOME = str(Path(sys.base_prefix).resolve())

# Stand-in for a vLLM server: logs to stderr like vLLM, serves /health and /v1/models, or dies with an error
# line when started on the address it is told to fail on.
SERVER = textwrap.dedent('''\
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    port, host, model, delay, fail_host = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    print(f"INFO starting {model} on {host}:{port}", file=sys.stderr, flush=True)
    time.sleep(delay)
    if host == fail_host:
        print("Traceback (most recent call last):", file=sys.stderr)
        print(f"ValueError: boom on {host}", file=sys.stderr, flush=True)
        sys.exit(1)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"     # keep-alive, as vLLM's server does
        disable_nagle_algorithm = True    # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def do_GET(self):
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode()
            else:
                self.send_response(404); self.end_headers(); return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):          # one-token completions: the router's latency probe, requests via LiteLLM
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            if self.path.endswith("/chat/completions"):
                body = {"id": "c1", "object": "chat.completion", "created": 0, "model": model, "usage": usage,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                     "finish_reason": "length"}]}
            else:
                body = {"id": "c1", "object": "text_completion", "created": 0, "model": model, "usage": usage,
                        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
            body = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    print("INFO Application startup complete.", file=sys.stderr, flush=True)
    ThreadingHTTPServer((host, port), H).serve_forever()
''')


def docker_env(engine) -> tuple[tuple[str, str], ...]:
    return (("DOCKER_HOST", engine.host), ("DOCKER_CONFIG", str(engine.root / "client-config")))


def containers(engine) -> list[str]:
    out = engine.run(["ps", "-a", "--format", "{{.Names}}"]).stdout.split()
    return sorted(out)


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(d))
    return d


@pytest.fixture
def local_cluster(docker_engine) -> ClusterConfig:
    nodes = tuple(NodeConfig(name=f"node{i + 1}", address=f"127.0.0.{i + 2}", role="head" if i == 0 else "worker",
                             container=f"sc_run_{i + 1}", vllm_port=free_port(f"127.0.0.{i + 2}"), local=True,
                             env=docker_env(docker_engine))
                  for i in range(2))
    yield ClusterConfig(nodes=nodes, endpoints=(), source="<runner test>")
    for n in nodes:       # whatever a failed test left behind
        docker_engine.run(["rm", "-f", n.container, f"{n.container}_router"], check=False)


def fake_recipe(tmp_path: Path, image: str, router_venv: Path | None = None, router_image: str | None = None,
                litellm_venv: Path | None = None, mods: tuple[str, ...] = ()):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    router = ""
    if litellm_venv is not None:
        router = f"""
          router:
            port: {free_port()}
            litellm:
              image: {image}
              version: "1.106.2"
              command: ["{litellm_venv}/bin/litellm"]
              volumes: ["/usr:/usr:ro", "{PY_HOME}:{PY_HOME}:ro", "{litellm_venv}:{litellm_venv}:ro",
                        "/etc/passwd:/etc/passwd:ro", "/etc/ssl:/etc/ssl:ro"]
        """
    elif router_venv is not None:
        router = f"""
          router:
            port: {free_port()}
            vllm_router:
              image: {router_image or image}
              version: "0.1.17"
              policy: round_robin
              command: ["{router_venv}/bin/vllm-router"]
              volumes: ["/usr:/usr:ro", "{PY_HOME}:{PY_HOME}:ro", "{router_venv}:{router_venv}:ro",
                        "/etc/passwd:/etc/passwd:ro"]
        """
    path = tmp_path / "fake.yaml"
    path.write_text(textwrap.dedent(f"""\
        recipe_version: "1"
        name: stdlib stand-in server
        model: fake-model
        container: {image}
        mods: {list(mods)}
        defaults: {{served_model_name: fake-model, delay: 0.5, fail_host: none}}
        command: |
          {PY_HOME}/bin/python3 {script} {{port}} {{node_address}} {{served_model_name}} {{delay}} {{fail_host}}
        sparkconsole:
          topologies: [solo, 2x-solo]
          secrets: []
          container:
            memory: 256m
            shm_size: 64m
            gpus: null
            ipc_host: false
            init: true
            nofile: 16384          # this machine's Docker engine grants no more (its own hard limit)
            privileged: false      # nor a privileged container, and it has no RDMA device
            rdma: false
            volumes: ["/usr:/usr:ro", "{PY_HOME}:{PY_HOME}:ro", "{tmp_path}:{tmp_path}:ro", "/etc/passwd:/etc/passwd:ro"]
    """) + textwrap.indent(textwrap.dedent(router).strip("\n"), "  ") + "\n")
    recipe = load_recipe(path)
    assert recipe.warnings == ()
    return recipe


async def local_transports(cluster: ClusterConfig) -> dict:
    ts = {n.name: LocalTransport(n) for n in cluster.nodes}
    for t in ts.values():
        await t.connect()
    return ts


def started_at(engine, name: str) -> str:
    return engine.inspect(name)["State"]["StartedAt"]


@pytest.mark.slow
async def test_launch_2x_solo_behind_vllm_router_then_restart_and_stop(tmp_path, docker_engine, testbed_base_image,
                                                                      vllm_router_env, local_cluster, state):
    recipe = fake_recipe(tmp_path, testbed_base_image, router_venv=vllm_router_env.path)
    plan = make_plan(recipe, "2x-solo", local_cluster)
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3, ready_timeout=120)
    events = []
    ready = await runner.launch(plan, events.append)
    assert set(ready) == {"node1/server", "node2/server", "node1/router"}
    assert containers(docker_engine) == ["sc_run_1", "sc_run_1_router", "sc_run_2"]
    async with httpx.AsyncClient(trust_env=False) as client:
        models = (await client.get(plan.endpoint + "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["fake-model"]
    # readiness came from the servers themselves, and their logs were followed
    assert any(e.stage == "ready" and e.node == "node2" for e in events)
    assert any(e.stage == "log" and "starting fake-model" in e.message for e in events)
    assert runner.router_overhead_ms is not None and any("router adds" in e.message for e in events)
    print(next(e.message for e in events if "router adds" in e.message))
    # every node-changing command is in the audit log, with its node
    logged = audit.read()
    runs = [e for e in logged if " run -d " in e.command]
    assert {e.node for e in runs} == {"node1", "node2"} and len(runs) == 3
    assert all(e.action.startswith("launch fake") for e in runs)

    before = {n: started_at(docker_engine, n) for n in ("sc_run_1", "sc_run_2")}
    await runner.restart(plan, events.append)
    after = {n: started_at(docker_engine, n) for n in ("sc_run_1", "sc_run_2")}
    assert all(before[n] != after[n] for n in before)
    assert any(e.action.startswith("restart") and "docker restart" in e.command for e in audit.read())

    await runner.stop(plan, events.append)
    assert containers(docker_engine) == []
    stops = [e for e in audit.read() if e.action.startswith("stop")]
    assert {e.node for e in stops} == {"node1", "node2"}
    # stopping again is harmless: nothing left is not an error
    await runner.stop(plan)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_launch_2x_solo_behind_litellm_with_the_key_by_reference(tmp_path, docker_engine, testbed_base_image,
                                                                      litellm_env, local_cluster, state,
                                                                      monkeypatch):
    import secrets as pysecrets
    key = "sk-" + pysecrets.token_hex(16)
    monkeypatch.setenv("LITELLM_MASTER_KEY", key)        # the node's environment (local transport inherits it)
    recipe = fake_recipe(tmp_path, testbed_base_image, litellm_venv=litellm_env.path)
    plan = make_plan(recipe, "2x-solo", local_cluster, {"router": "simple-shuffle",
                                                         "router_dir": str(tmp_path / "routers")})
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.5, ready_timeout=300)
    events = []
    try:
        ready = await runner.launch(plan, events.append)
        assert set(ready) == {"node1/server", "node2/server", "node1/router"}
        cfg = (tmp_path / "routers" / "sc_run_1_router.yaml")
        assert oct(cfg.stat().st_mode & 0o777) == "0o600" and "simple-shuffle" in cfg.read_text()
        assert key not in cfg.read_text()
        async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            assert (await client.post(plan.endpoint + "/v1/chat/completions", json=body)).status_code != 200
            r = await client.post(plan.endpoint + "/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text[:300]
            assert r.json()["choices"][0]["message"]["content"] == "x"
        # the key went by reference: not in any planned command, audit entry or progress message
        assert all(key not in s.shell() for s in plan.steps)
        assert all(key not in e.command for e in audit.read()) and all(key not in e.message for e in events)
        assert "-e LITELLM_MASTER_KEY " in next(s.shell() for s in plan.steps if s.service == "node1/router")
    finally:
        await runner.stop(plan)
    assert containers(docker_engine) == []


@pytest.mark.slow
async def test_failing_server_stops_everything_on_both_nodes(tmp_path, docker_engine, testbed_base_image,
                                                             local_cluster, state):
    recipe = fake_recipe(tmp_path, testbed_base_image)
    # node2's server dies with an error line after a second; node1's comes up fine
    plan = make_plan(recipe, "2x-solo", local_cluster, {"fail_host": "127.0.0.3", "router": "vllm-router"})
    plan = replace(plan, steps=tuple(s for s in plan.steps if "router" not in s.what),
                   services=tuple(s for s in plan.services if s.role != "router"))
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3, ready_timeout=60)
    events = []
    with pytest.raises(LaunchError) as ei:
        await runner.launch(plan, events.append)
    msg = str(ei.value)
    assert "node node2" in msg and "ValueError: boom on 127.0.0.3" in msg and "exit code 1" in msg
    assert "stopped what it had started on node1, node2" in msg
    assert ei.value.node == "node2" and ei.value.log_line == "ValueError: boom on 127.0.0.3"
    assert containers(docker_engine) == []
    assert {e.node for e in events if e.stage == "stopped"} == {"node1", "node2"}


@pytest.mark.slow
async def test_failed_docker_run_cleans_up_what_started_before_it(tmp_path, docker_engine, testbed_base_image,
                                                                  vllm_router_env, local_cluster, state):
    recipe = fake_recipe(tmp_path, testbed_base_image, router_venv=vllm_router_env.path,
                         router_image="sparkconsole-test/no-such-image:1")
    plan = make_plan(recipe, "2x-solo", local_cluster)
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3)
    with pytest.raises(LaunchError) as ei:
        await runner.launch(plan)
    assert "launch failed on node node1: start the router" in str(ei.value)
    assert "no-such-image" in str(ei.value) and "docker load" in str(ei.value)
    assert containers(docker_engine) == []


def write_mod(root: Path, name: str, run_sh: str, **files: str) -> None:
    d = root / "mods" / name
    d.mkdir(parents=True)
    (d / "run.sh").write_text("#!/bin/bash\n" + run_sh)
    for f, text in files.items():
        (d / f).write_text(text)


@pytest.mark.slow
async def test_mods_are_applied_in_every_container_before_the_server_starts(tmp_path, docker_engine,
                                                                          testbed_base_image, local_cluster, state):
    # the first mod leaves a file where the server's working directory is; the second reads it: order kept
    write_mod(tmp_path, "first", 'cp note.txt "$WORKSPACE_DIR/mod-note.txt"\necho first on $(hostname)\n',
              **{"note.txt": "from the first mod\n"})
    write_mod(tmp_path, "second", 'cat "$WORKSPACE_DIR/mod-note.txt" > "$WORKSPACE_DIR/mod-order.txt"\n')
    recipe = fake_recipe(tmp_path, testbed_base_image, mods=("mods/first", "mods/second"))
    plan = make_plan(recipe, "2x-solo", local_cluster)
    plan = replace(plan, steps=tuple(s for s in plan.steps if "router" not in s.what),
                   services=tuple(s for s in plan.services if s.role != "router"))
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3, ready_timeout=120)
    try:
        assert set(await runner.launch(plan)) == {"node1/server", "node2/server"}
        for name in ("sc_run_1", "sc_run_2"):
            out = docker_engine.run(["exec", name, "sh", "-c", 'cat "$PWD/mod-order.txt"']).stdout
            assert out == "from the first mod\n"
            # vLLM's stand-in is the container's main process, started only once the gate opened
            assert "starting fake-model" in docker_engine.run(["logs", name]).stderr
            info = docker_engine.inspect(name)
            assert info["Path"] == "sh" and info["Args"][2] == "sparkconsole-mods-gate"
    finally:
        await runner.stop(plan)
    assert containers(docker_engine) == []


@pytest.mark.slow
async def test_a_failing_mod_stops_the_launch_on_every_node_with_its_output(tmp_path, docker_engine,
                                                                          testbed_base_image, local_cluster, state):
    write_mod(tmp_path, "broken", 'echo "patching vllm/entrypoints/chat_utils.py"\n'
                                  'echo "patch: **** malformed patch at line 7" >&2\nexit 3\n')
    recipe = fake_recipe(tmp_path, testbed_base_image)
    plan = make_plan(recipe, "2x-solo", local_cluster, {"apply_mods": [str(tmp_path / "mods" / "broken")]})
    plan = replace(plan, steps=tuple(s for s in plan.steps if "router" not in s.what),
                   services=tuple(s for s in plan.services if s.role != "router"))
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3, ready_timeout=60)
    with pytest.raises(LaunchError) as ei:
        await runner.launch(plan)
    msg = str(ei.value)
    assert "mod broken: run its run.sh" in msg and "malformed patch at line 7" in msg and "exit code 3" in msg
    assert ei.value.node == "node1" and "stopped what it had started on node1" in msg
    assert containers(docker_engine) == []          # node2 never started; node1's container is gone


@pytest.mark.slow
async def test_launch_never_replaces_a_running_container(tmp_path, docker_engine, testbed_base_image,
                                                         local_cluster, state):
    squatter = local_cluster.nodes[0].container
    docker_engine.run(["run", "-d", "--name", squatter, "--init", "-v", "/usr:/usr:ro", testbed_base_image,
                       "/usr/bin/sleep", "300"])
    recipe = fake_recipe(tmp_path, testbed_base_image)
    plan = make_plan(recipe, "solo", local_cluster)
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3)
    with pytest.raises(LaunchError) as ei:
        await runner.launch(plan)
    assert "node node1" in str(ei.value) and "recipe stop" in str(ei.value)
    assert docker_engine.inspect(squatter)["State"]["Running"] is True
    docker_engine.run(["rm", "-f", squatter])


@pytest.mark.slow
async def test_interrupted_launch_stops_what_it_started(tmp_path, docker_engine, testbed_base_image,
                                                        local_cluster, state):
    recipe = fake_recipe(tmp_path, testbed_base_image)
    plan = make_plan(recipe, "2x-solo", local_cluster, {"delay": 120, "router": "vllm-router"})
    plan = replace(plan, steps=tuple(s for s in plan.steps if "router" not in s.what),
                   services=tuple(s for s in plan.services if s.role != "router"))
    runner = Runner(local_cluster, await local_transports(local_cluster), poll_interval=0.3)
    task = asyncio.ensure_future(runner.launch(plan))
    for _ in range(200):
        if containers(docker_engine) == ["sc_run_1", "sc_run_2"]:
            break
        await asyncio.sleep(0.1)
    assert containers(docker_engine) == ["sc_run_1", "sc_run_2"]
    task.cancel()                                  # Ctrl-C, or the console closing, while waiting for ready
    with pytest.raises(asyncio.CancelledError):
        await task
    assert containers(docker_engine) == []


def test_error_line_picks_the_exception():
    lines = ["INFO loading", "Traceback (most recent call last):", '  File "x.py", line 3', "ValueError: too long",
             "INFO shutting down"]
    assert error_line(lines) == "ValueError: too long"
    assert error_line(["INFO a", "ERROR 05-01 engine core failed", "INFO b"]) == "ERROR 05-01 engine core failed"
    assert error_line(["just this"]) == "just this" and error_line([]) is None
    # pydantic (vLLM's config validation) puts the reason on the indented line after the exception
    pyd = ["(APIServer pid=7) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
           "(APIServer pid=7)   Value error, User-specified max_model_len (999999) is greater than the derived "
           "max_model_len (max_position_embeddings=2048) [type=value_error]",
           "(APIServer pid=7)     For further information visit https://errors.pydantic.dev/2.11/v/value_error"]
    assert "ValidationError" in error_line(pyd) and "max_model_len (999999)" in error_line(pyd)


# --- real vLLM, over real SSH --------------------------------------------------------------------------------

async def ssh_transports(cluster: ClusterConfig) -> dict:
    ts = {}
    for n in cluster.nodes:
        t = make_transport(n, cluster.ssh)
        await t.connect()
        ts[n.name] = t
    return ts


@pytest.mark.slow
async def test_node_lost_mid_launch_is_reported_and_the_rest_stopped(tmp_path, sshd_live, docker_engine,
                                                                     testbed_base_image, state):
    base = sshd_live.cluster_config(connect_timeout_s=3)
    nodes = tuple(replace(n, container=f"sc_lost_{i + 1}", vllm_port=free_port(n.address),
                          env=docker_env(docker_engine)) for i, n in enumerate(base.nodes))
    cluster = replace(base, nodes=nodes)
    recipe = fake_recipe(tmp_path, testbed_base_image)
    plan = make_plan(recipe, "2x-solo", cluster, {"delay": 120})
    plan = replace(plan, steps=tuple(s for s in plan.steps if "router" not in s.what),
                   services=tuple(s for s in plan.services if s.role != "router"))
    transports = await ssh_transports(cluster)
    runner = Runner(cluster, transports, poll_interval=0.3)
    events = []
    try:
        task = asyncio.ensure_future(runner.launch(plan, events.append))
        for _ in range(600):
            if any(e.stage == "log" and e.node == "node2" for e in events):     # waiting for readiness now
                break
            await asyncio.sleep(0.1)
        assert containers(docker_engine) == ["sc_lost_1", "sc_lost_2"]
        sshd_live[1].kill()                               # node2's SSH goes away while the launch waits
        with pytest.raises(LaunchError) as ei:
            await asyncio.wait_for(task, 120)
        msg = str(ei.value)
        assert "lost node node2" in msg and ei.value.node == "node2"
        assert "stopped what it had started on node1" in msg and "COULD NOT STOP sc_lost_2 on node2" in msg
        assert containers(docker_engine) == ["sc_lost_2"]     # node1 cleaned; node2 unreachable, said so
    finally:
        for t in transports.values():
            await t.close()
        docker_engine.run(["rm", "-f", "sc_lost_1", "sc_lost_2"], check=False)


@pytest.mark.slow
async def test_cli_launch_and_stop_end_to_end(tmp_path, docker_engine, testbed_base_image, state, monkeypatch, capsys):
    """`sparkconsole recipe launch … --yes --force`, `restart`, `stop`: the real monitor reads the node for
    preflight facts, the runner launches over the local transport, the endpoint answers."""
    from sparkconsole.cli import main
    recipe = fake_recipe(tmp_path, testbed_base_image)
    port = free_port("127.0.0.2")
    (tmp_path / "sparkconsole.yaml").write_text(
        f"nodes:\n  - {{name: node1, address: 127.0.0.2, local: true, container: sc_cli_1, vllm_port: {port}}}\n")
    for k, v in docker_env(docker_engine):
        monkeypatch.setenv(k, v)
    base = ["--cluster", str(tmp_path / "sparkconsole.yaml"), "recipe"]
    try:
        # --force: this CI machine's own OOM guards (swap, overcommit) are not a GB10's
        rc = await asyncio.to_thread(main, [*base, "launch", recipe.source, "-T", "solo", "--yes", "--force"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert f"ready: http://127.0.0.2:{port}" in out
        # preflight read this machine through the agent: its min_free_kbytes is reported when below 1.5 GiB
        low_reserve = int(Path("/proc/sys/vm/min_free_kbytes").read_text()) < 1572864
        # (a warning, as the dashboard draws that guard: severity.py)
        assert ("WARN oom_guards: [node1] vm.min_free_kbytes" in out) == low_reserve, out
        assert containers(docker_engine) == ["sc_cli_1"]
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"http://127.0.0.2:{port}/v1/models")).json()["data"][0]["id"] == "fake-model"
        before = started_at(docker_engine, "sc_cli_1")
        rc = await asyncio.to_thread(main, [*base, "restart", recipe.source, "-T", "solo", "--yes"])
        assert rc == 0 and started_at(docker_engine, "sc_cli_1") != before
        assert "ready again" in capsys.readouterr().out
        rc = await asyncio.to_thread(main, [*base, "stop", recipe.source, "-T", "solo", "--yes"])
        assert rc == 0 and containers(docker_engine) == []
    finally:
        docker_engine.run(["rm", "-f", "sc_cli_1"], check=False)
