"""The `sparkconsole` command line itself: what it imports before answering, the help table, and global
options accepted after the command as well as before it. (Start-up speed is printed by
benchmarks/cli_start.py; here only the import set is asserted.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole import cli

ROOT = Path(__file__).resolve().parent.parent

# What an answer that needs none of it must not import: the TUI, the SSH and HTTP stacks, YAML, asyncio,
# and the product's own layers.
HEAVY = ("textual", "rich", "asyncssh", "httpx", "aiohttp", "yaml", "asyncio", "sparkconsole.config",
         "sparkconsole.nodes", "sparkconsole.launch", "sparkconsole.sim", "sparkconsole.tui", "sparkconsole.bench",
         "sparkconsole.serving")


def imported(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "sparkconsole", *argv], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    mods = {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    mods.discard("package")      # the header line
    return p, mods


def heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("argv, rc, says", [
    (("--version",), 0, "sparkconsole 0.1.0"),
    (("--help",), 0, "recipe"),
    (("nosuch",), 2, "invalid choice"),
    (("status", "--bogus"), 2, "unrecognized arguments: --bogus"),
    (("status", "--timeout", "x"), 2, "invalid float value"),
    (("recipe", "plan"), 2, "required: recipe"),
    (("recipe", "plan", "x", "--port", "y"), 2, "invalid int value"),
    (("demo", "--speed"), 2, "expected one argument"),
    (("bench", "report", "--format", "pdf"), 2, "invalid choice"),
    (("console", "--replay"), 2, "expected one argument"),
])
def test_version_help_and_argument_errors_import_nothing_heavy(argv, rc, says):
    p, mods = imported(*argv)
    assert p.returncode == rc, p.stderr[-2000:]
    out = p.stdout + "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith("import time:"))
    assert says in out
    assert "sparkconsole.cli" in mods        # the measurement saw the product start
    assert heavy(mods) == [], f"{' '.join(argv)} imported {heavy(mods)[:12]}"


def test_an_invalid_choice_is_still_checked_and_listed():
    # The lazily imported choices: checked against the real tuples, listed in the error.
    p, _ = imported("recipe", "plan", "x", "--topology", "bogus")
    assert p.returncode == 2 and "invalid choice: 'bogus'" in p.stderr and "'cluster-tp2'" in p.stderr
    p, _ = imported("demo", "--router", "bogus")
    assert p.returncode == 2 and "'litellm-least-busy'" in p.stderr


def test_help_table_agrees_with_the_modules():
    full = cli.build_parser(all_commands=True)
    sub = cli._subparser_actions(full)[0]
    helps = {a.dest: a.help for a in sub._choices_actions}
    present = [n for n in cli.COMMANDS if n in helps]
    assert set(present) == set(cli.HELP), "add each command's one-line help to cli.HELP (and drop stale ones)"
    assert {n: cli.HELP[n] for n in present} == {n: helps[n] for n in present}


def test_help_lists_every_command_in_order(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    positions = [out.index(f"    {name} ") for name in cli.COMMANDS if name in cli.HELP]
    assert positions == sorted(positions)


@pytest.fixture
def cluster_file(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("nodes:\n  - {name: alpha, address: 192.168.100.10}\n  - {name: beta, address: 192.168.100.11}\n")
    return str(p)


@pytest.mark.parametrize("where", ["before", "after", "after-nested"])
def test_cluster_option_before_or_after_the_command(cluster_file, capsys, where):
    plan = ["recipe", "plan", "gpt-oss-120b", "-T", "2x-solo"]
    argv = {"before": ["--cluster", cluster_file, *plan],
            "after": ["recipe", "--cluster", cluster_file, *plan[1:]],
            "after-nested": [*plan, f"--cluster={cluster_file}"]}[where]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "[alpha 192.168.100.10]" in out and "[beta 192.168.100.11]" in out


def test_status_json_cluster_after_the_command(tmp_path):
    # The issue's own words: `sparkconsole status --json --cluster F`. F names this machine as a local node.
    f = tmp_path / "local.yaml"
    f.write_text("nodes:\n  - {name: here, address: 127.0.0.1, local: true}\nagent: {interval_s: 0.2}\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "sparkconsole", "status", "--json", "--cluster", str(f)],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["cluster"] == str(f) and [n["name"] for n in doc["nodes"]] == ["here"]
    assert doc["nodes"][0]["state"] == "LIVE"


def test_a_bad_cluster_file_after_the_command_is_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - name: a\n    address: spark.local\n")
    p = subprocess.run([sys.executable, "-m", "sparkconsole", "status", "--cluster", str(bad)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "c.yaml:3" in p.stderr and "address" in p.stderr


def test_version_after_the_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["status", "--version"])
    assert exc.value.code == 0 and "sparkconsole 0.1.0" in capsys.readouterr().out


def test_no_command_opens_the_console_with_global_options(cluster_file, monkeypatch):
    # `sparkconsole --cluster F` (no command) runs the console command on F; its run() is swapped for a
    # recorder here because the real one takes over the terminal.
    import sparkconsole.commands.console as console_mod
    seen = {}
    monkeypatch.setattr(console_mod, "run", lambda args: seen.setdefault("cluster", args.cluster) and 0)
    assert cli.main(["--cluster", cluster_file]) == 0
    assert seen == {"cluster": cluster_file}


def test_status_of_local_nodes_reads_them_without_the_ssh_stack(tmp_path):
    """asyncssh (~0.15 s to import) is for remote nodes only: a local cluster's `status --json` reads the node
    (the simulator and the demo go the same way) and never imports it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes:\n  - {name: here, address: 127.0.0.1, local: true}\nendpoints: []\n")
    p, mods = imported("--cluster", str(cfg), "status", "--json", "--timeout", "20")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "sparkconsole.nodes.monitor" in mods and "sparkconsole.nodes.transport" in mods
    assert not [m for m in mods if m == "asyncssh" or m.startswith("asyncssh.")]
    assert "sparkconsole.nodes.ssh" not in mods


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`sparkconsole recipe plan … | head`: the pipe closes before the plan is written; the command ends quietly
    with SIGPIPE's status, as cat would."""
    p = subprocess.Popen([sys.executable, "-m", "sparkconsole", "recipe", "plan", "gpt-oss-120b", "-T", "solo",
                          "--offline"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == 141 and "Traceback" not in err, err
