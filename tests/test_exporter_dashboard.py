"""The Grafana dashboard's queries against real data: the exporter over the simulated two-node cluster (the demo,
labelled SIMULATED), scraped by Debian's Prometheus; every panel's query must return series. No Grafana here, so
the panels are drawn by this test from Prometheus's query_range answers (a hand-made rendering of the dashboard
JSON, labelled as such) and saved as screenshots/grafana-dashboard.png through Debian's chromium."""

from __future__ import annotations

import asyncio
import html
import json
import time
import urllib.parse

import pytest

from sparkconsole.exporter.listen import Listen
from sparkconsole.exporter.readings import Readings
from sparkconsole.exporter.server import ExporterServer
from tests.test_exporter import ROOT, _query, _start_prometheus, _stop, get, need_prometheus

DASHBOARD = ROOT / "contrib" / "grafana" / "sparkconsole.json"
COLOURS = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a")


def _range(port: int, expr: str, start: float, end: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    try:
        status, _, body = get(f"http://127.0.0.1:{port}/api/v1/query_range?{q}")
    except OSError:
        return []
    return json.loads(body)["data"]["result"] if status == 200 else []


def _legend(fmt: str, labels: dict) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def _svg(series: list[tuple[str, list[tuple[float, float]]]], w: int = 560, h: int = 150) -> str:
    pts = [v for _, s in series for _, v in s]
    ts = [t for _, s in series for t, _ in s]
    if not pts:
        return "<p class=none>no data</p>"
    lo, hi = min(pts), max(pts)
    hi = hi if hi > lo else lo + 1
    t0, t1 = min(ts), max(ts) if max(ts) > min(ts) else min(ts) + 1
    lines = []
    for i, (_, s) in enumerate(series):
        p = " ".join(f"{(t - t0) / (t1 - t0) * w:.1f},{h - (v - lo) / (hi - lo) * (h - 10) - 5:.1f}" for t, v in s)
        lines.append(f'<polyline fill="none" stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="2" points="{p}"/>')
    axis = f'<text x="2" y="12">{hi:.4g}</text><text x="2" y="{h - 2}">{lo:.4g}</text>'
    return f'<svg width="{w}" height="{h}">{"".join(lines)}{axis}</svg>'


def render(panels: list[dict], results: dict[int, list], when: str) -> str:
    cells = []
    for p in panels:
        res = results[p["id"]]
        if p["type"] in ("timeseries", "state-timeline"):
            series = []
            for target, rs in res:
                for r in rs:
                    series.append((_legend(target.get("legendFormat", ""), r["metric"]),
                                   [(float(t), float(v)) for t, v in r["values"]]))
            body = _svg(series[:8]) + "<div class=legend>" + "".join(
                f'<span style="color:{COLOURS[i % len(COLOURS)]}">■</span> {html.escape(n)} '
                for i, (n, _) in enumerate(series[:8])) + "</div>"
        else:
            rows = [(_legend(t.get("legendFormat", ""), r["metric"]), r["values"][-1][1]) for t, rs in res for r in rs]
            body = "<table>" + "".join(f"<tr><td>{html.escape(n)}</td><td>{html.escape(v)}</td></tr>"
                                       for n, v in rows[:12]) + "</table>"
        cells.append(f'<div class="panel" style="grid-column: span {p["gridPos"]["w"]}"><h3>'
                     f'{html.escape(p["title"])}</h3>{body}</div>')
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ background:#111217; color:#ccccdc; font:13px sans-serif; margin:8px }}
.grid {{ display:grid; grid-template-columns: repeat(24, 1fr); gap:8px }}
.panel {{ background:#181b1f; border:1px solid #2c3235; padding:6px; overflow:hidden }}
h3 {{ margin:0 0 4px; font-size:13px; color:#d8d9da }} svg text {{ fill:#8e8e8e; font-size:10px }}
.legend {{ font-size:11px }} table {{ font-size:11px }} td {{ padding:0 8px 0 0 }} .none {{ color:#666 }}
.banner {{ background:#f2cc0c; color:#000; padding:4px 8px; margin-bottom:8px; font-weight:bold }}
</style></head><body><div class="banner">contrib/grafana/sparkconsole.json — panels drawn by tests/test_exporter_dashboard.py
from Prometheus query_range answers (a hand-made rendering, not Grafana) · SIMULATED cluster (sparkconsole demo) · {when}</div>
<div class="grid">{"".join(cells)}</div></body></html>"""


@pytest.mark.slow
async def test_dashboard_queries_return_data_and_render(tmp_path):
    need_prometheus()
    from sparkconsole.sim.cluster import Serving, SimCluster
    from tests.test_serve import CHROMIUM, CHROMIUM_ARGS, _need_browser
    pw_api = _need_browser()
    dash = json.loads(DASHBOARD.read_text())
    sim = SimCluster(speed=1.0, serving=Serving(topology="2x-solo", router="litellm-simple-shuffle"),
                     load_speedup=20.0)
    server = prom = load = None
    try:
        await sim.start()
        load = asyncio.create_task(sim.run_load(concurrency=4, seconds=None))
        server = ExporterServer(Readings(sim.cluster), Listen("127.0.0.1", 0), None)
        await server.start()
        token_file = tmp_path / "token"
        token_file.write_text("unused-on-loopback-but-sent\n")
        prom, pport = await asyncio.to_thread(_start_prometheus, tmp_path, server.port, token_file)
        t_start = time.time()
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(_query, pport, "sparkconsole_endpoint_generation_tokens_per_second > 0"):
            assert time.monotonic() < deadline, "no generation rate reached Prometheus"
            await asyncio.sleep(1)
        await asyncio.sleep(25)                       # some history for the time series
        end = time.time()
        results, empty = {}, []
        for p in dash["panels"]:
            res = [(t, await asyncio.to_thread(_range, pport, t["expr"].replace("$node", ".*"), t_start, end))
                   for t in p["targets"]]
            results[p["id"]] = res
            if not any(rs for _, rs in res) and p["title"] not in ("Alerts the console raises",):
                empty.append(p["title"])
        # Every panel has data, except where the simulated cluster has nothing to say (no throttling now).
        assert not [t for t in empty if "throttling" not in t.lower()], empty
        page_html = render(dash["panels"], results, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        (tmp_path / "dash.html").write_text(page_html)
        async with pw_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = await browser.new_page(viewport={"width": 1600, "height": 1200})
                await page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                                 else route.abort())
                await page.goto((tmp_path / "dash.html").as_uri())
                await page.screenshot(path=str(ROOT / "screenshots" / "grafana-dashboard.png"), full_page=True)
            finally:
                await browser.close()
    finally:
        if prom is not None:
            _stop(prom)
        if server is not None:
            await server.stop()
        if load is not None:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        await sim.stop()
