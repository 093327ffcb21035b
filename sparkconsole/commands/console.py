"""`sparkconsole` / `sparkconsole console`: the cluster file (or this machine as one node) → ClusterMonitor →
the Textual console. `--replay FILE` plays a recorded agent session on every node instead of connecting
(screenshots, demos of a recorded incident, the console benchmark)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:          # the imports themselves wait for run(): registering must stay cheap
    from ..config import ClusterConfig
    from ..nodes.monitor import ClusterMonitor
    from ..tui.app import SparkConsoleApp


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("console", help="open the console on the cluster (the default command)",
                              description=__doc__)
    p.add_argument("--replay", metavar="FILE", help="play this recorded agent session (JSON lines) on every node "
                   "instead of connecting to them")
    p.add_argument("--replay-interval", metavar="S", type=float, default=None,
                   help="seconds between replayed ticks (default: the recording's interval)")
    p.add_argument("--at", metavar="T", help='open the dashboard as it was at T, from the flight recorder '
                   '("2026-11-24 03:10" local time, or -15m); labelled REPLAY')
    p.add_argument("--demo", action="store_true", help="with --at: the latest `sparkconsole demo` recording (also "
                   "chosen when no cluster file is given and this machine has no recording)")
    p.set_defaults(func=run)


def build_app(args: argparse.Namespace) -> SparkConsoleApp:
    from ..tui.heap import hold
    hold()          # no cycle collection until the console has drawn and settled its heap (tui/heap.py)
    from ..clusterfile import resolve
    from ..tui.app import SparkConsoleApp

    resolved = resolve(getattr(args, "cluster", None))
    cluster = resolved.cluster
    at = getattr(args, "at", None)
    if at:
        from ..recorder.reader import parse_at
        from ..recorder.replay import recording_for, replay_monitor_factory
        when = parse_at(at)
        cluster, rec, _ = recording_for(cluster, file=None, demo=getattr(args, "demo", False),
                                        cluster_given=cluster.source != "<this machine>")
        return SparkConsoleApp(cluster, monitor_factory=replay_monitor_factory(rec, when), replay_at=when,
                               notice=resolved.origin, recording=str(rec))
    replay = getattr(args, "replay", None)
    if replay:
        from ..nodes.recording import read_recording, split_recording
        rp = Path(replay).expanduser()
        if not rp.is_file():
            raise UserError("recording not found", file=str(rp), field="--replay", fix="give a JSON-lines agent recording")
        lines = read_recording(rp)
        if not split_recording(lines)[1]:
            raise UserError("no tick lines in the recording", file=str(rp), field="--replay",
                            fix="record one with the agent, from a checkout: python3 -m sparkconsole.agent --count 100 > FILE")
        interval = getattr(args, "replay_interval", None)
        if interval is not None and not 0.01 <= interval <= 60:
            raise UserError(f"{interval} out of range", field="--replay-interval", fix="give 0.01 to 60 seconds")

        def replayed(cluster: ClusterConfig) -> ClusterMonitor:
            from ..nodes.monitor import ClusterMonitor
            from ..nodes.replay import replay_factory
            return ClusterMonitor(cluster, transport_factory=replay_factory(lambda n: lines, interval=interval))
        return SparkConsoleApp(cluster, monitor_factory=replayed, notice=resolved.origin)
    # The monitor (and the SSH stack under it) is built after the first frame: attached to the cluster's collector
    # (`sparkconsole record`) when one runs, else its own, which then keeps the flight recorder (live clusters only).
    return SparkConsoleApp(cluster, record=True, attach=True, notice=resolved.origin)


def run(args: argparse.Namespace) -> int:
    app = build_app(args)
    app.run()
    return int(app.return_code or 0)
