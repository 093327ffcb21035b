"""Every recipe of some registries through `recipe plan`: how many plan, and why the others are refused.

    .venv/bin/python benchmarks/recipes_corpus.py LOCATION [LOCATION …] [--nodes 2] [--show-refusals]
    .venv/bin/python benchmarks/recipes_corpus.py --smoke
    .venv/bin/python benchmarks/recipes_corpus.py LOCATION … --sparkrun /path/to/venv-with-sparkrun/bin/python

Each LOCATION is a registry's git repository on this machine (a clone of spark-arena/recipe-registry, of the
community registry, …); it is added through the product's own `registry add file://…` (the real git) into a
state directory of this run's own, so nothing of the operator's is touched. Every recipe is then planned as
`recipe plan` plans it, solo and as a cluster launch where the recipe allows each, on a cluster file of
`--nodes` nodes (default 2, the test bed's pair) — offline, with the link interface given. Each result is
"planned", or the refusal's reason (its problem, before the file's own details). Prints one table per recipe
version, and each refusal's line with --show-refusals. `--smoke` writes a few recipes of its own (v1, v2 with
and without a command, SGLang, an include, an override) into a registry it makes, and runs on those.

`--sparkrun PYTHON` (a Python ≥ 3.12 with sparkrun installed from PyPI) also renders each v2 vLLM recipe with
sparkrun itself (`Recipe.load`, `build_config_chain`, `render_command`) and compares its words with our plan's
vLLM argv (solo where the recipe allows it, else the cluster launch), printing each difference.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMOKE = {
    ".sparkrun/registry.yaml": "registries:\n  - name: smoke\n    recipes: recipes\n    mods: mods\n",
    "recipes/v2-vllm.yaml": 'recipe_version: "2"\nmodel: org/tiny\nruntime: vllm\ncontainer: vllm/vllm-openai:v0.12.0\n'
                            "defaults: {port: 8000, max_model_len: 4096, tensor_parallel: 2}\n"
                            "command: vllm serve {model} --port {port} -tp {tensor_parallel} "
                            "--limit-mm-per-prompt '{\"image\":2}' --max-model-len {max_model_len}\n",
    "recipes/v2-nocommand.yaml": 'recipe_version: "2"\nmodel: org/tiny\ncontainer: vllm/vllm-openai:v0.12.0\n'
                                 "defaults: {port: 8000, gpu_memory_utilization: 0.7, enable_prefix_caching: false}\n",
    "recipes/v2-sglang.yaml": 'recipe_version: "2"\nmodel: org/tiny\nruntime: sglang\ncontainer: lmsysorg/sglang\n'
                              "command: python3 -m sglang.launch_server --model-path {model}\n",
    "recipes/v2-include.yaml": 'recipe_version: "2"\ninclude: v2-vllm\ndefaults: {max_model_len: 8192}\n'
                               "overrides:\n  - when: {nodes: 1}\n    defaults: {max_model_len: 2048}\n",
    "recipes/4x-spark-cluster/v2-four.yaml": 'recipe_version: "2"\nmodel: org/big\ncontainer: vllm/vllm-openai\n'
                                              "min_nodes: 4\ndefaults: {tensor_parallel: 4}\n",
    "recipes/v1.yaml": 'recipe_version: "1"\nname: v1\ncontainer: vllm-node\nmodel: org/tiny\n'
                       "defaults: {port: 8000}\ncommand: vllm serve org/tiny --port {port}\n",
}


def smoke_registry(root: Path) -> Path:
    repo = root / "smoke-registry"
    for rel, text in SMOKE.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.email=b@x", "-c", "user.name=bench", "commit", "-qm", "smoke"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def cluster_file(n: int):
    from sparkconsole.config import ClusterConfig, NodeConfig
    nodes = tuple(NodeConfig(name=f"spark{i + 1}", address=f"192.168.100.{10 + i}", role="head" if i == 0 else "worker",
                             container="vllm_node") for i in range(n))
    return ClusterConfig(nodes=nodes, endpoints=(), source="cluster.yaml")


def reason(err: Exception) -> str:
    """The refusal's problem, without the file, line and values of one recipe."""
    from sparkconsole.errors import UserError
    if not isinstance(err, UserError):
        return f"TRACEBACK {type(err).__name__}"
    text = f"{err.field or '-'}: {err.problem}"
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\{[^}]*\}", "…", text)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return text[:110]


SPARKRUN_RENDER = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from sparkrun.core.recipe import Recipe
out = {}
for f in sys.argv[1:]:
    try:
        r = Recipe.load(f)
        chain = r.build_config_chain({"tensor_parallel": 1} if r.max_nodes == 1 else None)
        out[f] = {"runtime": r.runtime, "command": r.render_command(chain)}
    except Exception as e:
        out[f] = {"error": type(e).__name__ + ": " + str(e)[:200]}
