"""A decode server of a disaggregated launch, as the console reads it: the KV cache that arrived over NIXL instead
of being prefilled there. The page is a real one, recorded from the test bed's decode server (vLLM 0.32 CPU)
right after one 599-token prompt came over NixlConnector (tests/test_topologies.py writes it)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from textual.app import App, ComposeResult

from sparkconsole.serving import metrics as m
from sparkconsole.serving import prom
from sparkconsole.serving.endpoint import EndpointMonitor
from sparkconsole.tui.widgets.endpoint_panel import EndpointPanel
from tests.test_endpoint import Server, ep
from tests.test_tui_app import widget_text

RECORDED = (Path(__file__).parent / "fixtures" / "metrics-vllm-0.32.0-cpu-decode-nixl-recorded.txt").read_text()


def test_the_recorded_decode_page_reads_as_one_transfer_and_no_recompute():
    em = m.engine_metrics(prom.parse(RECORDED, only=m.CONSOLE_NAMES))
    assert (em.kv_transfers, em.kv_in_bytes) == (1.0, 655360.0)
    assert (em.prompt_tokens_external, em.prompt_tokens_local) == (599.0, 0.0)
    # a server that moves no KV cache publishes none of it: None, not zero
    plain = m.engine_metrics(prom.parse((Path(__file__).parent / "fixtures" / "metrics-vllm-0.32.0-cpu-recorded.txt")
                                     .read_text(), only=m.CONSOLE_NAMES))
    assert plain.kv_in_bytes is None and plain.kv_transfers is None


async def test_the_endpoint_panel_shows_what_came_over_the_kv_connector():
    async def page(_):
        return web.Response(text=RECORDED, content_type="text/plain")

    async def health(_):
        return web.Response(text="")

    async with Server({"/health": health, "/metrics": page}) as srv:
        mon = EndpointMonitor(ep(srv.url, name="decode"), interval=0.2)
        try:
            snap = await mon.poll()
        finally:
            await mon.stop()
    assert (snap.kv_transfers, snap.kv_in_bytes) == (1.0, 655360.0)

    class One(App):
        def compose(self) -> ComposeResult:
            yield EndpointPanel("decode", srv.url, "vllm")

    app = One()
    async with app.run_test(size=(140, 12)) as pilot:
        panel = app.query_one(EndpointPanel)
        panel.show(snap)
        await pilot.pause()
        text = widget_text(panel)
    assert "KV in 1 transfers  640 KiB" in text and "xfer p50" in text


def test_a_level_reads_what_crossed_the_connector_and_says_when_it_could_not():
    from sparkconsole.bench.sweep import kv_level
    page = prom.parse(RECORDED, only=m.CONSOLE_NAMES)
    same = kv_level([page], [page], 4)                      # nothing moved between the two reads
    assert same == {"read": True, "transfers": 0.0, "bytes_per_request": 0.0, "xfer_ms_mean": None,
                    "prompt_external_share": None}
    assert kv_level([None], [page], 4) == {"read": False}   # the server did not answer before the level
