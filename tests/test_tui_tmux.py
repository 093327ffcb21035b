"""The console driven as an operator drives it: the real `sparkconsole` command in a real terminal (tmux),
keys sent, the screen read back with capture-pane. Nodes replay a recorded session (real H100 readings)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

RECORDING = Path(__file__).parent / "fixtures" / "agent-h100-load.jsonl"
SPARKCONSOLE = Path(sys.executable).parent / "sparkconsole"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/test installs it)")


class Tmux:
    """A private tmux server (its own socket, -L): another tmux beside it cannot resize or share its window."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cmd = ["tmux", "-L", name]

    def send(self, *keys: str) -> None:
        subprocess.run([*self.cmd, "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        r = subprocess.run([*self.cmd, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        return r.stdout

    def alive(self) -> bool:
        return subprocess.run([*self.cmd, "has-session", "-t", self.name], capture_output=True).returncode == 0

    def wait(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.screen()
            if text in shown:
                return shown
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared; the screen shows:\n{self.screen()}")


def terminal_env() -> dict[str, str]:
    """This process's environment for the terminal, less COLUMNS/LINES: pytest-xdist workers carry 80x24 there,
    and Textual would take those over the 200x60 that tmux gives the pane."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color"}


@pytest.fixture
def console(tmp_path):
    cluster = tmp_path / "sparkconsole.yaml"
    cluster.write_text("nodes:\n  - {name: spark1, address: 127.0.0.1}\n  - {name: spark2, address: 127.0.0.1}\n"
                       "endpoints: []\n")
    done = tmp_path / "exit-code"
    name = f"sc-{uuid.uuid4().hex[:8]}"
    cmd = (f"SPARKCONSOLE_STATE_DIR={shlex.quote(str(tmp_path / 'state'))} "
           f"{shlex.quote(str(SPARKCONSOLE))} --cluster {shlex.quote(str(cluster))} console "
           f"--replay {shlex.quote(str(RECORDING))} --replay-interval 0.25; echo $? > {shlex.quote(str(done))}")
    t = Tmux(name)
    subprocess.run([*t.cmd, "-f", "/dev/null", "new-session", "-d", "-s", name, "-x", "200", "-y", "60", cmd],
                   check=True, env=terminal_env())
    t.done = done
    try:
        yield t
    finally:
        subprocess.run([*t.cmd, "kill-server"], capture_output=True)


def test_operator_session_in_a_real_terminal(console):
    shown = console.wait("LIVE", timeout=30)
    assert "spark1" in shown and "spark2" in shown
    assert "GPU " in shown and "slowdown 89°C" in shown          # the recording's NVML threshold
    assert "q Quit" in shown                                      # the footer shows the keys
    console.send("?")
    console.wait("Keys")
    assert "command palette" in console.screen()
    console.send("Escape")
    time.sleep(0.5)
    console.send("2")
    console.wait("Recipes")
    console.send("3")
    console.wait("decode")
    console.send("1")
    console.wait("slowdown")
    console.send("/")
    console.wait("filter nodes by name")
    console.send("2")
    time.sleep(0.8)
    shown = console.screen()
    assert "╭─ spark2" in shown and "╭─ spark1" not in shown     # filtered to spark2
    console.send("Escape")
    time.sleep(0.5)           # a lone ESC is told from an escape sequence by a pause, as with a person typing
    console.wait("╭─ spark1")
    console.send("r")                                             # restart asks first
    console.wait("docker restart vllm_node")
    console.send("n")
    console.wait("cancelled")
    console.send("q")
    deadline = time.monotonic() + 15
    while not console.done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert console.done.read_text().strip() == "0", console.screen()
