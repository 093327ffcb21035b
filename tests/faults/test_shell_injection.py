"""Hostile values reach the node as data, never as commands: plans, runner and guard fixes over the REAL sshd nodes.

Recipe placeholder values (model names), recipe env values, extra vLLM args, a secret's file path, node env values
and container names are set to strings with `;`, `$( )`, backticks, quotes, `&&`, `|`, `${IFS}` and newlines, each of
which would create a marker file if a shell ran it as a command. The nodes' `docker` is a recording shim (first on
PATH through the node's env): it writes the argv it got as JSON, and plays the container for a `bash -c` command by
running it, as the container would. The test then asserts that no marker exists, and that each node got exactly
the argv the plan holds, step by step, in order — and that the audit log holds the exact command of each step.
"""

from __future__ import annotations

import copy
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sparkconsole import audit, secrets
from sparkconsole.launch.plan import make_plan
from sparkconsole.launch.runner import Runner
from sparkconsole.launch.steps import NodeExpr
from sparkconsole.nodes.connect import make_transport
from sparkconsole.nodes.guard import evaluate_guards
from sparkconsole.nodes.samples import ContainerInfo
from sparkconsole.recipes import bundled_dir, parse_recipe
from sparkconsole.yamlsrc import load_text

pytestmark = pytest.mark.sshd

SHIM = """\
#!{python}
import json, os, subprocess, sys
argv = sys.argv[1:]
rec = {{"node": os.environ.get("SHIM_NODE"), "argv": argv}}
if argv[:1] == ["run"] and "--entrypoint=" in argv:
    cmd = argv[argv.index("--entrypoint=") + 2:]
    if cmd[:2] == ["bash", "-c"]:             # play the container: its shell runs the command text
        rec["container_out"] = subprocess.run(cmd, capture_output=True, text=True, cwd={cwd!r}).stdout
with open({log!r}, "a") as fh:
    fh.write(json.dumps(rec) + "\\n")
"""


def evil_values(marker: Path) -> list[str]:
    m = str(marker)
    return [f"a; touch {m}1", f"$(touch {m}2)", f"`touch {m}3`", f"x'; touch {m}4; echo '",
            f'x"; touch {m}5; echo "', f"x\ntouch {m}6", f"x && touch {m}7 #", f"|touch {m}8",
            f"${{IFS}}touch${{IFS}}{m}9", f"\\'$(touch {m}10)\\'"]


