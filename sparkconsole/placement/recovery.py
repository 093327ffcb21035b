"""Has a node's memory come back after a stop? A stopped server's unified memory returns over seconds, and a
restart loop that leaks it is a published failure: each round leaves less, until a load freezes the host.

A stop (`recipe stop`, the console's s) writes what it expects back on each node: MemAvailable just before it, and
what the stopped workload held there (measured; its claim where not). The next launch on that node waits until
MemAvailable is back to that sum, less a tolerance, and refuses with the figures when it is not back in time. A
launch that starts on the node clears its record (memory changes hands from there on).

The records live in the state directory (`stops.json`, 0600); the judgement is pure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1024 ** 3
KEEP_S = 3600.0                  # a record older than this says nothing about the memory now
TOLERANCE_B = GIB                # MemAvailable moves by the page cache: back within 1 GiB, or…
TOLERANCE_FRAC = 0.05            # …within 5 % of what the stop freed, whichever is larger
FILE = "stops.json"


@dataclass(frozen=True)
class StopRecord:
    node: str
    workload: str
    time: float
    available_b: int             # MemAvailable just before the stop
    freed_b: int                 # what the workload held there (or claimed)

    @property
    def expected_b(self) -> int:
        return self.available_b + self.freed_b

    @property
    def tolerance_b(self) -> int:
        return max(TOLERANCE_B, int(self.freed_b * TOLERANCE_FRAC))


def judge(records: list[StopRecord], available_b: int | None) -> tuple[bool, str]:
    """(back, words): whether MemAvailable is back after the node's stops, and the figures."""
    if not records:
        return True, "no stop recorded"
    expected = records[0].available_b + sum(r.freed_b for r in records)
    tolerance = max(r.tolerance_b for r in records)
    who = ", ".join(r.workload for r in records)
    if available_b is None:
        return False, f"MemAvailable not read after stopping {who}"
    words = (f"MemAvailable {available_b / GIB:.1f} GiB after stopping {who}; expected about {expected / GIB:.1f} GiB "
             f"({records[0].available_b / GIB:.1f} before + {sum(r.freed_b for r in records) / GIB:.1f} freed)")
    if available_b >= expected - tolerance:
        return True, words
    return False, words + f": {(expected - available_b) / GIB:.1f} GiB has not come back"


class StopLog:
    """The stop records of one cluster (keyed by its cluster file), in the state directory."""

    def __init__(self, state: Path, cluster: str) -> None:
        self.path = state / FILE
        self.cluster = cluster

    def _load(self) -> dict[str, list[dict[str, object]]]:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _save(self, doc: Mapping[str, object]) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)

    def records(self, node: str, now: float | None = None) -> list[StopRecord]:
        now = time.time() if now is None else now
        out = []
        for d in self._load().get(self.cluster, []):
            try:
                r = StopRecord(str(d["node"]), str(d["workload"]), float(d["time"]),  # type: ignore[arg-type]
                               int(d["available_b"]), int(d["freed_b"]))                  # type: ignore[call-overload]
            except (KeyError, TypeError, ValueError):
                continue
            if r.node == node and now - r.time < KEEP_S:
                out.append(r)
        return sorted(out, key=lambda r: r.time)

    def add(self, record: StopRecord) -> None:
        doc = self._load()
        mine = [d for d in doc.get(self.cluster, []) if isinstance(d, dict)
                and time.time() - float(d.get("time", 0)) < KEEP_S]   # type: ignore[arg-type]
        doc[self.cluster] = [*mine, asdict(record)]
        self._save(doc)

    def clear(self, node: str) -> None:
        doc = self._load()
        if self.cluster in doc:
            doc[self.cluster] = [d for d in doc[self.cluster] if isinstance(d, dict) and d.get("node") != node]
            self._save(doc)