print(json.dumps(out))
"""


def compare_sparkrun(python: str, planned: dict[str, list[str]]) -> None:
    """Our plans' vLLM argv beside sparkrun's rendered command, word for word."""
    import json
    import shlex
    res = subprocess.run([python, "-c", SPARKRUN_RENDER, *planned], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"sparkrun could not be run: {res.stderr.strip()[-300:]}")
        return
    theirs = json.loads(res.stdout)
    same, differ = 0, []
    for path, ours in planned.items():
        t = theirs.get(path, {})
        if not t.get("command") or not str(t.get("runtime", "")).startswith("vllm"):
            continue
        words = shlex.split(t["command"].replace("\\\n", " "))
        if words == ours:
            same += 1
        else:
            differ.append(f"{Path(path).name}: only ours {[w for w in ours if w not in words][:10]}, only "
                          f"sparkrun's {[w for w in words if w not in ours][:10]}")
    print(f"\nagainst sparkrun: {same} of {same + len(differ)} v2 vLLM commands word for word the same")
    for d in differ:
        print("  " + d[:300])


def run(locations: list[Path], nodes: int, show: bool, sparkrun: str | None = None) -> int:
    from sparkconsole.errors import UserError
    from sparkconsole.launch.plan import make_plan
    from sparkconsole.recipes import load_recipe
    from sparkconsole.recipes.registry import Registries

    regs = Registries.load()
    regs.removed = [e.name for e in regs.entries if e.default]         # this run's registries only
    regs.entries = [e for e in regs.entries if not e.default]
    t0 = time.perf_counter()
    for loc in locations:
        name = re.sub(r"[^A-Za-z0-9._-]", "-", loc.name.replace("+", "-"))
        regs.add(f"file://{loc.resolve()}", name=name, trusted=True)
    print(f"added {len(locations)} registr{'y' if len(locations) == 1 else 'ies'} with git in "
          f"{time.perf_counter() - t0:.2f} s")
    cluster = cluster_file(nodes)
    tables: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    files: collections.Counter[str] = collections.Counter()
    lines: list[str] = []
    argvs: dict[str, list[str]] = {}
    for rr in regs.recipes():
        try:
            recipe = load_recipe(rr.path, key=rr.qualified, registry=rr.registry)
        except UserError as err:
            files["unreadable"] += 1
            tables["?"][f"read: {reason(err)}"] += 1
            lines.append(f"{rr.qualified}: {err}")
            continue
        except Exception as err:  # noqa: BLE001 — a traceback is a finding, counted and shown
            tables["?"][reason(err)] += 1
            lines.append(f"{rr.qualified}: {type(err).__name__}: {err}")
            continue
        version = "v1" if not recipe.v2 else "v2"
        files[version] += 1
        for topology in ("solo", "cluster-tp2"):
            if topology not in recipe.topologies:
                continue
            try:
                plan = make_plan(recipe, topology, cluster, {"eth_if": "enp1s0f0np0"})
                tables[version][f"planned ({topology})"] += 1
                if recipe.v2:
                    argvs.setdefault(str(rr.path), list(next(iter(plan.server_args.values()))))
            except UserError as err:
                tables[version][f"refused ({topology}) {reason(err)}"] += 1
                lines.append(f"{rr.qualified} × {topology}: {err}")
            except Exception as err:  # noqa: BLE001
                tables[version][f"refused ({topology}) {reason(err)}"] += 1
                lines.append(f"{rr.qualified} × {topology}: {type(err).__name__}: {err}")
    print(f"recipe files: {dict(files)}; cluster file: {nodes} nodes")
    for version, counts in sorted(tables.items()):
        total = sum(counts.values())
        planned = sum(v for k, v in counts.items() if k.startswith("planned"))
        print(f"\n{version}: {planned} of {total} plans planned")
        print(f"| {'result':<100} | plans |")
        print(f"|{'-' * 102}|-------|")
        for k, v in sorted(counts.items(), key=lambda kv: (not kv[0].startswith("planned"), -kv[1], kv[0])):
            print(f"| {k:<100} | {v:>5} |")
    if show:
        print("\nrefusals:")
        for line in lines:
            print("  " + line)
    if sparkrun:
        compare_sparkrun(sparkrun, argvs)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("locations", nargs="*", type=Path, help="registries' git repositories on this machine")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--show-refusals", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a few recipes of this script's own")
    ap.add_argument("--sparkrun", metavar="PYTHON", help="a Python with sparkrun installed: compare its commands")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="recipes-corpus-") as tmp:
        os.environ["SPARKCONSOLE_STATE_DIR"] = str(Path(tmp) / "state")
        locations = [smoke_registry(Path(tmp))] if args.smoke else args.locations
        if not locations:
            ap.error("give registries' locations, or --smoke")
        return run(locations, args.nodes, args.show_refusals or args.smoke, args.sparkrun)


if __name__ == "__main__":
    raise SystemExit(main())
