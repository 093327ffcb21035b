"""A browser tab's time to its first node reading: `serve` on its own (the tab's console connects to every node
and starts its agents) against `record --serve` (the tab's console attaches to the collector's current state).

    .venv/bin/python benchmarks/tab_open.py [--runs 5] [--rounds 2] [--modes attached] [--src DIR ...] [--child-runs 3]
    .venv/bin/python benchmarks/tab_open.py --smoke      # one tab per mode, one start without a browser

Two real sshd nodes on loopback (tests/testbed/sshd.py), Debian's chromium driven by Playwright (as
tests/test_serve.py). Timed from page.goto to the first node reading in the terminal's frames: a temperature
(°C) where the node has a GPU, else its host memory ("GiB free"; the test machine has no GPU). Each run is also
cut into where its time went:

    page      page.goto until the page opens the console's websocket (HTML, textual.js, window.onload)
    frame     the websocket opened until the console's first frame reaches the page (its process started or
              taken from the server's spare, Python, imports, Textual's first frame)
    reading   the first frame until the first node reading (the monitor's layers, attaching, the first redraw)

Tabs open one at a time, `--pause` seconds apart (default 3), each on a server at rest as an operator finds it
(a server keeps the next tab's console started ahead of it, webface/spare.py, and starts the next one 2 s after).

`--child-runs N` also starts the console exactly as textual-serve does (its command, its environment, the web
driver on pipes) N times against the collector, without a browser, and marks what the process says: the web
driver started (`__GANGLION__`: the interpreter and every import before the app runs), its first frame, its first
reading; `--importtime` adds the slowest imports of one such start (`python -X importtime`, cumulative).

`--src DIR` (repeatable) times the sparkconsole checkout in DIR (another commit, for before/after in one run on
the same machine; `--rounds` takes turns, so a change of the machine's load falls on every checkout alike). The
package's bytecode is compiled first, as an installed package has it (pip compiles at install time; this
project's machines set PYTHONDONTWRITEBYTECODE, under which an uncompiled checkout compiles every module on every
start); `--source` leaves the checkouts as they are.

Prints one JSON object: each run's seconds and the median per figure. No assertion: figures only. The figures
and where the time went: docs/COLLECTOR.md ("A tab's first reading under `record --serve`").
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
from tests.test_serve import _ANSI, CHROMIUM, CHROMIUM_ARGS, stop_serve  # noqa: E402
from tests.test_status import cluster_yaml  # noqa: E402
from tests.testbed.sshd import start_sshd_nodes  # noqa: E402

READING = re.compile(r"\b\d{2,3}(\.\d)? ?°C|GiB free")
FIRST_FRAME_BYTES = 1000      # the first write this large is the first frame (the escapes before it are a few bytes)


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)


class Tab:
    """What the console wrote to the page's terminal (the websocket's frames), each mark on time.monotonic()."""

    def __init__(self) -> None:
        self.raw = ""
        self.ws_at: float | None = None
        self.frame_at: float | None = None
        self.reading_at: float | None = None

    def on_ws(self, ws) -> None:
        self.ws_at = self.ws_at or time.monotonic()
        ws.on("framereceived", self._frame)

    def _frame(self, payload) -> None:
        now = time.monotonic()
        data = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
        if self.frame_at is None and len(data) >= FIRST_FRAME_BYTES:
            self.frame_at = now
        self.raw += data
        if self.reading_at is None and READING.search(_ANSI.sub("", self.raw)):
            self.reading_at = now


async def one_tab(pw, port: int) -> dict[str, float]:
    browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    try:
        page = await browser.new_page(viewport={"width": 1600, "height": 1000})
        await page.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/]|ws://127\.0\.0\.1[:/]).*"),
                         lambda route: route.abort())
        tab = Tab()
        page.on("websocket", tab.on_ws)
        t0 = time.monotonic()
        await page.goto(f"http://127.0.0.1:{port}/")
        await _wait(lambda: tab.reading_at is not None, 120, "a node reading in the tab")
        assert tab.ws_at is not None and tab.frame_at is not None and tab.reading_at is not None
        return {"total": tab.reading_at - t0, "page": tab.ws_at - t0, "frame": tab.frame_at - tab.ws_at,
                "reading": tab.reading_at - tab.frame_at}
    finally:
        await browser.close()


def _console_command(src: Path, cfg: Path, py: str) -> str:
    """The command textual-serve runs for a tab (webface/server.py), from that checkout."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from sparkconsole.webface.server import ConsoleServer, "
            "Listen; print(ConsoleServer(Listen('127.0.0.1', 1), read_only=False, demo=False, "
            "cluster=sys.argv[2]).command)")
    return subprocess.run([py, "-c", code, str(src), str(cfg)], capture_output=True, text=True, check=True,
                          cwd=src).stdout.strip()


def _web_env(env: dict, width: int = 200, height: int = 60) -> dict:
    """The environment textual-serve's AppService gives the console (textual_serve/app_service.py)."""
    return {**env, "TEXTUAL_DRIVER": "textual.drivers.web_driver:WebDriver", "TEXTUAL_FPS": "60",
            "TEXTUAL_COLOR_SYSTEM": "truecolor", "TERM_PROGRAM": "textual", "TERM_PROGRAM_VERSION": "1",
            "COLUMNS": str(width), "ROWS": str(height)}


