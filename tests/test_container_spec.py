"""The runner's container around every vLLM server, planned (issue 23): mods resolved and applied in order on
every node before vLLM starts, the node's Hugging Face and compile caches mounted, RDMA access (privileged, or the
runner's non-privileged set), its ulimit and NCCL_IGNORE_CPU_AFFINITY, and the cluster link's addresses."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.launch.ifaces import choose_link_address, link_address
from sparkconsole.launch.mods import GATE_FILE, checkout_root, resolve_mods
from sparkconsole.launch.plan import make_plan
from sparkconsole.nodes.transport import LocalTransport
from sparkconsole.recipes import find_recipe, load_recipe

NODES = ClusterConfig(nodes=(NodeConfig(name="spark1", address="192.168.100.10", role="head", container="vllm_a"),
                             NodeConfig(name="spark2", address="192.168.100.11", container="vllm_b")),
                      endpoints=(), source="<test>")


def checkout(tmp_path: Path, mods: list[str], sub: str = "") -> Path:
    """A spark-vllm-docker checkout: its runner at the top, a recipe under recipes/ (or a sub-directory of it)."""
    (tmp_path / "run-recipe.py").write_text("# the runner\n")
    text = (Path(find_recipe("gpt-oss-120b").source).read_text()
            .replace("mods: []\n", "mods:\n" + "".join(f"  - {m}\n" for m in mods)))
    d = tmp_path / "recipes" / sub
    d.mkdir(parents=True, exist_ok=True)
    (d / "r.yaml").write_text(text)
    return d / "r.yaml"


def mod_dir(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    d = root / "mods" / name
    d.mkdir(parents=True)
    (d / "run.sh").write_text("#!/bin/bash\necho hi\n")
    for k, v in (files or {}).items():
        (d / k).write_text(v)
    return d


def tar_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return sorted(t.getnames())


def test_a_recipes_mods_resolve_against_its_checkout_and_command_line_mods_come_last(tmp_path, monkeypatch):
    path = checkout(tmp_path, ["mods/fix-template", "mods/drop-caches"], sub="4x-spark-cluster")
    assert checkout_root(str(path)) == tmp_path
    mod_dir(tmp_path, "fix-template", {"unsloth.jinja": "{{ messages }}"})
    mod_dir(tmp_path, "drop-caches")
    extra = tmp_path / "elsewhere" / "mine"
    extra.mkdir(parents=True)
    (extra / "run.sh").write_text("true\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    mods = resolve_mods(load_recipe(path), ["mine"])
    assert [m.name for m in mods] == ["fix-template", "drop-caches", "mine"]
    assert tar_names(mods[0].archive) == ["run.sh", "unsloth.jinja"] and mods[0].files == 2


@pytest.mark.parametrize("case, words", [
    ("missing", ("mods/absent does not exist", "mods[0]")),
    ("no run.sh", ("has no run.sh", "mods[0]")),
    ("a file", ("neither a directory nor a .zip", "mods[0]")),
])
def test_a_bad_mod_is_one_line_naming_the_recipe_and_the_entry(tmp_path, case, words):
    path = checkout(tmp_path, ["mods/absent"])
    if case == "no run.sh":
        (tmp_path / "mods" / "absent").mkdir(parents=True)
    elif case == "a file":
        (tmp_path / "mods").mkdir()
        (tmp_path / "mods" / "absent").write_text("x")
    with pytest.raises(UserError) as ei:
        make_plan(load_recipe(path), "solo", NODES)
    text = str(ei.value)
    assert "\n" not in text and str(path) in text and all(w in text for w in words), text


def test_a_zip_mod_lands_as_the_runner_leaves_it_zip_and_contents(tmp_path):
    (tmp_path / "mods").mkdir()
    z = tmp_path / "mods" / "fp4-kernels.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("run.sh", "#!/bin/bash\ntrue\n")
        zf.writestr("kernels/sm121.patch", "--- a\n+++ b\n")
    (mod,) = resolve_mods(load_recipe(checkout(tmp_path, ["mods/fp4-kernels.zip"])))
    assert mod.name == "fp4-kernels" and mod.kind == "zip"
    assert tar_names(mod.archive) == ["fp4-kernels.zip", "kernels", "kernels/sm121.patch", "run.sh"]
    bad = tmp_path / "mods" / "empty.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("readme", "x")
    with pytest.raises(UserError, match="has no run.sh"):
        resolve_mods(load_recipe(checkout(tmp_path, ["mods/empty.zip"])))


def test_cluster_plan_applies_every_mod_on_every_node_before_any_vllm_starts(tmp_path):
    path = checkout(tmp_path, ["mods/a", "mods/b"])
    mod_dir(tmp_path, "a")
    mod_dir(tmp_path, "b")
    plan = make_plan(load_recipe(path), "cluster-tp2", NODES, {"eth_if": "enp1s0f0np0"})
    whats = [(s.node, s.what) for s in plan.steps]
    for node, name in (("spark1", "vllm_a"), ("spark2", "vllm_b")):
        mine = [w for n, w in whats if n == node]
        start = next(i for i, w in enumerate(mine) if w.startswith("start vLLM"))
        assert [w for w in mine[start + 1:start + 7]] == [
            f"mod a: make /workspace/mods/a in {name}", "mod a: copy its 1 file(s) in (dir " + str(tmp_path / "mods/a") + ")",
            "mod a: run its run.sh", f"mod b: make /workspace/mods/b in {name}",
            "mod b: copy its 1 file(s) in (dir " + str(tmp_path / "mods/b") + ")", "mod b: run its run.sh"]
    # vLLM is released on both nodes only after the last mod of the last node
    releases = [i for i, (_, w) in enumerate(whats) if w.startswith("start vLLM in")]
    last_mod = max(i for i, (_, w) in enumerate(whats) if w.startswith("mod "))
    assert len(releases) == 2 and min(releases) > last_mod
    release = plan.steps[releases[0]]
    assert release.argv[-2:] == ("touch", GATE_FILE)
    run = next(s for s in plan.steps if s.service == "spark1/server")
    k = run.argv.index("--entrypoint=")
    assert run.argv[k + 2:k + 4] == ("sh", "-c") and run.argv[k + 5] == "sparkconsole-mods-gate"
    assert list(run.argv[k + 6:]) == list(plan.server_args["spark1/server"])
    assert plan.mods == ("a", "b") and not plan.restartable_in_place
    text = plan.render()
    assert "(stdin: a tar of " in text and "\x00" not in text


def test_the_gate_waits_for_the_mods_then_becomes_the_server(tmp_path):
    """The container's command, run by a real shell: it waits while the gate file is absent, then execs argv."""
    from sparkconsole.launch import mods
    gate = tmp_path / "gate"
    script = mods.GATE_SCRIPT.replace(GATE_FILE, str(gate))
    proc = subprocess.Popen(["sh", "-c", script, "gate", "sh", "-c", "echo served $$"], stdout=subprocess.PIPE,
                            text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)                  # still waiting: nothing started
    gate.touch()
    out, _ = proc.communicate(timeout=30)
    assert out == f"served {proc.pid}\n"        # exec'd: the server is the gate's own process


