"""The newcomer walk of docs/UX.md, repeatable: the demo (gpt-oss-120b as 2x solo behind the router) in the console,
driven through Textual's Pilot at 80×24, 100×30, 160×48 and 220×60, one SVG per view and size into screenshots/,
and the text of every view printed, to be read as a first-time operator reads it.

    .venv/bin/python scripts/ux_walk.py [--out screenshots] [--sizes 80x24,100x30,160x48,220x60]
    .venv/bin/python scripts/ux_walk.py --sshd [--out DIR]   # the test bed's OpenSSH nodes, in tmux (text only)

`--sshd`: two OpenSSH nodes on 127.0.0.2 and .3 (tests/testbed/sshd.py, this machine's agent read over real SSH),
their cluster file, and the real `sparkconsole console` in a tmux pane of each size, driven with send-keys as an
operator types and read back with capture-pane: one text file per view and size, every view printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, keys from the dashboard): what a newcomer tries first
VIEWS = (
    ("dashboard", ()),
    ("events", ("e",)),
    ("filter-no-match", ("slash", "z", "z", "z")),
    ("palette-swap", ("ctrl+p", "s", "w", "a", "p")),
    ("recipes", ("2",)),
    ("bench-setup", ("3", "b")),
    ("replay", ("left_square_bracket",)),
)


async def walk(out: Path, sizes: list[tuple[int, int]]) -> None:
    from sparkconsole.commands import demo
    from sparkconsole.sim.cluster import Serving, SimCluster
    from tests.helpers import cancel_tasks
    from tests.screen import screen_text

    sim = SimCluster(serving=Serving(topology="2x-solo", recipe=demo.DEMO_RECIPE), load_speedup=demo.DEMO_LOAD_SPEEDUP)
    await sim.start_nodes()
    tasks: list[asyncio.Task] = []
    try:
        app = demo.console_app(sim, argparse.Namespace(load=2, duration=None), tasks)
        async with app.run_test(size=sizes[0]) as pilot:
            deadline = time.monotonic() + 240
            while not (all(e.is_set() for e in sim.ready.values()) and app.serving is not None
                       and all(em.latest is not None for em in app.serving.endpoints.values())):
                assert time.monotonic() < deadline, "the demo did not serve"
                await pilot.pause(0.2)
            await pilot.pause(12)           # the recorder holds some history to scrub back through
            for w, h in sizes:
                await pilot.resize_terminal(w, h)
                for name, keys in VIEWS:
                    while len(app.screen_stack) > 1:
                        app.pop_screen()
                    await app.action_show("dashboard")
                    if app._scrub_back:
                        await app.action_scrub(app._scrub_back)      # back to live
                    app.dashboard.action_clear_filter()      # the Events pane closed too
                    await pilot.pause(0.3)
                    await pilot.press(*keys)
                    await pilot.pause(1.5)
                    path = out / f"walk-{name}-{w}x{h}.svg"
                    path.write_text(app.export_screenshot(title=f"sparkconsole demo: {name} {w}x{h}"))
                    print(f"===== {name} {w}x{h} ({path.name})\n{screen_text(app)}\n", flush=True)
                    if name == "replay":
                        await pilot.press("right_square_bracket")
                        await pilot.pause(0.5)
            await app.action_quit()
    finally:
        await cancel_tasks(tasks)
        await sim.stop()


# (name, keys sent with tmux send-keys from the dashboard): the SSH walk's views
SSHD_VIEWS = (
    ("dashboard", ()),
    ("events", ("e",)),
    ("guard-fix", ("f",)),
    ("palette-guard", ("C-p", "guard")),
    ("help", ("?",)),
    ("recipes", ("2",)),
    ("logs", ("4",)),
)


def walk_sshd(out: Path, sizes: list[tuple[int, int]]) -> None:
    import shlex
    import shutil
    import subprocess
    import uuid

    from tests.testbed.sshd import start_sshd_nodes
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed")
    root = Path(tempfile.mkdtemp(prefix="sparkconsole-walk-sshd-"))
    nodes = start_sshd_nodes(root / "sshd", ("127.0.0.2", "127.0.0.3"))
    try:
        cluster = root / "sparkconsole.yaml"
        cluster.write_text("nodes:\n" + "".join(
            f"  - name: spark{i + 1}\n    address: {n.address}\n"
            f"    ssh: {{user: {n.user}, port: {n.port}, identity: {n.identity}}}\n" for i, n in enumerate(nodes))
            + f"ssh: {{known_hosts: {nodes.known_hosts}}}\n")
        console = Path(sys.executable).parent / "sparkconsole"
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        for w, h in sizes:
            name = f"walk-{uuid.uuid4().hex[:8]}"
            tmux = ["tmux", "-L", name]
            cmd = f"{shlex.quote(str(console))} --cluster {shlex.quote(str(cluster))} console"
            subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-s", name, "-x", str(w), "-y", str(h),
                            cmd], check=True, env=env)
            try:
                def screen(tmux: list[str] = tmux, name: str = name) -> str:
                    return subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True,
                                          text=True).stdout
                deadline = time.monotonic() + 60
                while "LIVE" not in screen():
                    assert time.monotonic() < deadline, f"the console did not come up:\n{screen()}"
                    time.sleep(0.3)
                time.sleep(3)
                for view, keys in SSHD_VIEWS:
                    for k in keys:
                        subprocess.run([*tmux, "send-keys", "-t", name, *([k] if len(k) == 1 or k.startswith("C-")
                                                                          else list(k))], check=True)
                        time.sleep(0.3)
                    time.sleep(1.5)
                    text = screen()
                    (out / f"sshd-{view}-{w}x{h}.txt").write_text(text)
                    print(f"===== sshd {view} {w}x{h}\n{text}", flush=True)
                    for k in ("Escape", "Escape", "1", "Escape"):
                        subprocess.run([*tmux, "send-keys", "-t", name, k], check=True)
                        time.sleep(0.3)
                subprocess.run([*tmux, "send-keys", "-t", name, "q"], check=True)
                time.sleep(1)
            finally:
                subprocess.run([*tmux, "kill-server"], capture_output=True)
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "screenshots"))
    ap.add_argument("--sizes", default="80x24,100x30,160x48,220x60")
    ap.add_argument("--sshd", action="store_true", help="walk the console on two OpenSSH test nodes, in tmux")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    out = Path(args.out).resolve()
    os.environ.setdefault("SPARKCONSOLE_STATE_DIR", tempfile.mkdtemp(prefix="sparkconsole-walk-"))
    os.chdir(tempfile.mkdtemp(prefix="sparkconsole-walk-cwd-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.sshd:
        walk_sshd(out, sizes)
        return 0
    asyncio.run(walk(out, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
