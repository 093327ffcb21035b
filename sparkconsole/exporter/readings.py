"""What the exporter reads from: the headless core (collector/core.py) over the cluster's monitors, so /metrics
shows the alerts the console would raise. Everything here is updated by the monitors' own tasks; a scrape only
reads it. Inside `sparkconsole record --exporter` the readings are the collector's own core.
"""

from __future__ import annotations

from ..collector.core import Collector, guards_of
from ..collector.roles import EXPORTER, monitor_for
from ..collector.seams import ClusterWatch, EndpointsWatch
from ..config import ClusterConfig

__all__ = ["Readings", "guards_of"]


class Readings(Collector):
    """The monitors (built from the cluster unless given) and the alert engine over them, in the EXPORTER role: it
    acts on nothing (no guard action, no notification, no recording: the collector, or the console, does those).

    monitor: a ClusterMonitor (or one that acts as it); when None, one attached to the cluster's collector if
    `attach` (collector/attach.py), else one of its own. serving: a ServingMonitor, or None for one over the
    cluster's endpoints (when any)."""

    def __init__(self, cluster: ClusterConfig, *, monitor: ClusterWatch | None = None,
                 serving: EndpointsWatch | None = None, attach: bool = False) -> None:
        # the exporter keeps no history: the last tick is enough
        super().__init__(cluster, EXPORTER, monitor or monitor_for(cluster, attach=attach, history=16),
                         serving=serving)