def test_a_mod_runs_without_the_recipe_s_env_as_the_runners_run_it(tmp_path):
    """Issue 39: the runners export a recipe's `env:` in the script they start after the mods, so a mod never saw
    it. The mod's run step, run by a real shell with the container's environment: the recipe's own variables are
    gone, the topology's and the node's stay."""
    path = checkout(tmp_path, ["mods/a"])
    mod_dir(tmp_path, "a")
    r = replace(load_recipe(path), env={"HF_HUB_OFFLINE": "1", "VLLM_X": "2", "NCCL_SOCKET_IFNAME": "eth9"})
    plan = make_plan(r, "cluster-tp2", NODES, {"eth_if": "enp1s0f0np0"})
    step = next(s for s in plan.steps if s.node == "spark2" and s.what == "mod a: run its run.sh")
    k = step.argv.index("bash")
    mod_dir_ = tmp_path / "workspace" / "mods" / "a"
    mod_dir_.mkdir(parents=True)
    (mod_dir_ / "run.sh").write_text('#!/bin/bash\necho "${HF_HUB_OFFLINE-unset} ${VLLM_X-unset} '
                                     '${NCCL_SOCKET_IFNAME-unset} $WORKSPACE_DIR"\n')
    argv = [a if a != "/workspace/mods/a" else str(mod_dir_) for a in step.argv[k:]]
    container_env = {"PATH": "/usr/bin:/bin", **dict(r.env), "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}
    out = subprocess.run(argv, cwd=tmp_path / "workspace", env=container_env, capture_output=True, text=True,
                         check=True).stdout
    assert out == f"unset unset enp1s0f0np0 {tmp_path / 'workspace'}\n"


def test_custom_ops_all_needs_the_b12x_kernels_to_persist_too():
    from sparkconsole.launch.lint_compile import compile_cache_mounted
    plan = make_plan(find_recipe("gpt-oss-120b"), "solo", NODES)
    assert compile_cache_mounted(plan)
    run = next(s for s in plan.steps if s.service == "spark1/server")
    i = run.argv.index(next(a for a in run.argv if str(a).endswith(":/root/.cache/b12x")))
    lacking = replace(run, argv=run.argv[:i - 1] + run.argv[i + 1:])
    assert not compile_cache_mounted(replace(plan, steps=tuple(lacking if s is run else s for s in plan.steps)))


def docker_run(plan, key="spark1/server") -> list[str]:
    return list(next(s for s in plan.steps if s.service == key).argv)


def test_the_runners_container_privileged_ulimit_caches_and_affinity():
    plan = make_plan(find_recipe("gpt-oss-120b"), "solo", NODES)
    argv = docker_run(plan)
    assert "--privileged" in argv and "--ipc=host" in argv and "--ulimit" in argv
    assert argv[argv.index("--ulimit") + 1] == "nofile=1048576:1048576"
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert envs[0] == "NCCL_IGNORE_CPU_AFFINITY=1"
    vols = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert vols == ['"${HF_HOME:-$HOME/.cache/huggingface}":/root/.cache/huggingface',
                    '"$HOME"/.cache/vllm:/root/.cache/vllm', '"$HOME"/.cache/flashinfer:/root/.cache/flashinfer',
                    '"$HOME"/.triton:/root/.triton', '"$HOME"/.tilelang:/root/.tilelang',
                    '"$HOME"/.cache/b12x:/root/.cache/b12x']      # the B12X images' kernels (issue 39)
    # the deliberate differences: a memory cap (an OOM-kill of the container instead of a frozen Spark), and no
    # restart policy (issue 39, docs/RECIPES_PARITY.md: an OOM-killed server would come back for the same memory)
    assert argv[argv.index("--memory") + 1] == "100g" == argv[argv.index("--memory-swap") + 1]
    assert not [a for a in argv if str(a).startswith("--restart")]
    mkdir = next(s for s in plan.steps if s.argv[:2] == ("mkdir", "-p"))
    assert plan.steps.index(mkdir) < plan.steps.index(next(s for s in plan.steps if s.service))

    lean = make_plan(find_recipe("gpt-oss-120b"), "solo", NODES, {"non_privileged": True, "no_cache_dirs": True})
    argv = docker_run(lean)
    assert "--privileged" not in argv and "--ipc=host" not in argv
    assert " ".join(argv).count("--cap-add IPC_LOCK --device /dev/infiniband --pids-limit 4096") == 1
    assert argv[argv.index("--shm-size") + 1] == "64g"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-v"] == [
        '"${HF_HOME:-$HOME/.cache/huggingface}":/root/.cache/huggingface']
    # the test bed's recipe: the runner's non-privileged set without the RDMA device this machine lacks
    tb = docker_run(make_plan(find_recipe("tiny-testbed"), "solo", NODES))
    assert "--privileged" not in tb and "--device" not in tb and "IPC_LOCK" in tb
    assert tb[tb.index("--ulimit") + 1] == "nofile=16384:16384" and tb[tb.index("--shm-size") + 1] == "1g"


