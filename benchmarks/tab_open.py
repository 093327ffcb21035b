"""A browser tab's time to its first node reading: `serve` on its own (the tab's console connects to every node
and starts its agents) against `record --serve` (the tab's console attaches to the collector's current state).

    .venv/bin/python benchmarks/tab_open.py [--runs 3]

Two real sshd nodes on loopback (tests/testbed/sshd.py), Debian's chromium driven by Playwright (as
tests/test_serve.py). Timed from page.goto to the first node reading in the terminal's frames: a temperature
(°C) where the node has a GPU, else its host memory ("GiB free"; the test machine has no GPU). Prints one JSON
object: each run's seconds and the median per mode. No assertion: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port  # noqa: E402
from tests.test_serve import CHROMIUM, CHROMIUM_ARGS, Screen  # noqa: E402
from tests.test_status import cluster_yaml  # noqa: E402
from tests.testbed.sshd import start_sshd_nodes  # noqa: E402

READING = re.compile(r"\b\d{2,3}(\.\d)? ?°C|GiB free")


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def one_tab(pw, port: int) -> float:
    browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    try:
        page = await browser.new_page(viewport={"width": 1600, "height": 1000})
        await page.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/]|ws://127\.0\.0\.1[:/]).*"),
                         lambda route: route.abort())
        screen = Screen()
        page.on("websocket", screen.on_ws)
        t0 = time.monotonic()
        await page.goto(f"http://127.0.0.1:{port}/")
        await _wait(lambda: READING.search(screen.text), 120, "a node reading in the tab")
        return time.monotonic() - t0
    finally:
        await browser.close()


async def measure(cfg: Path, env: dict, mode: str, runs: int, tmp: Path) -> list[float]:
    from playwright.async_api import async_playwright
    port = free_port()
    if mode == "standalone":
        args = ["serve", "--listen", f"127.0.0.1:{port}"]
    else:
        args = ["record", "--file", str(tmp / "rec.sqlite"), "--serve", f"127.0.0.1:{port}"]
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole", "--cluster", str(cfg), *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        await _wait(lambda: _listening(port), 60, "the server to listen")
        if mode == "attached":
            await asyncio.sleep(3)       # the collector's agents are up and ticking, as in a unit running for hours
        out = []
        async with async_playwright() as pw:
            for _ in range(runs):
                out.append(round(await one_tab(pw, port), 3))
                await asyncio.sleep(1)   # the tab's console child ends before the next one starts
        return out
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)


async def main_async(runs: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="sc-bench-tab-"))
    nodes = start_sshd_nodes(root / "nodes")
    try:
        cfg = cluster_yaml(root / "cluster.yaml", nodes, interval=0.5)
        env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(root / "state"), "PYTHONPATH": str(ROOT)}
        figures = {}
        for mode in ("standalone", "attached"):
            secs = await measure(cfg, env, mode, runs, root)
            figures[mode] = {"runs_s": secs, "median_s": statistics.median(secs)}
        return {"what": "page open to the first node reading, 2 sshd nodes, agent interval 0.5 s",
                "cpus": os.cpu_count(), **figures}
    finally:
        nodes.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main_async(args.runs)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
