"""The published numbers the simulator is fitted to, and the scorecard that compares a sweep with them.

The CSVs are bundled as package data (sparkconsole/sim/data/), copied from the project's shared reference data.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from importlib import resources

METRICS = ("decode_tps", "prefill_tps", "ttft_ms")
LOWER_IS_BETTER = {"ttft_ms"}


@dataclass(frozen=True)
class PublishedPoint:
    topology: str
    concurrency: int
    decode_tps: float
    prefill_tps: float
    ttft_ms: float

    def value(self, metric: str) -> float:
        value: float = getattr(self, metric)
        return value


@dataclass(frozen=True)
class PublishedTable:
    name: str
    notes: tuple[str, ...]          # the CSV's leading comment lines (setup of the published run)
    points: tuple[PublishedPoint, ...]

    @property
    def topologies(self) -> list[str]:
        return list(dict.fromkeys(p.topology for p in self.points))

    @property
    def concurrency(self) -> list[int]:
        return sorted({p.concurrency for p in self.points})

    def get(self, topology: str, concurrency: int) -> PublishedPoint:
        for p in self.points:
            if p.topology == topology and p.concurrency == concurrency:
                return p
        raise KeyError((topology, concurrency))


def load_topology_study(name: str = "gpt-oss-120b-topologies.csv") -> PublishedTable:
    text = resources.files("sparkconsole.sim").joinpath("data", name).read_text(encoding="utf-8")
    notes = tuple(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    body = "\n".join(line for line in text.splitlines() if line and not line.startswith("#"))
    points = tuple(
        PublishedPoint(row["topology"], int(row["concurrency"]), float(row["decode_tps"]),
                       float(row["prefill_tps"]), float(row["ttft_ms"]))
        for row in csv.DictReader(io.StringIO(body)))
    return PublishedTable(name, notes, points)


@dataclass
class Scorecard:
    cells_matched: int = 0          # (level, metric) cells where the simulated winner = published winner
    cells_total: int = 0
    points_within: int = 0          # points within `tolerance` of the published value
    points_total: int = 0
    tolerance: float = 0.25
    misses: list[str] = field(default_factory=list)
    errors: dict[tuple[str, int, str], float] = field(default_factory=dict)   # relative error per point

    def summary(self) -> str:
        return (f"winning topology matched in {self.cells_matched}/{self.cells_total} cells; "
                f"{self.points_within}/{self.points_total} points within {self.tolerance:.0%} "
                f"({self.points_within / max(1, self.points_total):.0%})")


def score(simulated: dict[str, dict[int, dict[str, float]]], table: PublishedTable,
          tolerance: float = 0.25) -> Scorecard:
    """simulated[topology][concurrency][metric] -> value, for every published topology and level."""
    card = Scorecard(tolerance=tolerance)
    for c in table.concurrency:
        for metric in METRICS:
            pick = min if metric in LOWER_IS_BETTER else max
            pub_best = pick(table.topologies, key=lambda t: table.get(t, c).value(metric))
            sim_best = pick(table.topologies, key=lambda t: simulated[t][c][metric])
            card.cells_total += 1
            if pub_best == sim_best:
                card.cells_matched += 1
            else:
                card.misses.append(f"c{c} {metric}: published {pub_best}, simulated {sim_best}")
    for p in table.points:
        for metric in METRICS:
            sim = simulated[p.topology][p.concurrency][metric]
            err = sim / p.value(metric) - 1.0
            card.errors[(p.topology, p.concurrency, metric)] = err
            card.points_total += 1
            if abs(err) <= tolerance:
                card.points_within += 1
    return card


def load_rows(name: str) -> tuple[tuple[str, ...], list[dict[str, str]]]:
    """Any other bundled CSV (deepseek-v4-flash-tuning.csv, llama-3.1-8b-disaggregation.csv):
    (its leading comment lines, its rows as dicts of strings)."""
    text = resources.files("sparkconsole.sim").joinpath("data", name).read_text(encoding="utf-8")
    notes = tuple(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    body = "\n".join(line for line in text.splitlines() if line and not line.startswith("#"))
    return notes, list(csv.DictReader(io.StringIO(body)))
