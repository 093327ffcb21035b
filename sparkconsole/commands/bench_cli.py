"""What `bench run` and `bench matrix` share: the sweep spec from the command line, the progress line on stderr,
the thermal probe over the watched nodes, and an existing results file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:      # the benchmark code is imported in the functions: `bench --help` answers at once
    from ..bench.results import LevelResult, ResultsStore, ThermalNote
    from ..bench.sweep import Progress, SweepSpec
    from ..config import ClusterConfig
    from ..nodes.monitor import ClusterMonitor

    ThermalProbe = Callable[[], ThermalNote | None]


def sweep_spec(args: argparse.Namespace, url: str, **extra: Any) -> SweepSpec:
    from ..bench.sweep import SweepSpec
    return SweepSpec(url=url, model=args.model, pp=args.pp, tg=args.tg, depth=args.depth,
                     concurrency=args.concurrency, runs=args.runs, warmup=not args.no_warmup,
                     latency_mode=args.latency_mode, exact_tg=not args.no_exact_tg, token_ids=not args.no_token_ids,
                     stall_timeout=args.stall_timeout, first_timeout=args.first_timeout,
                     on_failure=args.on_failure, pace=args.pace, **extra)


class ProgressLine:
    """One progress line on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.width = 0

    def __call__(self, p: Progress) -> None:
        self.text(p.line())

    def text(self, line: str) -> None:
        if self.quiet:
            return
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def level(self, lv: LevelResult) -> None:
        if self.quiet:
            return
        if self.tty:
            sys.stderr.write("\r" + " " * self.width + "\r")
            self.width = 0
        d, p, t = lv.decode_tps, lv.prefill_tps, lv.ttft_ms
        bad = lv.metrics.get("requests_failed") or 0

        def fmt(v: float | None, f: str) -> str:
            return "—" if v is None else f.format(v)
        sys.stderr.write(f"{lv.label}: {lv.key}  decode {fmt(d, '{:.1f}')} t/s  prefill {fmt(p, '{:.0f}')} t/s  "
                         f"TTFT {fmt(t, '{:.0f}')} ms" + (f"  failed {bad}" if bad else "") + "\n")
        sys.stderr.flush()


def thermal_probe(monitor: ClusterMonitor) -> ThermalProbe:
    """For sweeps: the watched nodes' hottest GPU and noted clock-event reasons, as a ThermalNote."""
    from ..bench.results import ThermalNote
    from ..nodes.thermal import cluster_reading

    def probe() -> ThermalNote | None:
        r = cluster_reading(monitor.nodes.values())
        return None if r is None else ThermalNote(r.max_temp_c, r.throttle_reasons)
    return probe


async def cluster_probe(args: argparse.Namespace) -> tuple[ThermalProbe | None, ClusterMonitor | None]:
    """With an explicit --cluster, watch its nodes during the sweep; returns (probe, monitor) or (None, None)."""
    if not getattr(args, "cluster", None):
        return None, None
    from ..clusterfile import cluster_for
    return await watch_nodes(cluster_for(args))


async def watch_nodes(cluster: ClusterConfig, **monitor_args: Any) -> tuple[ThermalProbe, ClusterMonitor]:
    """The cluster's nodes watched (their first ticks in, or 10 s gone), and the thermal probe over them."""
    from ..nodes.monitor import ClusterMonitor
    monitor = ClusterMonitor(cluster, **monitor_args)
    try:
        await monitor.start()
        await monitor.wait_first_ticks(10.0)
    except BaseException:           # cut short (Ctrl-C, a start that failed): nothing left watching
        await monitor.stop()
        raise
    return thermal_probe(monitor), monitor


def existing_results(path: str) -> ResultsStore:
    from ..bench.results import ResultsStore
    if not Path(path).is_file():
        raise UserError("file not found", file=path, fix="pass a results file written by `sparkconsole bench run`")
    return ResultsStore(path)
