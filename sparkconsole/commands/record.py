"""`sparkconsole record`: the flight recorder without the dashboard (a tmux pane, a systemd user unit).

    sparkconsole record [--file PATH] [--duration S]
    sparkconsole record repair FILE [--out NEW]      # a damaged recorder file: what is readable, into NEW

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
import sqlite3
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
    sub = p.add_subparsers(dest="record_command", metavar="ACTION")
    rp = sub.add_parser("repair", help="copy what is still readable of a damaged recorder file into a new one",
                        description="Copy every row SQLite can still read from FILE into a new recorder file, "
                        "reading around damaged pages; prints what was copied and what was unreadable. FILE is "
                        "left as it is.")
    rp.add_argument("file", metavar="FILE")
    rp.add_argument("--out", metavar="NEW", help="the new file (default: FILE's name with -repaired)")
    rp.set_defaults(func=repair)


def repair(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..recorder.damage import salvage

    src = Path(args.file).expanduser()
    out = Path(args.out).expanduser() if args.out else src.with_name(f"{src.stem}-repaired{src.suffix or '.sqlite'}")
    if out.exists() or out.resolve() == src.resolve():
        raise UserError("the new file exists already", file=str(out), field="--out",
                        fix="give --out a path that does not exist yet")
    try:
        counts, gaps = salvage(src, out)
    except (UserError, sqlite3.Error, OSError) as exc:
        for suffix in ("", "-wal", "-shm"):
            Path(str(out) + suffix).unlink(missing_ok=True)
        if isinstance(exc, UserError):
            raise
        raise UserError(f"cannot write the new file: {' '.join(str(exc).split())[:100]}", file=str(out),
                        field="--out", fix="give --out a path on a filesystem with room that you can write") from None
    out.chmod(0o600)
    print(f"copied {sum(counts.values())} readable rows of {src} into {out}: " + ", ".join(
        f"{n} {table.replace('_', ' ')}" for table, n in counts.items()), flush=True)
    texts = list(dict.fromkeys(g.text() for g in gaps))
    for text in texts:
        print(f"unreadable: {text}", flush=True)
    print(f"{len(texts)} unreadable part(s): their rows are not in {out}" if texts else "nothing was unreadable",
          flush=True)
    return 0


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
    # Unattended: the alert rules, the exhaustion warning, the opt-in guard, notifications and post-mortems run
    # here too, said on stdout (one line each), and so is every fault of the recorder file (recorder/health.py):
    # record goes on watching, alerting and guarding without it, and writes again once it can.
    def say(text: str, severity: str = "info") -> None:
        print(f"{time.strftime('%H:%M:%S')} {severity}: {text}", flush=True)
    rec = Recorder.open(cluster, args.file, on_status=say, on_loop=False)     # print is thread-safe: said in order
    assert rec is not None
    mon = ClusterMonitor(cluster, history=16)
    rec.attach(mon)
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
    lost = rec.store.rows_dropped
    print(f"recorded {rec.store.rows_written} rows in {rec.store.batches} batches to {rec.store.path}"
          + (f"; {lost} rows lost (said above)" if lost else ""), file=sys.stderr if lost else sys.stdout, flush=True)
    return 1 if lost else 0
