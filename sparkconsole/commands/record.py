"""`sparkconsole record`: the flight recorder without the dashboard (a tmux pane, a systemd user unit).

    sparkconsole record [--file PATH] [--duration S]

Watches every node (and endpoint) of the cluster file as the console does and keeps every tick, endpoint poll
and state change in the cluster's recorder file (state dir; see recorder/store.py). Unattended, it also runs
the alert rules, the memory-exhaustion warning and the opt-in guard (protect:), sends notifications (notify:)
and prints a post-mortem line after each incident. Runs until Ctrl-C / SIGTERM or --duration; what
was queued is committed before it exits, and a SIGKILL loses at most the last batch (≤ 0.5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from ..errors import UserError
from .status import load


def register(subparsers) -> None:
    p = subparsers.add_parser("record", help="keep every node's readings on disk, headless (flight recorder)",
                              description="Record every node's ticks and state changes to the cluster's "
                              "recorder file until stopped. `sparkconsole postmortem` and `console --at` read it.")
    p.add_argument("--file", metavar="PATH", help="recorder file (default: one per cluster in the state dir)")
    p.add_argument("--duration", type=float, default=0.0, metavar="S", help="stop after S seconds (0: never)")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..alerts import AlertEngine
    from ..nodes.guard import evaluate_guards
    from ..nodes.monitor import ClusterMonitor
    from ..notify.notifier import Notifier
    from ..protect import Guardian
    from ..recorder.feed import Recorder
    from ..recorder.postmortem import one_line

    cluster = load(args)
    if not cluster.recorder.enabled:
        if not args.file:
            raise UserError("the recorder is off in the cluster file", field="recorder.enabled",
                            fix="set 'recorder: {enabled: true}' or pass --file PATH")
        cluster = replace(cluster, recorder=replace(cluster.recorder, enabled=True))   # --file asks for it
    rec = Recorder.open(cluster, args.file)
    assert rec is not None
    mon = ClusterMonitor(cluster, history=16)
    rec.attach(mon)

    # Unattended: the alert rules, the exhaustion warning, the opt-in guard, notifications and post-mortems run
    # here too, said on stdout (one line each).
    def say(text: str, severity: str = "info") -> None:
        print(f"{time.strftime('%H:%M:%S')} {severity}: {text}", flush=True)
    alerts = AlertEngine(cluster.thresholds)
    rec.attach_alerts(alerts)
    guardian = Guardian(cluster, alerts, say=say, recorder=rec)
    mon.subscribe(guardian.on_node)
    rec.on_postmortem = lambda pm: say(one_line(pm), "bad")
    notifier = Notifier(cluster.notify, bell=lambda: print("\a", end="", flush=True), cluster=cluster.source)
    alerts.subscribe(notifier.submit)

    def node_alerts(nm) -> None:
        t = nm.last
        guards = evaluate_guards(t.guards, t.mem, nm.containers, nm.config.container) if t else []
        for a in alerts.observe_node(nm, guards):
            say(a.message, a.severity if a.active else "info")
    mon.subscribe(node_alerts)
    serving = None
    if cluster.endpoints:
        from ..serving.endpoint import ServingMonitor
        serving = ServingMonitor(cluster)
        rec.attach_serving(serving)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"recording {len(cluster.nodes)} node(s) of {cluster.source} to {rec.store.path}", flush=True)
    await mon.start()
    if serving is not None:
        await serving.start()
    try:
        try:
            await asyncio.wait_for(stop.wait(), args.duration if args.duration > 0 else None)
        except asyncio.TimeoutError:
            pass
    finally:
        if serving is not None:
            await serving.stop()
        await mon.stop()
        await guardian.wait_actions()
        await rec.wait_postmortems()
        rec.close()
        notifier.flush(10)
        notifier.close()
    err = rec.store.error
    print(f"recorded {rec.store.rows_written} rows in {rec.store.batches} batches" + (f"; {err}" if err else ""),
          file=sys.stderr if err else sys.stdout, flush=True)
    return 1 if err else 0
