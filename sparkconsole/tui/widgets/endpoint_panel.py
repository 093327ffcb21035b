"""One serving endpoint (vLLM or router): health, model, version, queue, KV cache, prefix hits, throughput,
TTFT and ITL percentiles, as published by serving.EndpointSnapshot."""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ..fmt import DASH, duration, gib_or_mib, ms, num, pct


class EndpointPanel(Static):
    DEFAULT_CSS = "EndpointPanel { height: auto; }"

    def __init__(self, name: str, url: str, kind: str, **kwargs) -> None:
        super().__init__(Text(f"{url}: waiting for the first poll…", style="dim"), **kwargs)
        self.endpoint_name = name
        self.url = url
        self.border_title = f"{name} · {kind}"
        self._snap = None

    def retarget(self, url: str, kind: str) -> None:
        """The endpoint moved (a launch serves on its recipe's port): start over at the new URL."""
        self.url, self._snap = url, None
        self.border_title = f"{self.endpoint_name} · {kind}"
        self.border_subtitle = ""
        self.update(Text(f"{url}: waiting for the first poll…", style="dim"))

    def show(self, snap, now: float | None = None) -> None:
        if snap is self._snap:
            return
        self._snap = snap
        now = time.time() if now is None else now
        sub = Text()
        if snap.healthy is True:
            sub.append("UP", style="green")
            if snap.warning:
                sub.append(f" · {snap.warning[:50]}", style="yellow")
        elif snap.healthy is False:
            sub.append("DOWN", style="bold red")
            if getattr(snap, "failures", 0) > 1:
                sub.append(f" ×{snap.failures}", style="red")
        else:
            sub.append("not polled yet", style="yellow")
        sub.append(f" · {duration(now - snap.time)} ago", style="dim")
        self.border_subtitle = sub
        self.set_class(snap.healthy is not True, "-unhealthy")
        grid = Table.grid(padding=(0, 2), expand=True)
        for _ in range(4):
            grid.add_column(no_wrap=True, overflow="ellipsis")
        model = Text(snap.model or DASH, style="bold")
        # the runtime its /metrics names say (SGLang, llama.cpp), else vLLM for a server endpoint
        runtime = getattr(snap, "runtime", None) or ("vLLM" if snap.kind == "vllm" and snap.version else None)
        label = " ".join(x for x in (runtime, snap.version) if x)
        if label:
            model.append(f"  {label}", style="dim")
        grid.add_row(model, Text(f"run {num(snap.running)}  wait {num(snap.waiting)}",
                                 style="yellow" if (snap.waiting or 0) > 0 else ""),
                     Text(f"KV {pct(snap.kv_usage)}", style="red" if (snap.kv_usage or 0) > 0.9 else ""),
                     Text(f"prefix hit {pct(snap.prefix_hit_rate)}"))
        if snap.kind == "router" and snap.backends_total is not None:
            grid.add_row(Text(f"backends {snap.backends_up}/{snap.backends_total} up",
                              style="red" if (snap.backends_up or 0) < snap.backends_total else ""),
                         Text(f"req/s {num(snap.requests_per_s, digits=1)}  err/s {num(snap.errors_per_s, digits=1)}",
                              style="red" if (snap.errors_per_s or 0) > 0 else ""),
                         Text(f"latency p50 {ms(snap.latency_p50_s)} p95 {ms(snap.latency_p95_s)}"), Text(""))
        if snap.kv_transfers:
            # a decode server of a disaggregated launch: what arrived over the KV connector instead of prefilling
            grid.add_row(Text(f"KV in {num(snap.kv_transfers)} transfers  {gib_or_mib(snap.kv_in_bytes)}"),
                         Text(f"per request {gib_or_mib(snap.kv_bytes_per_transfer)}"
                              f"  xfer p50 {ms(snap.kv_xfer_p50_s)}"),
                         Text(f"prompt from transfer {pct(snap.kv_external_share)}",
                              style="yellow" if (snap.kv_external_share or 1) < 0.99 else ""),
                         Text(""))
        grid.add_row(Text(f"prompt {num(snap.prompt_tps, ' t/s')}  gen {num(snap.gen_tps, ' t/s')}"),
                     Text(f"TTFT p50 {ms(snap.ttft_p50_s)} p95 {ms(snap.ttft_p95_s)}"),
                     Text(f"ITL p50 {ms(snap.itl_p50_s)} p95 {ms(snap.itl_p95_s)}"),
                     Text(snap.error[:60], style="red") if snap.error else Text(""))
        self.update(grid)