def test_the_caches_expand_on_the_node_with_the_environment_the_runner_gives_it(tmp_path):
    """The mkdir step, run by a real shell as the runner sends it (node env before the command): HF_HOME from
    that environment, the compile caches under HOME."""
    plan = make_plan(find_recipe("gpt-oss-120b"), "solo", NODES)
    mkdir = next(s for s in plan.steps if s.argv[:2] == ("mkdir", "-p"))
    hf = tmp_path / "hf-of-the-node"
    line = f"HF_HOME={shlex.quote(str(hf))} " + mkdir.shell()
    subprocess.run(["sh", "-c", line], check=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert hf.is_dir() and (tmp_path / ".cache/vllm").is_dir() and (tmp_path / ".tilelang").is_dir()
    assert not (tmp_path / ".cache/huggingface").exists()


def test_cluster_ranks_meet_on_the_link_address_not_the_ssh_one():
    links = {"cluster_addresses": {"spark1": "10.10.0.1", "spark2": "10.10.0.2"}, "eth_if": "enp1s0f0np0"}
    plan = make_plan(find_recipe("gpt-oss-120b"), "cluster-tp2", NODES, links)
    head, worker = plan.server_args["spark1/server"], plan.server_args["spark2/worker"]
    for argv in (head, worker):
        assert argv[argv.index("--master-addr") + 1] == "10.10.0.1"
    assert ("VLLM_HOST_IP", "10.10.0.2") in plan.server_env["spark2/worker"]
    assert ("10.10.0.1", 29501) in plan.listens["spark1"]
    assert any("cluster link's addresses: spark1 10.10.0.1 on enp1s0f0np0" in n for n in plan.notes)
    # the endpoint operators use stays the address they reach the node at
    assert plan.endpoint == "http://192.168.100.10:8000"
    disagg = make_plan(replace(find_recipe("tiny-testbed"), topologies=("disagg",)), "disagg", NODES, links)
    assert ("VLLM_NIXL_SIDE_CHANNEL_HOST", "10.10.0.2") in disagg.server_env["spark2/decode"]


def test_choose_link_address():
    assert choose_link_address(["10.10.0.1/24"], "192.168.1.5") == "10.10.0.1"     # the management LAN: moved
    assert choose_link_address(["10.10.0.1/24", "10.10.0.9/24"], "10.10.0.9") == "10.10.0.9"   # already on it
    assert choose_link_address(["127.0.0.1/8"], "127.0.0.2") == "127.0.0.2"       # the test bed's loopback nodes
    assert choose_link_address([], "192.168.1.5") is None


async def test_link_address_read_from_the_node_with_ip():
    t = LocalTransport(NodeConfig(name="here", address="127.0.0.2", local=True))
    await t.connect()
    try:
        assert await link_address(t, "lo", "127.0.0.2") == "127.0.0.2"
        assert await link_address(t, "lo", "192.0.2.7") == "127.0.0.1"
        assert await link_address(t, "no-such-if0", "127.0.0.2") is None
    finally:
        await t.close()


async def test_an_unreachable_node_leaves_its_ranks_on_the_ssh_address_and_the_plan_says_so():
    from sparkconsole.launch.ifaces import plan_links
    from sparkconsole.nodes.transport import TransportError

    async def connect(node):
        raise TransportError(f"{node.name} unreachable: Connection refused")
    cluster = replace(NODES, nodes=tuple(replace(n, eth_if="enp1s0f0np0") for n in NODES.nodes))
    out, notes = await plan_links(find_recipe("gpt-oss-120b"), "cluster-tp2", cluster, {}, connect)
    assert "cluster_addresses" not in out
    assert notes == [f"{n}: link address not read ({n}: cannot read its link interfaces ({n} unreachable: "
                     f"Connection refused)); its ranks use {a}" for n, a in (("spark1", "192.168.100.10"),
                                                                         ("spark2", "192.168.100.11"))]
