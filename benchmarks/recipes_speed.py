"""Recipes from registries, timed: `recipe list` and `recipe plan` with many recipes, the recipes screen's search
per keystroke, and `registry update` of registries that did not change.

    .venv/bin/python benchmarks/recipes_speed.py [--recipes 500] [--registries 5]
    .venv/bin/python benchmarks/recipes_speed.py --smoke

Makes `--registries` git repositories of its own (file://, a sparkrun manifest, recipes in model-family
sub-folders, one mod each), holding `--recipes` v2 recipes together, and adds them through `registry add` into a
state directory of this run's own. Then, each as a user meets it:
- `sparkconsole recipe list` as a command (a new process: interpreter start included), first (no catalog cache)
  and again; targets: within 1 s;
- `sparkconsole recipe plan @REGISTRY/NAME` as a command, offline (no node is asked); target: within 0.5 s;
- the search the recipes screen runs for each key typed (recipes/catalog.py `search` over every recipe and the
  list lines it draws), per key; target: within 50 ms;
- `registry update` with nothing changed upstream: the git objects in each clone before and after (nothing
  fetched), and its time.
Figures only; nothing here fails on a figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FAMILIES = ("qwen3", "glm", "minimax", "nemotron", "gemma", "deepseek", "llama", "mistral")
RECIPE = '''recipe_version: "2"
model: org/{family}-{i}b
runtime: vllm
container: vllm/vllm-openai:v0.12.0
description: {family} {i}B, recipe {n} of registry {r}
min_nodes: 1
mods: [fix-{r}]
metadata: {{model_params: {i}B, model_dtype: bf16}}
defaults: {{port: 8000, host: 0.0.0.0, tensor_parallel: 1, max_model_len: 32768, gpu_memory_utilization: 0.7}}
env: {{VLLM_X: "{{config.max_model_len}}"}}
command: |
  vllm serve {{model}} --host {{host}} --port {{port}} -tp {{tensor_parallel}} --max-model-len {{max_model_len}} \\
    --gpu-memory-utilization {{gpu_memory_utilization}} --limit-mm-per-prompt '{{"image":2}}'
'''


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=b@b", "-c", "user.name=bench", *args], cwd=repo, check=True,
                   capture_output=True)


def make_registries(root: Path, recipes: int, registries: int) -> list[Path]:
    out = []
    for r in range(registries):
        repo = root / f"reg{r}"
        (repo / ".sparkrun").mkdir(parents=True)
        (repo / ".sparkrun/registry.yaml").write_text(f"registries:\n  - name: sec{r}\n    recipes: recipes\n"
                                                      f"    mods: mods\n")
        (repo / "mods" / f"fix-{r}").mkdir(parents=True)
        (repo / "mods" / f"fix-{r}" / "run.sh").write_text("true\n")
        for n in range(r, recipes, registries):
            family = FAMILIES[n % len(FAMILIES)]
            d = repo / "recipes" / family / "vllm"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{family}-{n}-vllm.yaml").write_text(RECIPE.format(family=family, i=1 + n % 70, n=n, r=r))
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "recipes")
        out.append(repo)
    return out


def timed_cli(*argv: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sparkconsole", *argv], capture_output=True, text=True, cwd=ROOT,
                       env=os.environ.copy(), timeout=120)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.strip()[-400:]}")
    return dt, p.stdout


def objects(clone: Path) -> int:
    return sum(1 for p in (clone / ".git" / "objects").rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", type=int, default=500)
    ap.add_argument("--registries", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="50 recipes in 2 registries, one run of each")
    args = ap.parse_args()
    if args.smoke:
        args.recipes, args.registries = 50, 2
    with tempfile.TemporaryDirectory(prefix="recipes-speed-") as tmp:
        root = Path(tmp)
        os.environ["SPARKCONSOLE_STATE_DIR"] = str(root / "state")
        os.environ["XDG_CONFIG_HOME"] = str(root / "xdg")
        repos = make_registries(root, args.recipes, args.registries)
        from sparkconsole.recipes.registry import Registries
        regs = Registries.load()
        regs.removed = [e.name for e in regs.entries if e.default]
        regs.entries = [e for e in regs.entries if not e.default]
        t0 = time.perf_counter()
        for i, repo in enumerate(repos):
            regs.add(f"file://{repo}", name=f"reg{i}", trusted=True)
        print(f"{args.recipes} recipes in {args.registries} registries, added with git in "
              f"{time.perf_counter() - t0:.2f} s")
        cluster = root / "cluster.yaml"
        cluster.write_text("nodes:\n  - {name: spark1, address: 192.168.100.10}\n"
                           "  - {name: spark2, address: 192.168.100.11}\n")

        first, out = timed_cli("recipe", "list")
        listed = sum(1 for line in out.splitlines() if line.startswith("@"))
        again = [timed_cli("recipe", "list")[0] for _ in range(1 if args.smoke else 3)]
        print(f"recipe list ({listed} registry recipes listed): first {first:.3f} s, then median "
              f"{statistics.median(again):.3f} s (target ≤ 1 s)")
        target = f"@reg0/{FAMILIES[0]}/vllm/{FAMILIES[0]}-0-vllm"
        plans = [timed_cli("--cluster", str(cluster), "recipe", "plan", target, "-T", "solo", "--offline")[0]
                 for _ in range(1 if args.smoke else 3)]
        print(f"recipe plan {target}: median {statistics.median(plans):.3f} s (target ≤ 0.5 s)")

        from rich.text import Text

        from sparkconsole.recipes.catalog import catalog
        entries = [e for e in catalog() if e.registry.startswith("reg")]
        per_key = []
        typed = ""
        for ch in "qwen3 12b fp":
            typed += ch
            t0 = time.perf_counter()
            words = typed.split()
            hits = [e for e in entries if all(e.matches(w) for w in words)]
            lines = []
            for e in hits:                       # the line the recipes screen draws for each
                line = Text("· ", no_wrap=True, overflow="ellipsis")
                line.append(e.key, style="bold")
                line.append(f"  {e.model}", style="dim")
                lines.append(line)
            per_key.append((time.perf_counter() - t0) * 1000)
        print(f"search across {len(entries)} recipes, per key: median {statistics.median(per_key):.2f} ms, "
              f"worst {max(per_key):.2f} ms (target ≤ 50 ms)")

        clones = [regs.clone_dir(f"reg{i}") for i in range(len(repos))]
        before = [objects(c) for c in clones]
        t0 = time.perf_counter()
        lines = Registries.load().update()
        dt = time.perf_counter() - t0
        after = [objects(c) for c in clones]
        print(f"registry update, nothing changed: {dt:.2f} s for {len(clones)} registries; git objects before "
              f"{sum(before)}, after {sum(after)} ({'nothing fetched' if before == after else 'FETCHED'}); "
              + "; ".join(lines[:2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
