"""benchmarks/runner_parity.py compares what it should: a stand-in fork (two recipes of our own and a tiny runner
written here, printing its launch script as run-recipe.py --dry-run does) gives one recipe planned the same and
one different, with the differing flag named; spelling alone (`--x=y`, `-tp`, flag order, `--host 0.0.0.0`)
is never a difference. The container (each node's docker run and mod steps, container_parity.py) is compared
against a tiny launch-cluster.sh of the stand-in fork: the same, a listed deliberate difference, or different."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("runner_parity", ROOT / "benchmarks" / "runner_parity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["runner_parity"] = mod
    spec.loader.exec_module(mod)
    return mod


rp = _load()

# The stand-in runner: fills the template as the format's runner does (str.format, tensor_parallel 1 in solo),
# prints the script between the runner's dry-run markers, and for a recipe named "drifts" adds a flag of its own.
STAND_IN = '''import sys, yaml
path = sys.argv[1]
r = yaml.safe_load(open(path))
params = {**(r.get("defaults") or {})}
if "--solo" in sys.argv:
    params["tensor_parallel"] = 1
cmd = r["command"].format(**params).rstrip().rstrip("\\\\").rstrip()
if r["name"] == "drifts":
    cmd += " --max-num-seqs 3"
print("=== Generated Launch Script ===")
print("#!/bin/bash")
for k, v in (r.get("env") or {}).items():
    print(f'export {k}="{v}"')
print(cmd)
print("")
print("=== What would be executed ===")
'''

RECIPE = '''recipe_version: "1"
name: {name}
container: parity-test-image
defaults:
  port: 8123
  host: 0.0.0.0
  tensor_parallel: 2
env:
  PARITY_VAR: "1"
command: |
  vllm serve org/parity-model \\
    --host {{host}} --port {{port}} \\
    -tp {{tensor_parallel}} \\
    --max-model-len=4096
'''


def test_normalisation_is_spelling_only():
    diffs, used = rp.compare(["vllm", "serve", "m", "--port", "1", "-tp", "2", "--host", "0.0.0.0", "--a_b"],
                             ["vllm", "serve", "m", "--a-b", "--tensor-parallel-size=2", "--port=1"], cluster=False)
    assert diffs == [] and used["eq"] == 2 and used["alias"] == 1 and used["host"] == 1
    diffs, _ = rp.compare(["vllm", "serve", "m", "--x", "1"], ["vllm", "serve", "m", "--x", "2", "--y"], cluster=False)
    assert diffs == ["--x: runner 1 | sparkconsole 2", "--y: runner (absent) | sparkconsole (set)"]
    # the multi-node flags and the executor are the launch's business on a cluster, never in solo
    mn = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"]
    assert rp.compare(["vllm", "serve", "m", "--distributed-executor-backend", "ray"], ["vllm", "serve", "m", *mn],
                      cluster=True)[0] == []
    assert rp.compare(["vllm", "serve", "m"], ["vllm", "serve", "m", "--nnodes", "2"], cluster=False)[0]


def test_a_stand_in_fork_gives_one_same_and_one_different(tmp_path, capsys):
    fork = tmp_path / "standin+spark-vllm-docker"
    (fork / "recipes").mkdir(parents=True)
    (fork / "run-recipe.py").write_text(STAND_IN)
    for name in ("agrees", "drifts"):
        (fork / "recipes" / f"{name}.yaml").write_text(RECIPE.format(name=name))
    out = tmp_path / "r.json"
    assert rp.main(["--mirror", str(fork), "--mode", "solo", "--jobs", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    results = {Path(r["recipe"]).stem: r for r in json.loads(out.read_text())["results"]}
    assert results["agrees"]["outcome"] == "same", results["agrees"]
    assert results["agrees"]["env_diffs"] == []
    assert results["drifts"]["outcome"] == "different"
    assert results["drifts"]["diffs"] == ["--max-num-seqs: runner 3 | sparkconsole (absent)"]
    assert "standin" in text and "--max-num-seqs: runner 3 | sparkconsole (absent)" in text


# --- the container: each node's docker run and mod steps ------------------------------------------------------

import container_parity as cp  # noqa: E402  (put on sys.path by runner_parity)

# The stand-in runner, printing also the launch-cluster.sh line its dry run shows ("What would be executed").
STAND_IN_LAUNCHING = STAND_IN + '''print()
parts = ["   ./launch-cluster.sh", "-t", r["container"]]
for m in r.get("mods") or []:
    parts += ["--apply-mod", m]
parts += [a for a in ("--solo", "-d") if a in sys.argv]
if "-n" in sys.argv:
    parts += ["-n", sys.argv[sys.argv.index("-n") + 1]]
parts += ["\\\\", "\\n      --launch-script", "/tmp/tmpXXXXXX.sh"]
print("2. launch-cluster.sh is called with:")
print(" ".join(parts))
print()
print("3. The launch script runs inside the container")
'''

# A tiny launch-cluster.sh that starts its containers as sparkconsole's plan does, less what sparkconsole does
# on purpose (memory cap, no --rm, labels, vLLM as the main process, HF_TOKEN by reference). Two images drift:
# drift-image adds a variable, reorder-image applies the mods in the opposite order.
LAUNCH_CLUSTER = r'''#!/bin/bash
IMAGE=vllm-node; MODS=(); NODES=""; SOLO=false
while [ $# -gt 0 ]; do
  case "$1" in
    -t) IMAGE=$2; shift ;; --apply-mod) MODS+=("$2"); shift ;; -n) NODES=$2; shift ;;
    --launch-script) SCRIPT=$2; shift ;; --solo) SOLO=true ;;
  esac
  shift
done
source "$(dirname "$0")/.env"
COMMON="--privileged --ulimit nofile=1048576:1048576 --ipc=host --gpus all -d --rm --network host --name vllm_node"
HF="${HF_HOME:-$HOME/.cache/huggingface}"
COMMON="$COMMON --entrypoint= -e NCCL_IGNORE_CPU_AFFINITY=1 -v $HF:/root/.cache/huggingface"
for c in .cache/vllm .cache/flashinfer .triton .tilelang; do COMMON="$COMMON -v $HOME/$c:/root/$c"; done
[ "$IMAGE" = drift-image ] && COMMON="$COMMON -e PARITY_EXTRA=1"
link() {
  [ $SOLO = true ] && return
  for v in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME TP_SOCKET_IFNAME UCX_NET_DEVICES OMPI_MCA_btl_tcp_if_include; do
    printf -- '-e %s=%s ' $v "$ETH_IF"
  done
  printf -- '-e VLLM_HOST_IP=%s -e NCCL_IB_HCA=%s -e NCCL_IB_DISABLE=0' "$1" "$IB_IF"
}
order=("${MODS[@]}")
[ "$IMAGE" = reorder-image ] && order=("${MODS[1]}" "${MODS[0]}")
mods() {   # $1: "" on this machine, else "ssh HOST"
  for m in "${order[@]}"; do
    n=$(basename "$m")
    $1 docker exec vllm_node mkdir -p /workspace/mods/$n
    $1 docker cp "$m/." vllm_node:/workspace/mods/$n/
    $1 docker exec vllm_node bash -c "\"export WORKSPACE_DIR=\\\$PWD && cd /workspace/mods/$n && ./run.sh\""
  done
}
docker ps --format '{{.Names}}' | grep -q vllm_node && exit 1
docker run $COMMON $(link "$LOCAL_IP") $IMAGE sleep infinity
mods ""
IFS=, read -ra ALL <<< "$NODES"
for w in "${ALL[@]}"; do
  [ "$w" = "$LOCAL_IP" ] && continue
  ssh -o BatchMode=yes "$w" "docker run $COMMON $(link "$w") $IMAGE sleep infinity"
  mods "ssh $w"
  ssh "$w" "docker exec -d vllm_node bash -c '/workspace/exec-script.sh >> /proc/1/fd/1 2>&1'"
done
docker cp "$SCRIPT" vllm_node:/workspace/exec-script.sh
docker exec -d vllm_node bash -c "/workspace/exec-script.sh >> /proc/1/fd/1 2>&1"
'''

CONTAINER_RECIPE = '''recipe_version: "1"
name: {name}
container: {image}
mods: [{mods}]
defaults:
  port: 8123
  tensor_parallel: 2
command: |
  vllm serve org/parity-model --port {{port}} -tp {{tensor_parallel}}
'''


def _launching_fork(tmp_path):
    fork = tmp_path / "standin+spark-vllm-docker"
    (fork / "recipes").mkdir(parents=True)
    (fork / "run-recipe.py").write_text(STAND_IN_LAUNCHING)
    (fork / "launch-cluster.sh").write_text(LAUNCH_CLUSTER)
    for mod in ("add-template", "second"):
        (fork / "mods" / mod).mkdir(parents=True)
        (fork / "mods" / mod / "run.sh").write_text("#!/bin/bash\ncp template.jinja \"$WORKSPACE_DIR\"/\n")
        (fork / "mods" / mod / "template.jinja").write_text("{{ messages }}\n")
    two = "mods/add-template, mods/second"
    for name, image, mods in (("agrees", "vllm-node", ""), ("with-mods", "vllm-node", two),
                              ("env-drifts", "drift-image", ""), ("reorders", "reorder-image", two)):
        (fork / "recipes" / f"{name}.yaml").write_text(CONTAINER_RECIPE.format(name=name, image=image, mods=mods))
    return fork


def _container(tmp_path, fork, name, mode):
    """The container comparison of one recipe in one mode, as runner_parity.main makes it."""
    root = tmp_path / f"{name}-{mode}"
    fork_dir = root / "forks" / "0"
    rp.export_fork(fork, fork_dir)
    (result,) = rp.check_recipe("standin", fork_dir, fork_dir / "recipes" / f"{name}.yaml",
                                [sys.executable, "-m", "sparkconsole"], rp.Sandbox(root / "sandbox"), root, [mode])
    assert result.outcome == "same", (result.outcome, result.diffs, result.runner, result.sparkconsole)
    return result.container


def test_the_container_is_classified_same_deliberate_or_different(tmp_path):
    fork = _launching_fork(tmp_path)
    agrees = _container(tmp_path, fork, "agrees", "solo")
    # everything sparkconsole does on purpose is listed with its rule, and nothing else differs
    assert agrees["verdict"] == "deliberate" and agrees["different"] == [], agrees
    assert agrees["deliberate"] == {"memory-cap": 2, "no-rm": 1, "labels": 1, "main-process": 1, "secret-ref": 1,
                                    "b12x-cache": 1}
    assert agrees["same"] >= 15 and not agrees["stray"] and not agrees["skipped"]
    drifts = _container(tmp_path, fork, "env-drifts", "solo")
    assert drifts["verdict"] == "different"
    assert drifts["different"] == ["node1 env PARITY_EXTRA: runner 1 | sparkconsole (absent)"]


def test_mods_compare_node_by_node_in_order(tmp_path):
    fork = _launching_fork(tmp_path)
    # cluster: the worker's docker run and mods come through the ssh stand-in, recorded under node2
    both = _container(tmp_path, fork, "with-mods", "cluster")
    assert both["nodes"] == 2 and both["different"] == [], both["different"]
    assert both["mods"] == ["add-template", "second"]
    assert [x for x in both["listed"] if x.split(" ", 1)[1].startswith("mod")] == []     # mods: all the same
    reorders = _container(tmp_path, fork, "reorders", "solo")
    assert reorders["different"] == ["node1 mods: runner second, add-template | sparkconsole add-template, second"]


def test_docker_run_aspects_and_rules():
    a = cp.run_aspects(["--privileged", "--ulimit=nofile=8:8", "-e", "A=1", "-e", "HF_TOKEN", "-v", "/h:/root/x:ro",
                        "--cap-add=IPC_LOCK", "--ipc=host", "-d", "img", "sleep", "infinity"])
    assert a == {"privileged": "yes", "ulimit nofile": "8:8", "env A": "1", "env HF_TOKEN": "(by reference)",
                 "volume /root/x": "/h (ro)", "cap-add": "IPC_LOCK", "ipc": "host", "d": "yes", "image": "img",
                 "command": "sleep infinity"}
    ctx = cp.Context("solo", {}, frozenset())
    assert cp.classify("memory", None, "100g", ctx) == "memory-cap"
    assert cp.classify("env VLLM_HOST_IP", "10.0.0.1", None, ctx) == "solo-link-env"
    assert cp.classify("env VLLM_HOST_IP", "10.0.0.1", None, cp.Context("cluster", {}, frozenset())) == "different"
    assert cp.classify("privileged", "yes", None, ctx) == "different"
    assert cp.classify("ulimit nofile", None, "1048576:1048576", ctx) == "newer-runner"
    assert cp.classify("ulimit nofile", None, "1024:1024", ctx) == "different"
    # the recipe's own container settings: listed only where the recipe asks for them
    own = cp.Context("solo", {"sparkconsole": {"container": {"init": True, "volumes": ["/models:/models:ro"]}}},
                     frozenset())
    assert cp.classify("init", None, "yes", own) == "init" and cp.classify("init", None, "yes", ctx) == "different"
    assert cp.classify("volume /models", None, "/models (ro)", own) == "recipe-volume"
    assert cp.classify("volume /models", None, "/models (ro)", ctx) == "different"
