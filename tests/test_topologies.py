"""The multi-node topologies serving real tokens: the tiny model on vLLM CPU, launched by `sparkconsole recipe
launch` over real SSH onto two test nodes (127.0.0.2 and 127.0.0.3, OpenSSH sessions whose `docker` is the test
bed's real engine), as an operator launches a recipe on two Sparks.

- cluster-tp2, vLLM's own multi-node launch: rank 0 serves on node1, rank 1 runs --headless on node2, from the
  recipe as a community checkout holds it (the model by Hugging Face id from each node's own cache, which
  `sparkconsole model pull` filled from node1; a mod that brings the chat template the command names);
- solo from that checkout on node2;
- cluster-tp2, Ray backend: the Ray cluster forms over both nodes, and vLLM's CPU platform refuses the Ray
  executor, which the product says in one line (and preflight refuses before anything starts);
- pipeline parallel 2 across the two nodes.
Disaggregation and the bench matrix are in tests/test_topologies_routed.py (a bed of its own, on another worker).

A launch is shared by the checks of it: a class with `shares_a_launch` launches once (a class-scoped fixture) and
its tests run in order on it, the destructive ones (a lost worker, the stop) last; its fixture clears the nodes
after the last. A new check of a topology is a test in its class, before the destructive ones, not a new launch
(every vLLM start costs the suite half a minute of both cores).

The two "nodes" share this machine's two cores: each node's vLLM gets its own core through the cluster file's
vllm_env (VLLM_CPU_OMP_THREADS_BIND), as preflight asks for a CPU build whose ranks share a machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sparkconsole.recipes import find_recipe
from tests.helpers import error_lines, free_port
from tests.testbed.sshd import ADDRESSES, _ensure_sshd, start_sshd_nodes

pytestmark = pytest.mark.slow
PY_HOME = str(Path(sys.base_prefix).resolve())


@dataclass
class TopologyBed:
    root: Path
    cluster_file: Path
    recipe: Path
    sets: dict[str, str]
    env: dict[str, str]
    nodes: list            # SshdNode
    engine: object         # DockerEngine
    containers: tuple[str, ...]
    ports: tuple[int, ...]
    community: Path        # the recipe as a spark-vllm-docker checkout holds it, with a mod (community_checkout)
    registry_recipe: str = ""   # the same recipe as recipe_version "2" in a registry (registry_v2), @REGISTRY/NAME

    def sc(self, *args: str, timeout: float = 900, extra_env: dict | None = None) -> subprocess.CompletedProcess:
        """`sparkconsole --cluster F ARGS`, as an operator types it."""
        return subprocess.run([sys.executable, "-m", "sparkconsole", "--cluster", str(self.cluster_file), *args],
                              capture_output=True, text=True, timeout=timeout, env={**self.env, **(extra_env or {})})

    def recipe_args(self, *args: str, recipe: Path | None = None) -> list[str]:
        return [str(recipe or self.recipe), *args, *[a for k, v in self.sets.items() for a in ("--set", f"{k}={v}")]]

    def ssh(self, node: int, command: str) -> str:
        """A command on a test node through its own sshd, as the node's shell runs it."""
        n = self.nodes[node]
        r = subprocess.run(["ssh", "-i", n.identity, "-p", str(n.port), "-o", f"UserKnownHostsFile={n.known_hosts}",
                            "-o", "BatchMode=yes", f"{n.user}@{n.address}", command],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def url(self, node: int) -> str:
        return f"http://{self.nodes[node].address}:{self.ports[node]}"

    def clear(self, test: str = "") -> None:
        """Remove every container of this bed (its nodes', their routers', other workloads' and the gateway's:
        each named after a node's container), its log kept first where SPARKCONSOLE_TEST_KEEP_LOGS says."""
        keep = os.environ.get("SPARKCONSOLE_TEST_KEEP_LOGS")
        listed = self.engine.run(["ps", "-a", "--format", "{{.Names}}"], check=False).stdout.split()
        mine = sorted({*self.containers, *(n for n in listed if n.startswith(tuple(f"{c}_" for c in self.containers)))})
        for c in mine:
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                r = self.engine.run(["logs", c], check=False)
                if r.returncode == 0:
                    (Path(keep) / f"{test or 'bed'}-{c}.log").write_text(r.stdout + r.stderr)
            self.engine.run(["rm", "-f", c, f"{c}_router"], check=False)


TEMPLATE_MARK = "sparkmodtemplate"


def community_checkout(root: Path, recipe: Path) -> Path:
    """The tiny recipe as a community checkout holds one: a spark-vllm-docker directory (its runner script, its
    recipes/ and mods/), the recipe listing a mod that puts a chat template into the container's working directory
    and the command naming that file, as community recipes do (`--chat-template unsloth.jinja`)."""
    mod = root / "mods" / "tiny-chat-template"
    mod.mkdir(parents=True)
    (root / "launch-cluster.sh").write_text("#!/bin/bash\n# stands for the runner: marks the checkout\n")
    (mod / "tiny-chat.jinja").write_text(
        "{% for m in messages %}" + TEMPLATE_MARK + " {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    (mod / "run.sh").write_text('#!/bin/bash\nset -e\ncp tiny-chat.jinja "$WORKSPACE_DIR/"\n'
                                'echo "tiny-chat-template applied in $WORKSPACE_DIR"\n')
    text = recipe.read_text().replace("mods: []\n", "mods:\n  - mods/tiny-chat-template\n")
    text = text.replace("      --dtype float32\n", "      --dtype float32 \\\n      --chat-template tiny-chat.jinja\n")
    assert "tiny-chat.jinja" in text and "mods/tiny-chat-template" in text
    (root / "recipes").mkdir()
    (root / "recipes" / "tiny-chat.yaml").write_text(text)
    return root / "recipes" / "tiny-chat.yaml"


def registry_v2(root: Path, community: Path) -> Path:
    """The community recipe as sparkrun's registries publish it: recipe_version "2", no name (its file's stem), in
    a git repository with a manifest, its mod in the registry's mods folder (found there as sparkrun finds it)."""
    text = community.read_text().replace('recipe_version: "1"', 'recipe_version: "2"')
    text = re.sub(r"(?m)^name: .*\n", "", text)
    assert 'recipe_version: "2"' in text and "\nname:" not in text
    (root / "recipes").mkdir(parents=True)
    (root / "recipes" / "tiny-chat.yaml").write_text(text)
    (root / ".sparkrun").mkdir()
    (root / ".sparkrun" / "registry.yaml").write_text("registries:\n  - name: testbed\n    recipes: recipes\n"
                                                      "    mods: mods\n")
    shutil.copytree(community.parent.parent / "mods", root / "mods")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "tiny-chat as a v2 recipe"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


def chat_prompt(url: str, model: str) -> str:
    """The prompt a chat completion was given, read back from the tokens the server reports it used."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2,
            "return_token_ids": True}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=180, trust_env=False)
    assert r.status_code == 200, r.text
    ids = r.json()["prompt_token_ids"]
    d = httpx.post(url + "/detokenize", json={"model": model, "tokens": ids}, timeout=60, trust_env=False)
    assert d.status_code == 200, d.text
    return d.json()["prompt"]


@contextlib.contextmanager
def topology_bed(docker_engine, vllm_env, tiny_model, vllm_router_env, litellm_env, addresses=ADDRESSES):
    """sshd nodes at `addresses`, a cluster file over them (a core each, round robin over this machine's cores,
    through vllm_env), and the bundled tiny recipe with ports of this run's own."""
    why = _ensure_sshd()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="sc-topologies-"))
    # Every session on these nodes finds the test engine, with nothing set by the client: a real node's docker.
    # LiteLLM's master key too: the router container takes it from the node's environment, by reference.
    # Each node has a Hugging Face cache of its own (HF_HOME), as each Spark has: the launch mounts it.
    key = "sk-" + secrets.token_hex(16)

    def extra(i: int) -> str:
        return (f"SetEnv DOCKER_HOST={docker_engine.host} DOCKER_CONFIG={docker_engine.root / 'client-config'} "
                f"LITELLM_MASTER_KEY={key} HF_HOME={root / 'hf' / f'node{i + 1}'}\n")
    nodes = start_sshd_nodes(root / "sshd", addresses, extra_config=extra)
    containers = tuple(f"sc_topo_{os.getpid()}_{i + 1}" for i in range(len(addresses)))
    ports = tuple(free_port(a) for a in addresses)
    cluster = nodes.write_cluster_file(root / "sparkconsole.yaml", list(containers), list(ports))
    # The bundled recipe with ports of this run's own: another test's router may hold 4000, its master 29511.
    recipe = root / "tiny.yaml"
    text = Path(find_recipe("tiny-testbed").source).read_text()
    recipe.write_text(text.replace("    port: 4000\n", f"    port: {free_port('0.0.0.0')}\n")
                      .replace("master_port: 29511", f"master_port: {free_port(addresses[0])}")
                      .replace("side_channel_port: 5600", f"side_channel_port: {free_port(addresses[0])}"))
    sets = {"python_home": PY_HOME, "vllm_venv": str(vllm_env.path), "served_model_name": tiny_model.name,
            "router_venv": str(vllm_router_env.path), "litellm_venv": str(litellm_env.path)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env.update(SPARKCONSOLE_STATE_DIR=str(root / "state"), NO_COLOR="1", SPARKCONSOLE_API_KEY=key)
    bed = TopologyBed(root, cluster, recipe, sets, env, nodes, docker_engine, containers, ports,
                      community_checkout(root / "spark-vllm-docker", recipe))
    try:
        # The operator downloaded the model on the first node; `model pull` copies it into the others' caches.
        tiny_model.seed_hf_cache(root / "hf" / "node1")
        # The v2 recipe's registry, added as an operator adds one (the real git, file://); not trusted: its mod
        # runs only with --trust.
        reg = registry_v2(root / "registry", bed.community)
        added = bed.sc("recipe", "registry", "add", f"file://{reg}", "--name", "testreg", timeout=120)
        assert added.returncode == 0 and "not trusted" in added.stdout, added.stdout + added.stderr
        bed.registry_recipe = "@testreg/tiny-chat"
        pull = bed.sc("model", "pull", tiny_model.hf_id, "--from", "node1",
                      *[a for n in nodes[1:] for a in ("--node", n.name)], "--yes", timeout=300)
        assert pull.returncode == 0, pull.stdout + pull.stderr
        yield bed
    finally:
        bed.clear()
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def bed(docker_engine, testbed_base_image, vllm_env, tiny_model, vllm_router_env, litellm_env):
    with topology_bed(docker_engine, vllm_env, tiny_model, vllm_router_env, litellm_env) as b:
        yield b


@pytest.fixture(autouse=True)
def nothing_left_running(request):
    """Each test of its own launch starts on empty nodes: a failed test's containers would refuse the next test's
    launch (a launch never replaces a running container), so one failure stays one failure. The checks of a shared
    launch (a class with `shares_a_launch`) leave it serving; its fixture clears the nodes after the last one."""
    yield
    if "bed" in request.fixturenames and not getattr(request.cls, "shares_a_launch", False):
        request.getfixturevalue("bed").clear(request.node.name)


def names_on(bed: TopologyBed, node: int) -> list[str]:
    """Containers of this run, as `docker ps -a` over the node's own SSH session lists them."""
    out = bed.ssh(node, "docker ps -a --format '{{.Names}}'").split()
    return sorted(n for n in out if n.startswith(bed.containers[0].rsplit("_", 1)[0]))


def vllm_processes(model: str) -> list[str]:
    """vLLM processes of this machine serving the test bed's model (the containers' processes run here)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "vllm" in ln and model in ln and "ps -eo" not in ln]


async def stream_chat(url: str, model: str, max_tokens: int, prompt: str = "hello there") -> tuple[int, int]:
    """A streaming chat completion; returns (chunks that carried tokens, completion tokens in usage)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    chunks, usage, seen = 0, None, []
    async with httpx.AsyncClient(trust_env=False, timeout=180) as client:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                seen.append(line)
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if doc.get("choices"):
                    chunks += 1
                if doc.get("usage"):
                    usage = doc["usage"]["completion_tokens"]
    assert usage is not None, seen[-4:]
    return chunks, usage


async def watch_launch(bed: TopologyBed, verdict: str, timeout: float = 60, members: int = 2):
    """The console's view: a ClusterMonitor over the cluster file (the agent reading each node's docker), its
    containers grouped into launches, and the alert engine's events, until the launch reads `verdict`."""
    from sparkconsole.alerts import AlertEngine
    from sparkconsole.config import Thresholds, load_cluster
    from sparkconsole.nodes.launches import launch_groups
    from sparkconsole.nodes.monitor import ClusterMonitor
    monitor = ClusterMonitor(load_cluster(bed.cluster_file), history=4)
    engine, events = AlertEngine(Thresholds()), []
    await monitor.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            groups = [g for g in launch_groups(monitor.nodes.values()) if g.topology == "cluster-tp2"]
            events += engine.observe_launches(groups)
            if groups and groups[0].verdict == verdict and len(groups[0].members) == members:
                return groups[0], events
            await asyncio.sleep(0.3)
        raise AssertionError(f"no launch read {verdict} in {timeout} s: {groups}")
    finally:
        await monitor.stop()


def bench_sweep(bed: TopologyBed, url: str, results: Path, *args: str) -> list:
    """`bench run` at c1 and c2 (pp 64, tg 16, one batch each) against a launch: its levels, each request served."""
    from sparkconsole.bench.results import ResultsStore
    swept = bed.sc("bench", "run", "--url", url, *args, "--pp", "64", "--tg", "16", "-c", "1,2", "--runs", "1",
                   "--results", str(results), timeout=600)
    assert swept.returncode == 0, swept.stdout + swept.stderr[-3000:]
    with ResultsStore(results) as store:
        (run,) = store.runs()
        levels = store.levels(run.run_id)
    assert [lv.key.concurrency for lv in levels] == [1, 2]
    assert all(lv.metrics["requests_ok"] == lv.key.concurrency for lv in levels), [lv.metrics for lv in levels]
    return levels


def scrape(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=30, trust_env=False).text


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of a metric family's samples whose labels include `labels` (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# --- cluster TP=2, vLLM's own multi-node launch -------------------------------------------------------------

def community_args(bed: TopologyBed, *a: str) -> list[str]:
    return bed.recipe_args(*a, recipe=bed.community)


def registry_args(bed: TopologyBed, *a: str) -> list[str]:
    return bed.recipe_args(*a, recipe=bed.registry_recipe)


class TestClusterTp2:
    """The community recipe (model by Hugging Face id, a mod) in cluster TP=2, as a v2 recipe from a registry
    (sparkrun's format, the mod from the registry's mods folder): one launch shared by its checks, in order; the
    lost worker, its restart and the stop last. The mod on both nodes before vLLM starts, only once confirmed
    (--trust); the model from each node's own cache; the template the mod brought in use; the recipe's readiness
    probe answered."""

    shares_a_launch = True

    @pytest.fixture(scope="class")
    def tp2(self, bed):
        unconfirmed = bed.sc("recipe", "launch", *registry_args(bed, "-T", "cluster-tp2", "--yes", "--force"),
                             timeout=300)
        assert unconfirmed.returncode == 2 and "need confirmation" in unconfirmed.stderr, unconfirmed.stderr[-2000:]
        assert "mod: tiny-chat-template from registry testreg (not trusted)" in unconfirmed.stdout
        assert names_on(bed, 0) == [] and names_on(bed, 1) == []
        launch = bed.sc("recipe", "launch", *registry_args(bed, "-T", "cluster-tp2", "--yes", "--force", "--trust"))
        assert launch.returncode == 0, launch.stdout + launch.stderr[-3000:]
        yield launch
        bed.clear("cluster-tp2")

    @pytest.mark.timeout(1500)
    def test_both_ranks_start_with_the_mod_from_each_nodes_own_cache(self, bed, tp2, tiny_model):
        out = tp2.stdout
        assert re.search(r"node1\s+ready\s+readiness: first text after [\d.]+ s", out), out[-2000:]
        assert re.search(r"node1\s+ready\s+server ready after [\d.]+ s at " + re.escape(bed.url(0)), out), out[-2000:]
        assert re.search(r"node2\s+ready\s+worker ready", out), out[-2000:]
        for i in (0, 1):
            assert re.search(rf"node{i + 1}\s+ok\s+mod tiny-chat-template: run its run.sh", out), out[-3000:]
            assert TEMPLATE_MARK in bed.ssh(i, f"docker exec {bed.containers[i]} sh -c 'cat \"$PWD\"/tiny-chat.jinja'")
            assert_serves_from_node_cache(bed, i, "/cache/huggingface")        # where sparkrun mounts it
        assert TEMPLATE_MARK + " user: hello" in chat_prompt(bed.url(0), tiny_model.name)
        assert names_on(bed, 0) == sorted(bed.containers) and names_on(bed, 1) == sorted(bed.containers)
        head_args = bed.engine.inspect(bed.containers[0])["Args"]
        worker_args = bed.engine.inspect(bed.containers[1])["Args"]
        assert "--headless" in worker_args and "--headless" not in head_args
        assert worker_args[worker_args.index("--node-rank") + 1] == "1"
        assert worker_args[worker_args.index("--master-addr") + 1] == ADDRESSES[0]

    def test_tokens_stream_across_the_two_nodes(self, bed, tp2, tiny_model):
        chunks, usage = asyncio.run(stream_chat(bed.url(0), tiny_model.name, 24))
        # Streamed in pieces, not one block: vLLM merges the tokens that are ready when its API server catches up
        # with the engine, so a loaded machine sends fewer, larger chunks (11 for 24 tokens in a clean-clone run).
        assert usage == 24 and chunks >= 24 // 4
        assert counter(scrape(bed.url(0)), "vllm:generation_tokens_total") >= 24

    @pytest.mark.timeout(1200)
    def test_a_lost_worker_reads_broken_and_restart_brings_both_back_head_first(self, bed, tp2, tiny_model):
        """The worker goes away: the launch is seen broken (not a silent stall), and restart brings both back."""
        bed.engine.run(["kill", bed.containers[1]])
        group, alerts = asyncio.run(watch_launch(bed, "BROKEN"))
        assert [(m.node, m.role, m.state) for m in group.members] == [("node1", "server", "running"),
                                                                      ("node2", "worker", "exited")]
        assert "tensor-parallel group cannot serve" in group.reason
        assert [a.message for a in alerts if a.key == f"launch:{group.key}" and a.active and a.severity == "bad"]
        keep = os.environ.get("SPARKCONSOLE_TEST_KEEP_LOGS")
        if keep:   # recorded for the console's tests (tests/fixtures/docker-inspect-cluster-tp2-worker-lost.json)
            (Path(keep) / "inspect.json").write_text(bed.engine.run(["inspect", *bed.containers]).stdout)
        status = bed.sc("recipe", "status", *registry_args(bed, "-T", "cluster-tp2"), timeout=120)
        assert status.returncode == 1, status.stdout + status.stderr
        assert re.search(r"BROKEN: worker on node2 exited \(exit code 137\); the tensor-parallel group cannot serve",
                         status.stdout), status.stdout
        assert re.search(r"node1 +server .* running .*health ok", status.stdout), status.stdout
        restart = bed.sc("recipe", "restart", *registry_args(bed, "-T", "cluster-tp2", "--yes", "--force", "--trust"))
        assert restart.returncode == 0, restart.stdout + restart.stderr[-3000:]
        order = [m.group(1) for m in re.finditer(r"(node\d)\s+step\s+start vLLM (?:server|worker)", restart.stdout)]
        assert order == ["node1", "node2"], restart.stdout[-2000:]
        # a restart is a fresh container, so the mod is applied again on both nodes, as the runner does
        assert len(re.findall(r"node\d\s+ok\s+mod tiny-chat-template: run its run.sh", restart.stdout)) == 2
        assert asyncio.run(stream_chat(bed.url(0), tiny_model.name, 8))[1] == 8

    @pytest.mark.timeout(600)
    def test_stop_leaves_nothing_on_either_node(self, bed, tp2, tiny_model):
        stop = bed.sc("recipe", "stop", *registry_args(bed, "-T", "cluster-tp2", "--yes"), timeout=300)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert names_on(bed, 0) == [] and names_on(bed, 1) == []
        assert vllm_processes(tiny_model.hf_id) == []


def assert_serves_from_node_cache(bed: TopologyBed, i: int, where: str = "/root/.cache/huggingface") -> None:
    """The container sees the node's own Hugging Face cache, and no model path of the test bed's is mounted."""
    mounts = {m["Destination"]: m["Source"] for m in bed.engine.inspect(bed.containers[i])["Mounts"]}
    assert mounts[where] == str(bed.root / "hf" / f"node{i + 1}"), mounts
    assert not any("models" in src for src in mounts.values()), mounts


class TestSolo:
    """Solo on the second node: its cache holds the model only because `model pull` copied it from the first. One
    launch shared by its checks; restarted (a new container, the mod applied again), then stopped, last."""

    shares_a_launch = True

    @pytest.fixture(scope="class")
    def solo(self, bed):
        launch = bed.sc("recipe", "launch", *community_args(bed, "-T", "solo", "-n", "node2", "--yes", "--force"))
        assert launch.returncode == 0, launch.stdout + launch.stderr[-3000:]
        yield launch
        bed.clear("solo")

    @pytest.mark.timeout(900)
    def test_the_plan_copies_the_mod_in(self, bed):
        plan = bed.sc("recipe", "plan", *community_args(bed, "-T", "solo", "-n", "node2"), timeout=120)
        assert plan.returncode == 0, plan.stderr
        assert "mod tiny-chat-template: copy its 2 file(s) in" in plan.stdout, plan.stdout

    @pytest.mark.timeout(900)
    def test_serves_the_pulled_model_from_the_nodes_cache_with_the_mods_template(self, bed, solo, tiny_model):
        assert_serves_from_node_cache(bed, 1)
        assert TEMPLATE_MARK + " user: hello" in chat_prompt(bed.url(1), tiny_model.name)

    @pytest.mark.timeout(900)
    def test_restart_is_a_new_container_with_the_mod_applied_again(self, bed, solo, tiny_model):
        before = bed.engine.inspect(bed.containers[1])["Id"]
        restart = bed.sc("recipe", "restart", *community_args(bed, "-T", "solo", "-n", "node2", "--yes", "--force"))
        assert restart.returncode == 0, restart.stdout + restart.stderr[-3000:]
        assert re.search(r"node2\s+ok\s+mod tiny-chat-template: run its run.sh", restart.stdout), restart.stdout[-2000:]
        assert bed.engine.inspect(bed.containers[1])["Id"] != before
        assert TEMPLATE_MARK + " user: hello" in chat_prompt(bed.url(1), tiny_model.name)

    @pytest.mark.timeout(600)
    def test_stop_leaves_nothing_on_the_node(self, bed, solo):
        stop = bed.sc("recipe", "stop", *community_args(bed, "-T", "solo", "-n", "node2", "--yes"), timeout=300)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert names_on(bed, 1) == []


# --- cluster TP=2, Ray backend -------------------------------------------------------------------------------

@pytest.mark.timeout(900)
def test_cluster_ray_forms_over_both_nodes_and_cpu_vllm_refusal_is_one_line(bed, monkeypatch):
    """vLLM refusing at start-up on real nodes: its own log line is the launch's one-line error, and what had
    started is stopped on both nodes, each cleanup audited."""
    from sparkconsole import audit
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", bed.env["SPARKCONSOLE_STATE_DIR"])
    args = bed.recipe_args("-T", "cluster-tp2", "--backend", "ray", "--yes")
    refused = bed.sc("recipe", "launch", *args, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    # (this CI machine's own OOM guards refuse too: the findings list every refusal, one line each)
    assert "preflight refuses the launch" in refused.stderr
    assert re.search(r"REFUSE ray_on_cpu: .*fix: launch with --backend mp", refused.stdout), refused.stdout
    assert names_on(bed, 0) == []                                  # refused before anything started

    audited = len(audit.read())
    launch = bed.sc("recipe", "launch", *args, "--force")
    out = launch.stdout
    assert launch.returncode == 2, out + launch.stderr
    # The Ray cluster formed: head on node1, worker on node2, both counted by `ray status` on the head.
    assert re.search(r"node1\s+ok\s+wait until the Ray cluster has 2 nodes: 2 found", out), out[-3000:]
    # vLLM's refusal, in one line, with what to do instead; and nothing left on either node.
    err = error_lines(launch.stderr)
    assert len(err) == 1 and "does not support ray" in err[0] and "--backend mp" in err[0], launch.stderr
    assert "stopped what it had started on node1, node2" in err[0]
    assert {e.node for e in audit.read()[audited:] if e.action.startswith("cleanup")} == {"node1", "node2"}
    assert names_on(bed, 0) == [] and names_on(bed, 1) == []


# --- pipeline parallel across the two nodes -------------------------------------------------------------------

@pytest.mark.timeout(900)
def test_pipeline_parallel_2_launches_across_the_two_nodes_and_a_dead_engine_reads_broken(bed, tiny_model):
    """PP=2 over the two SSH nodes: both ranks start and the head answers /health, but vLLM 0.32 CPU's engine dies
    on the first step (KeyError in scheduler.update_from_output, with and without V1 multiprocessing: a vLLM bug
    on this build, not a launch fault). The product shows it: the request fails, `recipe status` reads BROKEN."""
    args = bed.recipe_args("-T", "cluster-tp2", "--set", "tensor_parallel=1", "--set", "pipeline_parallel=2")
    launch = bed.sc("recipe", "launch", *args, "--yes", "--force")
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert re.search(r"node2\s+ready\s+worker ready", launch.stdout), launch.stdout[-2000:]
    worker_args = bed.engine.inspect(bed.containers[1])["Args"]
    assert worker_args[worker_args.index("--pipeline-parallel-size") + 1] == "2"
    assert worker_args[worker_args.index("--tensor-parallel-size") + 1] == "1" and "--headless" in worker_args
    body = {"model": tiny_model.name, "prompt": "hello", "max_tokens": 8}
    r = httpx.post(bed.url(0) + "/v1/completions", json=body, timeout=180, trust_env=False)
    if r.status_code == 200:      # a vLLM that serves PP across nodes on CPU: then it must give the tokens
        assert r.json()["usage"]["completion_tokens"] == 8
    else:
        assert r.status_code == 500 and "EngineCore" in r.text, r.text[:300]
        deadline = time.monotonic() + 120
        while True:
            status = bed.sc("recipe", "status", *args, timeout=120)
            if status.returncode == 1 and "BROKEN" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert status.returncode == 1 and "BROKEN: server on node1" in status.stdout, status.stdout
    stop = bed.sc("recipe", "stop", *args, "--yes", timeout=300)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert names_on(bed, 0) == [] and names_on(bed, 1) == []


# --- llama.cpp: a v2 recipe with `runtime: llama-cpp`, launched, watched and swept for real ------------------------

LLAMA_RECIPE = """recipe_version: "2"
runtime: llama-cpp
model: {gguf}
container: sparkconsole-testbed/base:1
defaults:
  ctx_size: 2048
  served_model_name: tiny-llama
  llama_venv: {venv}
  gguf_dir: {gguf_dir}
command: |
  {{llama_venv}}/bin/llama-server -m {{model}} --host {{node_address}} --port {{port}} --ctx-size {{ctx_size}} \\
      --alias {{served_model_name}} --metrics --threads 1 --parallel 2
sparkconsole:
  topologies: [solo]
  secrets: []
  container:
    memory: 2g
    shm_size: 256m
    gpus: null
    ipc_host: false
    init: true
    nofile: 16384
    privileged: false
    rdma: false
    volumes:
      - /usr:/usr:ro
      - /etc/passwd:/etc/passwd:ro
      - /etc/group:/etc/group:ro
      - /etc/ld.so.cache:/etc/ld.so.cache:ro
      - "{{llama_venv}}:{{llama_venv}}:ro"
      - "{{gguf_dir}}:{{gguf_dir}}:ro"
"""


async def endpoint_panel_text(url: str, needles: tuple[str, ...]) -> str:
    """The console's dashboard polling `url` as an endpoint (the nodes' readings replayed): its endpoint panel once
    it shows every needle."""
    from sparkconsole.config import ClusterConfig, EndpointConfig, NodeConfig
    from sparkconsole.nodes.monitor import ClusterMonitor
    from sparkconsole.nodes.replay import read_recording, replay_factory
    from sparkconsole.tui.app import SparkConsoleApp
    from tests.helpers import wait_for
    from tests.screen import widget_text

    recording = read_recording(Path(__file__).parent / "fixtures" / "agent-h100-idle.jsonl")
    cfg = ClusterConfig(nodes=(NodeConfig("node2", "127.0.0.1", role="head"),),
                        endpoints=(EndpointConfig("node2", url, kind="vllm", node="node2"),))
    app = SparkConsoleApp(cfg, monitor=ClusterMonitor(cfg, transport_factory=replay_factory(lambda n: recording,
                                                                                              interval=0.1)))
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.dashboard.endpoint_panels["node2"]
        await wait_for(pilot, lambda: all(k in widget_text(panel) for k in needles), timeout=30,
                       what=f"the endpoint panel showing {needles}")
        text = widget_text(panel)
        await pilot.press("q")
    return text


@pytest.mark.timeout(900)
def test_llamacpp_v2_recipe_serves_for_real_with_its_metrics_in_the_console_and_a_bench_sweep(
        bed, tiny_gguf, llamacpp_env, monkeypatch):
    """One llama-server launch for every check: `recipe launch` of a v2 `runtime: llama-cpp` recipe on node2 (the
    product's runner, over SSH, into the test bed's Docker engine), its memory fit read from the node, chat tokens,
    its /metrics in the console's endpoint panel, `bench run` sweeping it, and `recipe stop` leaving nothing."""
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", bed.env["SPARKCONSOLE_STATE_DIR"])
    recipe = bed.root / "tiny-llamacpp.yaml"
    recipe.write_text(LLAMA_RECIPE.format(gguf=tiny_gguf.path, venv=llamacpp_env.path, gguf_dir=tiny_gguf.path.parent))
    args = [str(recipe), "-T", "solo", "-n", "node2"]
    plan = bed.sc("recipe", "plan", *args, "--offline", timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "start llama.cpp server" in plan.stdout and "--headless" not in plan.stdout and " serve " not in plan.stdout
    launch = bed.sc("recipe", "launch", *args, "--yes", "--force")
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    try:
        assert re.search(r"node2\s+ready\s+server ready after [\d.]+ s at " + re.escape(bed.url(1)), launch.stdout)
        # the memory fit from the node itself: the GGUF's size, read there
        size = tiny_gguf.path.stat().st_size
        fit = next(ln for ln in launch.stdout.splitlines() if ln.startswith("memory [node2/server]"))
        assert f"weights {size / 1024 ** 2:.1f} MiB" in fit and "(source: hf-cache)" in fit and "no claim" in fit
        models = httpx.get(bed.url(1) + "/v1/models", timeout=30, trust_env=False).json()
        assert [m["id"] for m in models["data"]] == ["tiny-llama"]
        # ignore_eos: the random model samples its end-of-text now and then (ci33: 10 tokens of 12)
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
                "ignore_eos": True}
        r = httpx.post(bed.url(1) + "/v1/chat/completions", json=body, timeout=120, trust_env=False)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12, r.text
        assert counter(scrape(bed.url(1)), "llamacpp:tokens_predicted_total") >= 12

        text = asyncio.run(endpoint_panel_text(bed.url(1), ("tiny-llama", "llama.cpp", "UP", "run 0")))
        assert "wait 0" in text

        bench_sweep(bed, bed.url(1), bed.root / "llamacpp.sqlite", "--topology", "solo", "--label", "llama.cpp")
        assert counter(scrape(bed.url(1)), "llamacpp:tokens_predicted_total") >= 12 + 16 * 3
    finally:
        stop = bed.sc("recipe", "stop", *args, "--yes", timeout=300)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert names_on(bed, 1) == []