async def one_child(command: str, env: dict, src: Path, importtime: bool = False) -> dict:
    """The console as a tab's child, on pipes: marks from its own output, relative to the spawn."""
    env = _web_env(env) | ({"PYTHONPROFILEIMPORTTIME": "1"} if importtime else {})
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_shell(command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE, env=env, cwd=src)
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    err = asyncio.get_running_loop().create_task(proc.stderr.read())
    marks: dict[str, float] = {}
    text = ""
    try:
        async with asyncio.timeout(120):
            while (line := await proc.stdout.readline()) != b"__GANGLION__\n":
                if not line:
                    raise RuntimeError("the console ended before its web driver started")
            marks["driver"] = time.monotonic() - t0
            while "reading" not in marks:
                kind = await proc.stdout.readexactly(1)
                payload = await proc.stdout.readexactly(int.from_bytes(await proc.stdout.readexactly(4), "big"))
                if kind != b"D":
                    continue
                if "frame" not in marks and len(payload) >= FIRST_FRAME_BYTES:
                    marks["frame"] = time.monotonic() - t0
                text += payload.decode("utf-8", "replace")
                if READING.search(_ANSI.sub("", text)):
                    marks["reading"] = time.monotonic() - t0
    finally:
        quit_meta = b'{"type": "quit"}'
        proc.stdin.write(b"M" + len(quit_meta).to_bytes(4, "big") + quit_meta)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    stderr = (await err).decode("utf-8", "replace")
    if importtime:
        marks["slowest_imports_ms"] = _slowest_imports(stderr)
    return marks


def _slowest_imports(stderr: str, top: int = 25) -> list[tuple[str, float]]:
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            _, cumulative, name = line[len("import time:"):].split("|")
            rows.append((name.strip(), round(int(cumulative) / 1000, 1)))
    return sorted(rows, key=lambda r: -r[1])[:top]


def _server(src: Path, py: str, cfg: Path, env: dict, mode: str, port: int, tmp: Path) -> subprocess.Popen:
    if mode == "standalone":
        args = ["serve", "--listen", f"127.0.0.1:{port}"]
    else:
        args = ["record", "--file", str(tmp / f"rec-{port}.sqlite"), "--serve", f"127.0.0.1:{port}"]
    return subprocess.Popen([py, "-m", "sparkconsole", "--cluster", str(cfg), *args], cwd=src, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


async def measure(src: Path, py: str, cfg: Path, env: dict, mode: str, args: argparse.Namespace, tmp: Path,
                  importtime: bool) -> dict:
    """One server of that checkout in that mode: args.runs tabs, then (attached) args.child_runs consoles alone."""
    from playwright.async_api import async_playwright
    port = free_port()
    proc = _server(src, py, cfg, env, mode, port, tmp)
    try:
        await _wait(lambda: _listening(port), 60, "the server to listen")
        if mode == "attached":
            await asyncio.sleep(3)       # the collector's agents are up and ticking, as in a unit running for hours
        out: dict = {"tabs": [], "child": []}
        async with async_playwright() as pw:
            for _ in range(args.runs):
                await asyncio.sleep(args.pause)     # the last tab's console ended, the server at rest
                out["tabs"].append({k: round(v, 3) for k, v in (await one_tab(pw, port)).items()})
        if mode == "attached" and (args.child_runs or importtime):
            command = _console_command(src, cfg, py)
            for _ in range(args.child_runs):
                out["child"].append({k: round(v, 3) for k, v in (await one_child(command, env, src)).items()})
                await asyncio.sleep(0.5)
            if importtime:
                out["child_importtime"] = await one_child(command, env, src, importtime=True)
        return out
    finally:
        stop_serve(proc)


def _medians(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]} if runs else {}


def _compile(src: Path) -> None:
    import compileall
    # Without writing into the checkout's history: __pycache__ is ignored by git.
    compileall.compile_dir(str(src / "sparkconsole"), quiet=1)


async def main_async(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="sc-bench-tab-"))
    py = sys.executable
    srcs = [p.resolve() for p in (args.src or [ROOT])]
    if not args.source:
        for src in srcs:
            _compile(src)
    nodes = start_sshd_nodes(root / "nodes")
    try:
        cfg = cluster_yaml(root / "cluster.yaml", nodes, interval=0.5)
        figures: dict = {}
        # Round after round, each checkout in turn: what the machine's load does over the run falls on all alike.
        for r in range(args.rounds):
            for mode in args.modes.split(","):
                for src in srcs:
                    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(root / "state"), "PYTHONPATH": str(src)}
                    key = mode if len(srcs) == 1 else f"{mode} {src}"
                    got = await measure(src, py, cfg, env, mode, args, root, importtime=args.importtime and r == 0)
                    fig = figures.setdefault(key, {"tabs": [], "child": []})
                    fig["tabs"] += got["tabs"]
                    fig["child"] += got["child"]
                    if "child_importtime" in got:
                        fig["child_importtime"] = got["child_importtime"]
        for fig in figures.values():
            fig["median_s"] = _medians(fig["tabs"])
            if fig["child"]:
                fig["child_median_s"] = _medians(fig["child"])
            else:
                del fig["child"]
        return {"what": "page open to the first node reading, 2 sshd nodes, agent interval 0.5 s",
                "bytecode": "as checked out" if args.source else "compiled (as installed)",
                "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2), **figures}
    finally:
        nodes.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="tabs opened per mode and round (default 3)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over every checkout and mode (default 1)")
    ap.add_argument("--modes", default="standalone,attached", help="standalone,attached (default both)")
    ap.add_argument("--src", type=Path, action="append", help="checkout whose sparkconsole to time (repeatable)")
    ap.add_argument("--pause", type=float, default=3.0, help="seconds between tabs (default 3)")
    ap.add_argument("--child-runs", type=int, default=0, help="attached: consoles started without a browser, per "
                    "round")
    ap.add_argument("--importtime", action="store_true", help="attached: the slowest imports of one console start")
    ap.add_argument("--source", action="store_true", help="leave the checkouts' bytecode as it is")
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.rounds, args.pause, args.child_runs = 1, 1, 1.0, 1
    print(json.dumps(asyncio.run(main_async(args)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
