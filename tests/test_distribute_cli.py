"""`sparkconsole model` / `image` on this machine as the one node (no cluster file): real cache directories,
one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from sparkconsole.cli import main
from tests.helpers import error_lines


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snap = hub / "models--org--m" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (hub / "models--org--m" / "blobs").mkdir()
    (hub / "models--org--m" / "blobs" / "b1").write_bytes(b"x" * 1000)
    (snap / "config.json").symlink_to("../../blobs/b1")
    half = hub / "models--org--half" / "snapshots" / "abc"
    half.mkdir(parents=True)
    (half / "model.safetensors").symlink_to("../../blobs/missing")      # a download cut short
    return hub


def test_model_list_json_and_text(here, capsys):
    assert main(["model", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["hub"] == str(here)
    assert {m["model"]: (m["size"], m["complete"]) for m in row["models"]} == {"org/m": (1000, True),
                                                                               "org/half": (0, False)}
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "org/m" in out and "complete" in out and "INCOMPLETE" in out


def test_model_rm_removes_from_the_named_node(here, capsys):
    assert main(["model", "list", "--json"]) == 0
    node = json.loads(capsys.readouterr().out)[0]["node"]
    assert main(["model", "rm", "org/m", "--node", node, "--yes"]) == 0
    assert "removed org/m" in capsys.readouterr().out and not (here / "models--org--m").exists()


@pytest.mark.parametrize("argv, message", [
    (["model", "pull", "not a model", "--yes"], "MODEL: bad model id 'not a model' — fix:"),
    (["model", "rm", "org/m", "--yes"], "--node: model rm needs the nodes to remove it from — fix:"),
    (["model", "pull", "org/m", "--node", "nosuch", "--yes"], "--node: unknown node 'nosuch' — fix: use one of:"),
    (["image", "pull", "a b", "--yes"], "IMAGE: bad image name 'a b' — fix:"),
    (["model", "pull", "org/m"], "--yes: this changes the nodes and there is no terminal to confirm on"),
])
def test_bad_input_is_one_line(here, capsys, argv, message):
    assert main(argv) == 2
    # the line saying where the cluster came from (clusterfile.py), then the error: one line
    err = "".join(ln + "\n" for ln in error_lines(capsys.readouterr().err))
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_paths_and_links_a_node_reports_are_checked():
    from sparkconsole.distribute.nodescript import check_link, check_rel
    from sparkconsole.errors import UserError
    assert check_link("snapshots/abc/config.json", "../../blobs/b1") == "../../blobs/b1"
    for rel, target in (("snapshots/abc/x", "/etc/passwd"), ("snapshots/abc/x", "../../../../etc/passwd"),
                        ("snapshots/abc/x", "")):
        with pytest.raises(UserError, match="leaves the model's directory"):
            check_link(rel, target)
    for rel in ("../x", "/abs", "a/../../b", ""):
        with pytest.raises(UserError, match="unsafe path"):
            check_rel(rel)


def test_progress_rate_and_eta():
    from sparkconsole.distribute.progress import Progress
    now = [100.0]
    p = Progress("m → spark2", total=4 * 1024**3, started=100.0, clock=lambda: now[0])
    assert p.eta_s is None and "ETA --:--" in p.line()
    now[0] = 110.0
    p.add(1024**3)                                   # 1 GiB in 10 s
    assert p.rate == pytest.approx(1024**3 / 10) and p.eta_s == pytest.approx(30.0)
    assert "25.0%" in p.line() and "1.0 GiB/4.0 GiB" in p.line() and "ETA 00:30" in p.line()


def test_from_node_is_added_to_the_nodes_it_reads():
    from sparkconsole.commands.model import picked
    from sparkconsole.config import ClusterConfig, NodeConfig
    c = ClusterConfig(nodes=tuple(NodeConfig(name=f"s{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)), endpoints=())
    assert [n.name for n in picked(c, ["s2"], "s1")] == ["s2", "s1"]
    assert [n.name for n in picked(c, None, "s1")] == ["s1", "s2", "s3"]
    assert [n.name for n in picked(c, ["s3,s2"])] == ["s3", "s2"]


def test_image_commands_exit_1_when_docker_cannot_be_reached(here, capsys, monkeypatch, tmp_path):
    # The node answers, its docker does not (no engine at that socket): every image command says so in its row
    # and in its exit status, with or without an IMAGE (issue 39: `image list` alone exited 0).
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    assert main(["image", "list"]) == 1
    out = capsys.readouterr().out
    assert ": ERROR " in out and "no-engine.sock" in out
    assert main(["image", "list", "vllm-node"]) == 1
    assert ": ERROR " in capsys.readouterr().out
    assert main(["model", "list", "--json"]) == 0          # the node itself answers: its cache is listed
    node = json.loads(capsys.readouterr().out)[0]["node"]
    assert main(["image", "rm", "vllm-node", "--node", node, "--yes"]) == 1
    assert "no-engine.sock" in capsys.readouterr().out