@pytest.fixture
def bed(sshd_live, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "docker-argv.jsonl"
    work = tmp_path / "work"          # a `touch relative` in any command would land here or in marker's dir
    work.mkdir()
    (shim_dir / "docker").write_text(SHIM.format(python=sys.executable, log=str(log), cwd=str(work)))
    (shim_dir / "docker").chmod(0o755)
    markers = tmp_path / "markers"
    markers.mkdir()
    return sshd_live, shim_dir, log, markers / "pwned", work


def read_log(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def no_marker(marker: Path, work: Path) -> None:
    assert list(marker.parent.iterdir()) == [], list(marker.parent.iterdir())
    assert list(work.iterdir()) == [], list(work.iterdir())


def hostile_recipe(evil: list[str], shell_command: bool):
    doc = copy.deepcopy(yaml.safe_load((bundled_dir() / "tiny-testbed.yaml").read_text()))
    doc["env"].update({f"EVIL_{i}": v for i, v in enumerate(evil)})
    doc["defaults"]["served_model_name"] = evil[0]
    doc["defaults"]["model_path"] = evil[1]
    doc["sparkconsole"]["secrets"] = {"HF_TOKEN": "file:/nonexistent/" + evil[2]}
    if shell_command:
        # Shell operators in the command: it runs under bash -c in the container, values quoted for that shell.
        doc["command"] = "echo {served_model_name} && echo {model_path} && echo {max_model_len}"
    return parse_recipe(load_text(yaml.safe_dump(doc, allow_unicode=True), "hostile.yaml"), "hostile")


def hostile_cluster(sshd_live, shim_dir: Path, evil: list[str]):
    cfg = sshd_live.cluster_config()
    nodes = tuple(replace(n, container=evil[3 + i] if i else evil[9],
                          env=(("PATH", f"{shim_dir}:/usr/local/bin:/usr/bin:/bin"), ("SHIM_NODE", n.name),
                               ("EVIL_NODE_ENV", evil[5])))
                  for i, n in enumerate(cfg.nodes))
    return replace(cfg, nodes=nodes)


@pytest.mark.fault("hostile recipe/model/env/container values through plan + runner over real sshd (solo, 2x-solo)")
@pytest.mark.parametrize("topology, shell_command", [("solo", False), ("solo", True), ("2x-solo", False)])
async def test_plan_and_runner_send_values_as_data(bed, topology, shell_command, ledger):
    sshd_live, shim_dir, log, marker, work = bed
    evil = evil_values(marker)
    ledger.bad_inputs(len(evil))
    cluster = hostile_cluster(sshd_live, shim_dir, evil)
    recipe = hostile_recipe(evil, shell_command)
    plan = make_plan(recipe, topology, cluster, {"extra_args": [evil[6], "--x", evil[7]]} if not shell_command
                     else {"extra_args": [evil[6]]})
    transports = {n.name: make_transport(n, cluster.ssh) for n in cluster.nodes}
    runner = Runner(cluster, transports)
    try:
        await runner.launch(plan, wait=False)
        launched = read_log(log)
        await runner.stop(plan)
    finally:
        for t in transports.values():
            await t.close()
    no_marker(marker, work)

    # Each node got exactly the plan's argv, step by step (the node's own caches expanded by its shell).
    home = str(Path.home())

    def on_node(a: str) -> str:
        return (a.replace('"${HF_HOME:-$HOME/.cache/huggingface}"', f"{home}/.cache/huggingface")
                .replace('"$HOME"', home)) if isinstance(a, NodeExpr) else a
    want = [{"node": s.node, "argv": [on_node(a) for a in s.argv[1:]]} for s in plan.steps if s.argv[0] == "docker"]
    got = [{"node": r["node"], "argv": r["argv"]} for r in launched]
    assert got == want
    assert len(want) + sum(s.argv[:2] == ("mkdir", "-p") for s in plan.steps) == len(plan.steps)
    stops = [{"node": s.node, "argv": list(s.argv[1:])} for svc in reversed(plan.services) for s in svc.stop_steps()]
    got_stops = [{"node": r["node"], "argv": r["argv"]} for r in read_log(log)[len(launched):]]
    assert sorted(map(json.dumps, got_stops)) == sorted(map(json.dumps, stops))
    names = {r["argv"][r["argv"].index("--name") + 1] for r in launched if "--name" in r["argv"]}
    assert names >= {n.container for n in cluster.nodes if n.name in plan.nodes}
    if shell_command:
        (out,) = [r["container_out"] for r in launched if "container_out" in r]
        # the container's shell printed the values themselves: nothing in them ran
        assert out == f"{evil[0]}\n{evil[1]}\n2048 {evil[6]}\n"

    # The audit log holds the exact command each change step sent (secret assignments masked), node by node.
    entries = audit.read()
    sent = [(s.node, secrets.redact(runner.node_prefix(s.node) + s.shell())) for s in plan.steps if s.change]
    assert [(e.node, e.command) for e in entries[:len(sent)]] == sent
    assert all(e.who and e.time > 0 for e in entries)


@pytest.mark.fault("hostile container name through a guard fix run over real sshd")
async def test_guard_fix_quotes_the_container_name(bed, ledger):
    sshd_live, shim_dir, log, marker, work = bed
    evil = evil_values(marker)
    cluster = hostile_cluster(sshd_live, shim_dir, evil)
    node = cluster.nodes[0]
    t = make_transport(node, cluster.ssh)
    runner = Runner(cluster, {node.name: t})
    try:
        for name in evil:
            ledger.bad_inputs()
            (cap,) = [g for g in evaluate_guards(None, None, [ContainerInfo(name=name, memory_limit_b=0)], name)
                      if g.key == "container_cap"]
            assert cap.status == "bad" and cap.fix
            r = await t.run(runner.node_prefix(node.name) + cap.fix)
            assert r.rc == 0, r
    finally:
        await t.close()
    no_marker(marker, work)
    got = [r["argv"] for r in read_log(log)]
    assert got == [["update", "--memory", "100g", "--memory-swap", "100g", name] for name in evil]


def test_the_shim_would_have_seen_an_injection(bed):
    """The check can fail: the same value, unquoted, does create the marker."""
    import subprocess
    _, _, _, marker, work = bed
    evil = evil_values(marker)
    subprocess.run("echo " + evil[0], shell=True, cwd=work, capture_output=True)
    assert (marker.parent / "pwned1").exists()
    subprocess.run("echo " + shlex.quote(evil[0]).replace("pwned1", "pwned0"), shell=True, cwd=work,
                   capture_output=True)
    assert not (marker.parent / "pwned0").exists()
