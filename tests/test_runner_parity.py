"""benchmarks/runner_parity.py compares what it should: a stand-in fork (two recipes of our own and a tiny runner
written here, printing its launch script as run-recipe.py --dry-run does) gives one recipe planned the same and
one different, with the differing flag named; spelling alone (`--x=y`, `-tp`, flag order, `--host 0.0.0.0`)
is never a difference."""

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
