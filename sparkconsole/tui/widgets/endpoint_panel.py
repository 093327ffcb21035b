"""One serving endpoint (vLLM or router): health, model, version, queue, KV cache, prefix hits, throughput,
TTFT and ITL percentiles, as published by serving.EndpointSnapshot."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...timefmt import duration
from ..fmt import DASH, gib_or_mib, ms, num, one_line, pct


class EndpointPanel(Static):
    DEFAULT_CSS = "EndpointPanel { height: auto; }"

    def __init__(self, name: str, url: str, kind: str, **kwargs) -> None:
        super().__init__(Text(f"{url}: waiting for the first poll…", style="dim"), **kwargs)
        self.endpoint_name = name
        self.url = url
        self.border_title = f"{name} · {kind}"
        self._snap: Any = None        # the snapshot drawn, or ("unrecorded",) for a replayed moment without one

    def retarget(self, url: str, kind: str) -> None:
        """The endpoint moved (a launch serves on its recipe's port): start over at the new URL."""
        self.url, self._snap = url, None
        self.border_title = f"{self.endpoint_name} · {kind}"
        self.border_subtitle = ""
        self.update(Text(f"{url}: waiting for the first poll…", style="dim"))

    def show(self, snap, now: float | None = None, *, replayed: bool = False, loading: bool = False) -> None:
        """`replayed`: a recorded poll shown with a recorded moment (REPLAY), `now` that moment; `loading`: it
        refuses while its container loads the model (alerts.LoadWatch), not DOWN."""
        if snap is self._snap:
            return
        self._snap = snap
        now = time.time() if now is None else now
        sub = Text()
        if replayed:
            sub.append("REPLAY · ", style="bold magenta")
        if snap.healthy is True:
            sub.append("UP", style="green")
            if snap.warning:
                sub.append(f" · {one_line(snap.warning, 50)}", style="yellow")
        elif snap.healthy is False and loading:
            sub.append("LOADING", style="yellow")
        elif snap.healthy is False:
            sub.append("DOWN", style="bold red")
            if getattr(snap, "failures", 0) > 1:
                sub.append(f" ×{snap.failures}", style="red")
        else:
            sub.append("not polled yet", style="yellow")
        sub.append(f" · {duration(now - snap.time)} ago", style="dim")
        self.border_subtitle = sub
        self.set_class(snap.healthy is not True and not loading, "-unhealthy")
        self.update(self._grid(snap))

    def show_unrecorded(self, t: float) -> None:
        """A recorded moment with no poll of this endpoint near it: said, not the live figures."""
        if self._snap == ("unrecorded",):
            return
        self._snap = ("unrecorded",)
        self.border_subtitle = Text("REPLAY · no recorded poll then", style="magenta")
        self.update(Text(f"{self.url}: nothing recorded of this endpoint at that moment", style="dim"))

    def on_resize(self) -> None:
        if self._snap is not None and not isinstance(self._snap, tuple):
            self.update(self._grid(self._snap))     # the figures fitted to the new width

    def _grid(self, snap) -> Table:
        """Four columns; each cell the longest of its ways of saying it that fits the column, so a figure is shown
        whole or not at all (100×30 cut "p95 96…"); a model's or version's name is what gets an ellipsis."""
        inner = self.size.width - 4                 # border and padding
        col = (inner - 3 * 2) // 4 if inner > 0 else None
        grid = Table.grid(padding=(0, 2), expand=True)
        for _ in range(4):
            grid.add_column(no_wrap=True, overflow="ellipsis")

        def cell(*ways: str, style: str = "") -> Text:
            return Text(next((w for w in ways if col is None or len(w) <= col), ""), style=style)
        model = Text(snap.model or DASH, style="bold")
        # the runtime its /metrics names say (SGLang, llama.cpp), else vLLM for a server endpoint
        runtime = getattr(snap, "runtime", None) or ("vLLM" if snap.kind == "vllm" and snap.version else None)
        label = " ".join(x for x in (runtime, snap.version) if x)
        if label and (col is None or len(model) + len(label) + 2 <= col):
            model.append(f"  {label}", style="dim")
        grid.add_row(model, cell(f"run {num(snap.running)}  wait {num(snap.waiting)}",
                                 f"run {num(snap.running)} wait {num(snap.waiting)}",
                                 f"run {num(snap.running)}", style="yellow" if (snap.waiting or 0) > 0 else ""),
                     cell(f"KV {pct(snap.kv_usage)}", style="red" if (snap.kv_usage or 0) > 0.9 else ""),
                     cell(f"prefix hit {pct(snap.prefix_hit_rate)}", f"prefix {pct(snap.prefix_hit_rate)}"))
        if snap.kind == "router" and snap.backends_total is not None:
            grid.add_row(cell(f"backends {snap.backends_up}/{snap.backends_total} up",
                              f"{snap.backends_up}/{snap.backends_total} up",
                              style="red" if (snap.backends_up or 0) < snap.backends_total else ""),
                         cell(f"req/s {num(snap.requests_per_s, digits=1)}  err/s {num(snap.errors_per_s, digits=1)}",
                              f"req/s {num(snap.requests_per_s, digits=1)} err {num(snap.errors_per_s, digits=1)}",
                              f"req/s {num(snap.requests_per_s, digits=1)}",
                              style="red" if (snap.errors_per_s or 0) > 0 else ""),
                         cell(f"latency p50 {ms(snap.latency_p50_s)} p95 {ms(snap.latency_p95_s)}",
                              f"latency {ms(snap.latency_p50_s)}/{ms(snap.latency_p95_s)}",
                              f"lat {ms(snap.latency_p50_s)}/{ms(snap.latency_p95_s)}",
                              f"latency {ms(snap.latency_p50_s)}"), Text(""))
        if snap.kv_transfers:
            # a decode server of a disaggregated launch: what arrived over the KV connector instead of prefilling
            grid.add_row(cell(f"KV in {num(snap.kv_transfers)} transfers  {gib_or_mib(snap.kv_in_bytes)}",
                              f"KV in {num(snap.kv_transfers)} × {gib_or_mib(snap.kv_in_bytes)}",
                              f"KV in {num(snap.kv_transfers)}"),
                         cell(f"per request {gib_or_mib(snap.kv_bytes_per_transfer)}"
                              f"  xfer p50 {ms(snap.kv_xfer_p50_s)}",
                              f"{gib_or_mib(snap.kv_bytes_per_transfer)}/req  {ms(snap.kv_xfer_p50_s)}",
                              f"xfer {ms(snap.kv_xfer_p50_s)}"),
                         cell(f"prompt from transfer {pct(snap.kv_external_share)}",
                              f"from transfer {pct(snap.kv_external_share)}",
                              f"xfer {pct(snap.kv_external_share)}",
                              style="yellow" if (snap.kv_external_share or 1) < 0.99 else ""),
                         Text(""))
        grid.add_row(cell(f"prompt {num(snap.prompt_tps, ' t/s')}  gen {num(snap.gen_tps, ' t/s')}",
                          f"pp {num(snap.prompt_tps)} tg {num(snap.gen_tps, ' t/s')}",
                          f"gen {num(snap.gen_tps, ' t/s')}"),
                     cell(f"TTFT p50 {ms(snap.ttft_p50_s)} p95 {ms(snap.ttft_p95_s)}",
                          f"TTFT {ms(snap.ttft_p50_s)}/{ms(snap.ttft_p95_s)}", f"TTFT {ms(snap.ttft_p50_s)}"),
                     cell(f"ITL p50 {ms(snap.itl_p50_s)} p95 {ms(snap.itl_p95_s)}",
                          f"ITL {ms(snap.itl_p50_s)}/{ms(snap.itl_p95_s)}", f"ITL {ms(snap.itl_p50_s)}"),
                     Text(one_line(snap.error, 60), style="red") if snap.error else Text(""))
        return grid
