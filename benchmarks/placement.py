"""Placement figures (issue 38): `recipe fit` of 10 recipes on 8 GB10 nodes offline, and the console's memory budget
bars redrawn at 32 nodes.

    .venv/bin/python benchmarks/placement.py [--runs 20] [--smoke]

1. fit: 10 workloads (two gpt-oss-120b, four llama-3.1-8b, four qwen3-embedding-0.6b, each its own name) on 8
   offline GB10 budgets through placement/fit.py with the real memory estimate and plans (target: within 0.5 s).
   Also the whole command, `sparkconsole recipe fit … --offline` as a process (its interpreter start included).
2. bars: 32 nodes, three workloads each (held share, the rest of a claim, memory outside the workloads): the bars
   computed (placement/bars.py), their text drawn at 160 columns (tui/widgets/budget_bar.py), and in a headless
   Textual app the widget's update to its next frame (target: within the console's 4 Hz frame, 250 ms).

Prints one JSON object of figures (medians), with each target's ratio. No assertion: a figure is a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIT_TARGET_S = 0.5
FRAME_S = 0.25


def eight_gb10():
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.placement.budget import offline_budget
    nodes = tuple(NodeConfig(f"spark{i + 1}", f"192.168.100.{10 + i}", role="head" if i == 0 else "worker")
                  for i in range(8))
    cluster = ClusterConfig(nodes=nodes, endpoints=(), source="<bench>")
    return cluster, {n.name: offline_budget(n.name) for n in nodes}


def ten_asks():
    from sparkconsole.placement.fit import Ask
    from sparkconsole.recipes import find_recipe
    keys = ["gpt-oss-120b"] * 2 + ["llama-3.1-8b"] * 4 + ["qwen3-embedding-0.6b"] * 4
    out = []
    for i, key in enumerate(keys):
        name = f"{key}-{i}"
        out.append(Ask(name, find_recipe(key), "solo", {"workload": name}))
    return out


def fit_figures(runs: int) -> dict[str, float]:
    from sparkconsole.placement.fit import fit
    from sparkconsole.placement.render import render_placement
    cluster, budgets = eight_gb10()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        asks = ten_asks()                 # the recipes read from their files each time, as the command does
        placement = fit(asks, cluster, budgets, offline=True)
        render_placement(placement)
        times.append(time.perf_counter() - t0)
    assert len(placement.choices) == 10
    med = statistics.median(times)
    return {"fit_10_on_8_ms": round(med * 1000, 1), "fit_target_ratio": round(med / FIT_TARGET_S, 3)}


def command_figure(runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "eight.yaml"
        f.write_text("nodes:\n" + "".join(f"  - {{name: spark{i + 1}, address: 192.168.100.{10 + i}}}\n"
                                          for i in range(8)))
        argv = [sys.executable, "-m", "sparkconsole", "--cluster", str(f), "recipe", "fit", "gpt-oss-120b",
                "gpt-oss-120b", *["llama-3.1-8b"] * 4, *["qwen3-embedding-0.6b"] * 4, "--offline",
                *[a for i in range(10) for a in ("--name", f"w{i}")]]
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
            times.append(time.perf_counter() - t0)
            if p.returncode != 0:
                raise SystemExit(p.stderr)
    return {"fit_command_ms": round(statistics.median(times) * 1000, 1)}


def thirty_two():
    from sparkconsole.placement.budget import NodeBudget
    from sparkconsole.placement.fit import GIB, Running
    budgets, running = [], []
    for i in range(32):
        node = f"spark{i + 1:02d}"
        budgets.append(NodeBudget(node, int(121.7 * GIB), int(9.5 * GIB), (), int((30 + i % 7) * GIB), True))
        running += [Running(f"chat-{i % 3}", node, ("c",), int((60 + i % 5) * GIB), int(85.2 * GIB)),
                    Running("coder", node, ("d",), int(14 * GIB), int(20 * GIB)),
                    Running("embed", node, ("e",), int(3 * GIB), None)]
    return budgets, running


def bar_figures(runs: int) -> dict[str, float]:
    from sparkconsole.placement.bars import bars
    from sparkconsole.tui.widgets.budget_bar import BudgetBars
    budgets, running = thirty_two()
    compute, draw = [], []
    widget = BudgetBars()
    for _ in range(runs):
        t0 = time.perf_counter()
        drawn = bars(budgets, running)
        t1 = time.perf_counter()
        widget.bars = drawn
        widget.text(160)
        t2 = time.perf_counter()
        compute.append(t1 - t0)
        draw.append(t2 - t1)
    frame = asyncio.run(frame_figure(runs, budgets, running))
    return {"bars_32_compute_ms": round(statistics.median(compute) * 1000, 2),
            "bars_32_text_ms": round(statistics.median(draw) * 1000, 2),
            "bars_32_update_to_frame_ms": round(frame * 1000, 2),
            "frame_budget_ratio": round(frame / FRAME_S, 3)}


async def frame_figure(runs: int, budgets, running) -> float:
    """From show() (new readings) to the widget's next render in a real, headless Textual app."""
    from textual.app import App, ComposeResult

    from sparkconsole.placement.bars import bars
    from sparkconsole.placement.fit import GIB
    from sparkconsole.tui.widgets.budget_bar import BudgetBars

    rendered: list[float] = []

    class Timed(BudgetBars):
        def render(self):
            out = super().render()
            rendered.append(time.perf_counter())
            return out

    class One(App):
        def compose(self) -> ComposeResult:
            yield Timed(id="b")

    app = One()
    times = []
    async with app.run_test(size=(160, 40)) as pilot:
        w = app.query_one(Timed)
        for i in range(runs):
            moved = [b.__class__(b.node, b.total_b, b.reserve_b, b.held, (b.available_b or 0) - (i + 1) * GIB // 8,
                                 b.measured) for b in budgets]
            rendered.clear()
            t0 = time.perf_counter()
            w.show(bars(moved, running))
            while not rendered:
                await pilot.pause(0.001)
            times.append(rendered[0] - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="a few runs of each, seconds in all")
    args = ap.parse_args()
    runs = 3 if args.smoke else args.runs
    figures = {"runs": runs, **fit_figures(runs), **command_figure(1 if args.smoke else 5), **bar_figures(runs)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
