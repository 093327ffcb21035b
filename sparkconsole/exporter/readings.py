"""What the exporter reads from: the headless core (collector/core.py) over the cluster's monitors, so /metrics
shows the alerts the console would raise. Everything here is updated by the monitors' own tasks; a scrape only
reads it. Inside `sparkconsole record --exporter` the readings are the collector's own core.
"""

from __future__ import annotations

from typing import Any

from ..alerts import AlertEngine
from ..collector.core import Collector, guards_of
from ..config import ClusterConfig

__all__ = ["Readings", "guards_of"]


class Readings(Collector):
    """The monitors (built from the cluster unless given) and the alert engine over them.

    monitor: a ClusterMonitor (or anything with .nodes, .subscribe, .start, .stop); when None, one attached to
    the cluster's collector if `attach` (collector/attach.py), else one of its own. serving: a ServingMonitor,
    or None for one over the cluster's endpoints (when any). The exporter acts on nothing: no guard action, no
    notification (the collector, or the console, does those)."""

    def __init__(self, cluster: ClusterConfig, *, monitor: Any = None, serving: Any = None,
                 alerts: AlertEngine | None = None, with_serving: bool = True, attach: bool = False) -> None:
        if monitor is None:
            # the exporter keeps no history: the last tick is enough
            if attach:
                from ..collector.attach import AttachedMonitor
                monitor = AttachedMonitor(cluster, history=16)
            else:
                from ..nodes.monitor import ClusterMonitor
                monitor = ClusterMonitor(cluster, history=16)
        # endpoints only where the cluster file names them: a launch's own endpoints are not invented as series
        super().__init__(cluster, monitor=monitor, serving=serving, alerts=alerts, with_serving=with_serving,
                         acting=False, serve_launches=False, serving_factory=getattr(monitor, "serving_for", None))
