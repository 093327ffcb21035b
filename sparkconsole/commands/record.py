"""`sparkconsole record`: the flight recorder without the dashboard (a tmux pane, a systemd user unit).

    sparkconsole record [--file PATH] [--duration S]
    sparkconsole record repair FILE [--out NEW]      # a damaged recorder file: what is readable, into NEW

Watches every node (and endpoint) of the cluster file as the console does and keeps every tick, endpoint poll
and state change in the cluster's recorder file (state dir; see recorder/store.py). Unattended, it also runs
the alert rules, the memory-exhaustion warning and the guard (protect:, on by default for launched containers),
sends notifications (notify:) and prints a post-mortem line after each incident. Runs until Ctrl-C / SIGTERM or --duration; what
was queued is committed before it exits, and a SIGKILL loses at most the last batch (≤ 0.5 s).

It is the cluster's collector (sparkconsole/collector/): the only writer of the recorder file (a second `record`
is refused with one line naming this one), and it serves its readings on a Unix socket in the state dir, so the
console, `status`, `serve` tabs and `exporter` attach to it instead of starting agents of their own.
`--exporter` and `--serve` run those listeners inside it (docs/COLLECTOR.md has the systemd user unit).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..errors import UserError
from ..exporter.listenargs import add_web_config_arg
from .status import load

if TYPE_CHECKING:
    from pathlib import Path

    from ..collector.core import Collector
    from ..collector.lock import WriterLock
    from ..collector.server import CollectorServer
    from ..config import ClusterConfig
    from ..exporter.listener import Listener

# a --exporter / --serve listener: started with the collector, it returns its stop
Stop = Callable[[], Awaitable[None]]
Start = Callable[["Collector"], Awaitable[Stop]]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("record", help="keep every node's readings on disk, headless (flight recorder)",
                              description="Record every node's ticks and state changes to the cluster's "
                              "recorder file until stopped. `sparkconsole postmortem` and `console --at` read it.")
    p.add_argument("--file", metavar="PATH", help="recorder file (default: one per cluster in the state dir)")
    p.add_argument("--duration", type=float, default=0.0, metavar="S", help="stop after S seconds (0: never)")
    p.add_argument("--exporter", metavar="HOST:PORT", help="also serve Prometheus /metrics from this collector "
                   "(as `sparkconsole exporter --listen`; off loopback it needs --exporter-token-file)")
    p.add_argument("--exporter-token-file", metavar="FILE", help="bearer token for --exporter (first line of FILE; "
                   "or set SPARKCONSOLE_EXPORTER_TOKEN)")
    p.add_argument("--serve", metavar="HOST:PORT", help="also serve the console to browser tabs from this collector "
                   "(as `sparkconsole serve --listen`); each tab's console attaches to it")
    add_web_config_arg(p)     # for --exporter and --serve alike (TLS, basic auth)
    p.add_argument("--serve-token-file", metavar="FILE", help="token for --serve (or set SPARKCONSOLE_SERVE_TOKEN; "
                   "generated and printed once off loopback)")
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
        counts, gaps, from_leaves = salvage(src, out)
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
    if from_leaves:
        print(f"{from_leaves} of them read from its pages directly: SQLite could not reach them (a damaged page "
              "above them, or its header)",
              flush=True)
    texts = list(dict.fromkeys(g.text() for g in gaps))
    for text in texts:
        print(f"unreadable: {text}", flush=True)
    print(f"{len(texts)} unreadable part(s): the rows in them not read from leaf pages are not in {out}" if texts
          else "nothing was unreadable", flush=True)
    return 0


async def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..collector.core import Collector
    from ..collector.lock import SERVE_LOCK_NAME, LockHeld, WriterLock, describe_holder
    from ..collector.roles import RECORD, monitor_for
    from ..recorder.postmortem import one_line

    cluster = load(args)
    if not cluster.recorder.enabled:
        if not args.file:
            raise UserError("the recorder is off in the cluster file", field="recorder.enabled",
                            fix="set 'recorder: {enabled: true}' or pass --file PATH")
        cluster = replace(cluster, recorder=replace(cluster.recorder, enabled=True))   # --file asks for it
    listeners = _listeners(args)          # bad addresses and tokens are refused before anything starts
    # Unattended: the alert rules, the exhaustion warning, the guard, notifications and post-mortems run
    # here too, said on stdout (one line each), and so is every fault of the recorder file (recorder/health.py):
    # record goes on watching, alerting and guarding without it, and writes again once it can.
    def say(text: str, severity: str = "info") -> None:
        print(f"{time.strftime('%H:%M:%S')} {severity}: {text}", flush=True)
    core = Collector(cluster, RECORD, monitor_for(cluster, attach=False, history=16), say=say,
                     bell=lambda: print("\a", end="", flush=True))
    core.records_to(args.file, on_loop=False,      # print is thread-safe: said in order
                    on_postmortem=lambda pm: say(one_line(pm), "bad"))
    # One collector per cluster: a second `record` stops here, with one line naming the first. Then the duties
    # (the writer lock): taken now, or, where a console holds them while no collector ran, once it hands them back
    # (collector/duties.py); any other holder is refused in one line naming it.
    serving_lock = WriterLock.acquire(cluster, "record", name=SERVE_LOCK_NAME)
    try:
        if not await core.duties.take():
            holder = core.duties.other or {}
            if not holder.get("hands_back"):
                raise LockHeld(cluster, holder)
            say(f"waiting for {describe_holder(holder)} to hand over {core.duties.names} (it does once it has "
                "attached to this collector)")
        return await _collect(args, core, cluster, listeners, serving_lock)
    finally:
        serving_lock.release()


async def _collect(args: argparse.Namespace, core: Collector, cluster: ClusterConfig, listeners: list[Start],
                   serving_lock: WriterLock) -> int:
    core.alerts.subscribe(lambda a: None if a.key.startswith("exhaust:") else      # the guardian says those
                          core.say(a.message, a.severity if a.active else "info"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    path = core.duties.record_path()
    server = None
    stops: list[Stop] = []
    try:
        server = await _serve_viewers(core, cluster, serving_lock, path)
        print(f"recording {len(cluster.nodes)} node(s) of {cluster.source} to {path}; viewers attach "
              f"at {server.path}", flush=True)
        await core.start()
        for start in listeners:
            stops.append(await start(core))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.duration if args.duration > 0 else None)
    finally:
        for stop_listener in reversed(stops):
            await stop_listener()
        if server is not None:
            await server.stop()      # before the lock goes: the next collector's socket is never ours to remove
        await core.stop(flush_s=10)
    recs = core.duties.recorded
    written = sum(r.store.rows_written for r in recs)
    lost = sum(r.store.rows_dropped for r in recs)
    if not recs:
        print(f"recorded nothing to {path}: the recording was never handed over", file=sys.stderr, flush=True)
        return 1
    print(f"recorded {written} rows in {sum(r.store.batches for r in recs)} batches to {path}"
          + (f"; {lost} rows lost (said above)" if lost else ""), file=sys.stderr if lost else sys.stdout, flush=True)
    return 1 if lost else 0


async def _serve_viewers(core: Collector, cluster: ClusterConfig, serving_lock: WriterLock,
                         path: Path | None) -> CollectorServer:
    import os

    from ..collector.lock import socket_path
    from ..collector.server import CollectorServer
    server = CollectorServer(core, socket_path(cluster), info={
        "pid": os.getpid(), "since": serving_lock.info["since"], "role": "record", "source": cluster.source,
        "recorder": str(path)})
    await server.start()
    return server


def _listeners(args: argparse.Namespace) -> list[Start]:
    """--exporter / --serve, checked now (address, token, web config) and started later: each `start(core)`
    returns its stop. The same listeners as `sparkconsole exporter` and `sparkconsole serve` (exporter/listener.py)."""
    import dataclasses

    from ..exporter.access import Access
    from ..exporter.listen import read_token
    from ..exporter.listener import make_listener
    out: list[Start] = []
    if args.exporter:
        from .exporter import TOKEN_ENV
        exporter = make_listener(args.exporter, token=read_token(args.exporter_token_file, TOKEN_ENV),
                                 web_config_file=args.web_config_file, field="--exporter")
        exporter.refuse_open_network("give --exporter-token-file FILE (or SPARKCONSOLE_EXPORTER_TOKEN), "
                                     "basic_auth_users in --web-config-file, or listen on 127.0.0.1")
        out.append(lambda core: _start_exporter(core, exporter))
    if args.serve:
        from .serve import TOKEN_ENV as SERVE_TOKEN_ENV
        from .serve import decide
        token = read_token(args.serve_token_file, SERVE_TOKEN_ENV)
        serve = make_listener(args.serve, token=token, web_config_file=args.web_config_file, field="--serve")
        token, generated, read_only = decide(serve.listen, token, None, asked=serve.asks_who)
        if generated:
            serve = dataclasses.replace(serve, access=Access(token=token, users=serve.access.users))
        out.append(lambda core: _start_console_server(args, serve, generated, read_only))
    return out


async def _start_exporter(core: Collector, listener: Listener) -> Stop:
    from ..exporter.server import ExporterServer
    server = ExporterServer(core, listener, own_readings=False)
    await server.start()
    print(f"metrics at {server.url('/metrics')}" + (f" ({listener.describe()})" if listener.asks_who else ""),
          flush=True)
    return server.stop


async def _start_console_server(args: argparse.Namespace, listener: Listener, generated: bool,
                                read_only: bool) -> Stop:
    import os

    from ..webface.server import ConsoleServer
    from .serve import TOKEN_ENV as SERVE_TOKEN_ENV
    os.environ.pop(SERVE_TOKEN_ENV, None)          # the console children need no token
    server = ConsoleServer(listener, read_only=read_only, demo=False, cluster=getattr(args, "cluster", None))
    runner = await server.start_runner()
    server.say_listening()
    if generated:     # printed once, here, in the URL to open (the server's own line names the address)
        print(f"sparkconsole serve: open {listener.url('/', port=server.port)}?token={listener.access.token}",
              flush=True)
    return runner.cleanup
