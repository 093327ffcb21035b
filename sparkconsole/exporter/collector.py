"""The console's last readings as Prometheus metric families (prometheus_client collectors, not hand-written text).

A scrape reads what the monitors already hold: it never waits on a node. Each node's readings carry their age
(`sparkconsole_node_reading_age_seconds`), so a dashboard can tell a fresh 60 °C from one a DOWN node sent an
hour ago. Readings a node cannot give (no NVML memory on a GB10, no /proc/pressure) are absent, never zero.

Naming (https://prometheus.io/docs/practices/naming/): base units (`_celsius`, `_watts`, `_hertz`, `_bytes`,
`_seconds`, `_ratio` for 0..1), `_total` on counters; labels `node`, `gpu` (the index), `endpoint`.
Free-text reasons and alert messages carry live numbers: they are left out of labels (a new series per tick);
the numbers have families of their own, and the texts stay in the console.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..nodes.samples import REASON_BITS, ContainerInfo, GpuSample, NodeState
from ..nodes.workload_memory import WorkloadMemory, workload_memory

if TYPE_CHECKING:
    from ..collector.core import Collector as Core  # exporter/readings.Readings is one
    from ..nodes.monitor import NodeMonitor
    from ..serving.endpoint import EndpointSnapshot

P = "sparkconsole_"
GUARD_LEVEL = {"ok": 0, "warn": 1, "bad": 2}      # `unknown` has no level: the series is absent
SEVERITY_LEVEL = {"info": 0, "warn": 1, "bad": 2}
KIB = 1024


class _Families:
    """Families created on first use, yielded in creation order (so an empty family is never exposed)."""

    def __init__(self) -> None:
        self._f: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
        f = self._f.get(name)
        if f is None:
            f = self._f[name] = GaugeMetricFamily(P + name, doc, labels=labels)
        return f  # type: ignore[return-value]

    def counter(self, name: str, doc: str, labels: tuple[str, ...]) -> CounterMetricFamily:
        f = self._f.get(name)
        if f is None:
            f = self._f[name] = CounterMetricFamily(P + name, doc, labels=labels)
        return f  # type: ignore[return-value]

    def info(self, name: str, doc: str, labels: tuple[str, ...]) -> InfoMetricFamily:
        f = self._f.get(name)
        if f is None:
            f = self._f[name] = InfoMetricFamily(P + name, doc, labels=labels)
        return f  # type: ignore[return-value]

    def set(self, name: str, doc: str, labels: tuple[str, ...], values: list[str], v: float | None) -> None:
        if v is not None:
            self.gauge(name, doc, labels).add_metric(values, float(v))

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._f.values())


# (family, help, attribute, scale) for the per-GPU gauges
_GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("gpu_temperature_celsius", "GPU temperature.", "temp_c", 1.0),
    ("gpu_slowdown_temperature_celsius", "Temperature at which the GPU starts slowing down (NVML threshold).",
     "slowdown_c", 1.0),
    ("gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down (NVML threshold).",
     "shutdown_c", 1.0),
    ("gpu_max_operating_temperature_celsius", "Maximum GPU operating temperature (NVML threshold).",
     "gpu_max_c", 1.0),
    ("gpu_power_watts", "GPU power draw.", "power_w", 1.0),
    ("gpu_power_limit_watts", "GPU power limit.", "power_limit_w", 1.0),
    ("gpu_sm_clock_hertz", "GPU SM clock.", "sm_clock_mhz", 1e6),
    ("gpu_sm_clock_max_hertz", "GPU SM clock ceiling.", "sm_clock_max_mhz", 1e6),
    ("gpu_utilization_ratio", "GPU utilization (0..1).", "util_pct", 0.01),
    ("gpu_memory_utilization_ratio", "GPU memory-controller utilization (0..1).", "mem_util_pct", 0.01),
    ("gpu_memory_total_bytes", "GPU memory per NVML (absent on GB10 unified memory: see memory_*).", "mem_total_b", 1.0),
    ("gpu_memory_used_bytes", "GPU memory used per NVML (absent on GB10 unified memory).", "mem_used_b", 1.0),
)
_MEM_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("memory_total_bytes", "MemTotal of the node (/proc/meminfo); on a GB10 the GPU's memory too.", "total_kb"),
    ("memory_available_bytes", "MemAvailable of the node: the headroom that decides an OOM freeze on a GB10.",
     "available_kb"),
    ("memory_page_cache_bytes", "Page cache (Cached in /proc/meminfo).", "cached_kb"),
    ("swap_total_bytes", "SwapTotal of the node.", "swap_total_kb"),
    ("swap_free_bytes", "SwapFree of the node.", "swap_free_kb"),
)
# (family, help, snapshot attribute) for the endpoints' engine figures
_EP_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("endpoint_requests_running", "Requests being processed (vLLM num_requests_running, SGLang num_running_reqs, "
                                  "llama.cpp requests_processing).", "running"),
    ("endpoint_requests_waiting", "Requests queued (vLLM num_requests_waiting, SGLang num_queue_reqs, llama.cpp "
                                  "requests_deferred).", "waiting"),
    ("endpoint_kv_cache_usage_ratio", "KV-cache usage (0..1).", "kv_usage"),
    ("endpoint_prefix_cache_hit_ratio", "Prefix-cache hit rate over the recent window (0..1).", "prefix_hit_rate"),
    ("endpoint_prompt_tokens_per_second", "Prompt (prefill) tokens per second, recent window.", "prompt_tps"),
    ("endpoint_generation_tokens_per_second", "Generated tokens per second, recent window.", "gen_tps"),
    ("endpoint_health_latency_seconds", "Time the last health check took.", "health_latency_s"),
    ("endpoint_consecutive_failures", "Failed polls in a row.", "failures"),
    ("endpoint_max_model_len_tokens", "The served model's context length.", "max_model_len"),
    ("endpoint_router_requests_per_second", "Router: requests per second, recent window.", "requests_per_s"),
    ("endpoint_router_errors_per_second", "Router: failed requests per second, recent window.", "errors_per_s"),
    ("endpoint_router_backends_up", "Router: backends up.", "backends_up"),
    ("endpoint_router_backends", "Router: backends configured.", "backends_total"),
)
_EP_QUANTILES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("endpoint_time_to_first_token_seconds", "Time to first token, recent window, by percentile.",
     (("50", "ttft_p50_s"), ("95", "ttft_p95_s"))),
    ("endpoint_inter_token_latency_seconds", "Inter-token latency, recent window, by percentile.",
     (("50", "itl_p50_s"), ("95", "itl_p95_s"))),
    ("endpoint_router_request_duration_seconds", "Router: request duration, recent window, by percentile.",
     (("50", "latency_p50_s"), ("95", "latency_p95_s"))),
)


class ConsoleCollector(Collector):
    """Registered in a CollectorRegistry; collect() is called per scrape and reads Readings as they are."""

    def __init__(self, readings: Core, *, clock: Callable[[], float] = time.time) -> None:
        self.readings = readings
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return []            # families depend on what the nodes send: no fixed description (no collect at register)

    def collect(self) -> Iterable[Metric]:
        now = self.clock()
        fam = _Families()
        for nm in self.readings.monitor.nodes.values():
            self._node(fam, nm, now)
        for snap in self.readings.endpoint_snapshots():
            self._endpoint(fam, snap, now)
        self._alerts(fam)
        return list(fam)

    # --- nodes ------------------------------------------------------------------------------------------------
    def _node(self, fam: _Families, nm: NodeMonitor, now: float) -> None:
        n = nm.name
        for st in NodeState:
            fam.gauge("node_state", "Node state: 1 for the current one of CONNECTING, LIVE, STALE (3 ticks missed), "
                      "DOWN (connection lost).", ("node", "state")).add_metric([n, st.value], 1.0 if nm.state == st else 0.0)
        fam.set("node_up", "1 when the node is LIVE (ticks arriving).", ("node",), [n],
                1.0 if nm.state == NodeState.LIVE else 0.0)
        fam.set("node_state_changed_timestamp_seconds", "When the node entered its current state.", ("node",), [n],
                nm.since)
        t = nm.last
        if t is not None:
            fam.set("node_reading_age_seconds", "Seconds since the node's last reading arrived: everything else "
                    "this node exports is that old.", ("node",), [n], max(0.0, now - t.received))
            fam.set("node_reading_timestamp_seconds", "Node clock when the last reading was sampled.", ("node",), [n],
                    t.time)
        fam.counter("node_reboots", "New boot ids seen after a reconnect.", ("node",)).add_metric([n], nm.reboots)
        fam.counter("node_bad_lines", "Agent lines that were not a hello or a tick.", ("node",)).add_metric(
            [n], nm.bad_lines)
        fam.counter("node_connects", "Connections made to the node (reconnects included).", ("node",)).add_metric(
            [n], nm.connects)
        info = nm.info
        if info is not None:
            fam.info("node", "What the node's agent reported at start.",
                     ("node",)).add_metric([n], {
                         "hostname": info.hostname or "", "kernel": info.kernel or "", "driver": info.driver or "",
                         "gpu_source": info.gpu_source or "", "agent_version": info.agent_version or "",
                         "simulated": "true" if info.simulated else "false",
                         "gpu_name": info.gpu_names[0] if info.gpu_names else ""})
        if t is None:
            return
        for g in t.gpus:
            self._gpu(fam, n, g)
        if t.mem is not None:
            for name, doc, attr in _MEM_GAUGES:
                v = getattr(t.mem, attr)
                fam.set(name, doc, ("node",), [n], None if v is None else v * KIB)
        if t.pressure is not None:
            fam.set("memory_pressure_some_avg10_ratio", "PSI memory `some` avg10: share of time some task waited "
                    "on memory (0..1).", ("node",), [n],
                    None if t.pressure.some_avg10 is None else t.pressure.some_avg10 / 100)
            fam.set("memory_pressure_full_avg10_ratio", "PSI memory `full` avg10: share of time all tasks waited "
                    "on memory (0..1).", ("node",), [n],
                    None if t.pressure.full_avg10 is None else t.pressure.full_avg10 / 100)
        for r in self.readings.guards(nm):
            fam.set("oom_guard_state", "OOM guard: 0 ok, 1 warn, 2 bad (absent: unknown). See oom_guard_info.",
                    ("node", "guard"), [n, r.key], GUARD_LEVEL.get(r.status))
            fam.info("oom_guard", "OOM guard: its title, status and the command that fixes it.",
                     ("node", "guard")).add_metric([n, r.key], {"title": r.title, "status": r.status,
                                                                 "fix": r.fix or ""})
        for c in nm.containers:
            self._container(fam, n, c)
        for w in workload_memory(t).values():
            self._workload(fam, n, w)

    def _gpu(self, fam: _Families, n: str, g: GpuSample) -> None:
        lv = [n, str(g.index)]
        for name, doc, attr, scale in _GPU_GAUGES:
            v = getattr(g, attr)
            fam.set(name, doc, ("node", "gpu"), lv, None if v is None else v * scale)
        fam.set("gpu_unified_memory", "1 when the GPU shares the host's memory (GB10).", ("node", "gpu"), lv,
                1.0 if g.unified else 0.0)
        if g.reasons_mask is not None or g.reasons:
            active = set(g.reasons)
            cev = fam.gauge("gpu_clock_event_active", "1 while the NVML clock-event (throttle) reason is active.",
                            ("node", "gpu", "reason"))
            for reason in REASON_BITS:
                cev.add_metric([*lv, reason], 1.0 if reason in active else 0.0)
        if g.reason_us:
            ctr = fam.counter("gpu_clock_event_seconds", "Time the clock-event reason has been active (NVML "
                              "counter, since driver load).", ("node", "gpu", "reason"))
            for reason, us in g.reason_us.items():
                ctr.add_metric([*lv, reason], us / 1e6)

    def _container(self, fam: _Families, n: str, c: ContainerInfo) -> None:
        lv = [n, c.name]
        lab = ("node", "container")
        fam.set("container_running", "1 when the container is running.", lab, lv, 1.0 if c.state == "running" else 0.0)
        fam.info("container", "The container's image, state and health.", lab).add_metric(
            lv, {"image": c.image or "", "state": c.state or "", "health": c.health or ""})
        if c.restart_count is not None:
            fam.counter("container_restarts", "Docker's restart count for the container.", lab).add_metric(
                lv, c.restart_count)
        if c.oom_killed is not None:
            fam.set("container_oom_killed", "1 when the container's last exit was an OOM kill.", lab, lv,
                    1.0 if c.oom_killed else 0.0)
        if c.memory_limit_b is not None:
            fam.set("container_memory_limit_bytes", "The container's memory cap (0: none).", lab, lv,
                    c.memory_limit_b)
        if c.exit_code is not None:
            fam.set("container_exit_code", "The container's last exit code.", lab, lv, c.exit_code)

    def _workload(self, fam: _Families, n: str, w: WorkloadMemory) -> None:
        """One series per running container: what it measurably holds (absent where not measured: no guess)."""
        lv, lab = [n, w.container], ("node", "container")
        fam.set("workload_gpu_memory_bytes", "GPU memory of the container's processes (NVML, per process; on a GB10 "
                "unified memory the container's cgroup does not see it).", lab, lv, w.gpu_b)
        fam.set("workload_cgroup_memory_bytes", "The container's memory cgroup usage (memory.current): what its "
                "memory cap holds, its CPU side.", lab, lv, w.cgroup_b)
        if w.measured:
            fam.set("workload_memory_bytes", "GPU memory of its processes + its cgroup usage: what the container "
                    "holds of the node (present only when both are measured).", lab, lv, w.total_b)

    # --- endpoints --------------------------------------------------------------------------------------------
    def _endpoint(self, fam: _Families, s: EndpointSnapshot, now: float) -> None:
        e = s.name
        fam.set("endpoint_up", "1 when the endpoint's health check passed, 0 when it failed.", ("endpoint",), [e],
                None if s.healthy is None else (1.0 if s.healthy else 0.0))
        fam.set("endpoint_reading_age_seconds", "Seconds since the endpoint was last polled.", ("endpoint",), [e],
                max(0.0, now - s.time))
        fam.info("endpoint", "The endpoint's kind, URL, model, version and the node that hosts it.",
                 ("endpoint",)).add_metric([e], {"kind": s.kind, "url": s.url, "model": s.model or "",
                                                 "version": s.version or "",
                                                 "node": self.readings.endpoint_node(e) or ""})
        for name, doc, attr in _EP_GAUGES:
            fam.set(name, doc, ("endpoint",), [e], getattr(s, attr))
        for name, doc, pairs in _EP_QUANTILES:
            for q, attr in pairs:
                # `percentile`, not `quantile`: Prometheus keeps that label for summaries (promtool refuses it
                # on a gauge), and these are the console's windowed figures, not a summary's
                fam.set(name, doc, ("endpoint", "percentile"), [e, q], getattr(s, attr))
        if s.generation_tokens is not None:
            fam.counter("endpoint_generation_tokens", "Tokens generated since the server started.",
                        ("endpoint",)).add_metric([e], s.generation_tokens)
        if s.prompt_tokens is not None:
            fam.counter("endpoint_prompt_tokens", "Prompt tokens processed since the server started.",
                        ("endpoint",)).add_metric([e], s.prompt_tokens)
        for backend, load in s.backend_load:
            fam.set("endpoint_router_backend_requests_in_flight", "Router: requests in flight per backend.",
                    ("endpoint", "backend"), [e, backend], load)
        for backend, count in s.backend_requests:
            fam.counter("endpoint_router_backend_requests", "Router: requests sent to each backend since start.",
                        ("endpoint", "backend")).add_metric([e, backend], count)

    # --- alerts -----------------------------------------------------------------------------------------------
    def _alerts(self, fam: _Families) -> None:
        active = list(self.readings.alerts.active.values())
        g = fam.gauge("alert_active", "An alert the console has raised: its severity level (0 info, 1 warn, 2 bad).",
                      ("alert", "source", "severity"))
        for a in active:
            g.add_metric([a.key, a.source, a.severity], SEVERITY_LEVEL.get(a.severity, 0))
        counts = fam.gauge("alerts_active", "Alerts raised now, by severity.", ("severity",))
        for sev in SEVERITY_LEVEL:
            counts.add_metric([sev], sum(1 for a in active if a.severity == sev))
