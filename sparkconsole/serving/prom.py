"""Prometheus text → samples, histograms and the window between two scrapes: what any /metrics page is, whoever
publishes it (serving/metrics.py says what vLLM's, SGLang's, llama.cpp's and the routers' samples mean).

Parsing is prometheus_client's own text parser. Values are looked up by sample name, so a metric that is missing
or of an unexpected type gives None, never an exception. Percentiles come from merged histogram buckets with the
same in-bucket linear interpolation as Prometheus' histogram_quantile, both over the whole life of the server and
over the window between two scrapes (bucket deltas, counter resets handled).
"""

from __future__ import annotations

import math
import re
import time as _time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]          # sorted (name, value) pairs
Series = Mapping[Labels, float]

INF = float("inf")


# --- parsing -----------------------------------------------------------------------------------------------
# Any line that could be a sample: a metric name followed by labels or a space.
_SAMPLE_LINE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(\{|\s)")


@dataclass(frozen=True)
class Scrape:
    """One /metrics body: sample name → {labels: value}, and when it was read (console clock, seconds)."""
    time: float
    series: Mapping[str, Series]
    bad_lines: int = 0

    def values(self, name: str) -> Series:
        return self.series.get(name, {})

    def first(self, *names: str) -> str | None:
        """The first of `names` this scrape has (current name before older ones)."""
        return next((n for n in names if self.series.get(n)), None)

    def _finite(self, *names: str) -> list[float]:
        """The first present name's values over its label sets. ±Inf is no count to add (fsum refuses
        -inf + inf), NaN is none either: both are left out."""
        n = self.first(*names)
        return [v for v in self.series[n].values() if math.isfinite(v)] if n is not None else []

    def total(self, *names: str) -> float | None:
        """Sum over label sets of the first name present; None when none is."""
        vals = self._finite(*names)
        return math.fsum(vals) if vals else None

    def mean(self, *names: str) -> float | None:
        vals = self._finite(*names)
        return math.fsum(vals) / len(vals) if vals else None

    def label_values(self, label: str, *names: str) -> tuple[str, ...]:
        out: dict[str, None] = {}
        for n in names:
            for labels in self.series.get(n, {}):
                for k, v in labels:
                    if k == label:
                        out[v] = None
        return tuple(out)

    def histogram(self, *bases: str) -> Histogram | None:
        """The first histogram of `bases` present, summed over label sets."""
        base = self.first(*(b + "_bucket" for b in bases))
        if base is None:
            return None
        base = base[: -len("_bucket")]
        return Histogram.merge(_histogram_groups(self, base).values(), self.total(base + "_sum"), self.total(base + "_count"))


def _labels(d: Mapping[str, str]) -> Labels:
    return tuple(sorted(d.items()))


def parse(text: str | bytes, *, time: float | None = None, only: tuple[str, ...] | None = None) -> Scrape:
    """Prometheus text → Scrape. Never raises: lines the parser refuses are counted in bad_lines.
    `only`: keep just the samples whose names start with one of these (comment lines are dropped too; the
    figures are keyed by sample names, so TYPE lines are not needed)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    odd = 0
    if only is not None:
        kept = []
        for line in text.splitlines():
            if line.startswith(only):
                kept.append(line)
            elif line.strip() and not line.startswith("#") and not _SAMPLE_LINE.match(line):
                odd += 1      # not a sample line at all (an HTML error page, say): still worth a warning
        text = "\n".join(kept) + "\n"
    when = _time.time() if time is None else time
    series: dict[str, dict[Labels, float]] = {}

    def add(families: Iterable[Metric]) -> None:
        for fam in families:
            for s in fam.samples:
                series.setdefault(s.name, {})[_labels(s.labels)] = float(s.value)

    try:
        add(text_string_to_metric_families(text))
        return Scrape(when, series, odd)
    except Exception:
        pass
    # Some line broke the parser (it stops at the first): parse line by line and keep what parses.
    series.clear()
    bad = 0
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            add(text_string_to_metric_families(s + "\n"))
        except Exception:
            bad += 1
    return Scrape(when, series, bad + odd)


# --- histograms --------------------------------------------------------------------------------------------
def _le(labels: Labels) -> tuple[Labels, float] | None:
    rest, le = [], None
    for k, v in labels:
        if k == "le":
            try:
                le = float(v)   # "+Inf" parses as inf
            except ValueError:
                return None
        else:
            rest.append((k, v))
    return (tuple(rest), le) if le is not None and not math.isnan(le) else None


def _histogram_groups(s: Scrape, base: str) -> dict[Labels, dict[float, float]]:
    """{series labels without le: {upper bound: cumulative count}}"""
    groups: dict[Labels, dict[float, float]] = {}
    for labels, v in s.values(base + "_bucket").items():
        key = _le(labels)
        if key is None or math.isnan(v):
            continue
        groups.setdefault(key[0], {})[key[1]] = v
    return groups


@dataclass(frozen=True)
class Histogram:
    bounds: tuple[float, ...]     # bucket upper bounds, ascending (the last is +Inf in a whole histogram)
    counts: tuple[float, ...]     # cumulative counts per bound
    sum: float | None = None
    count: float | None = None

    @classmethod
    def merge(cls, groups: Iterable[Mapping[float, float]], total_sum: float | None = None,
              total_count: float | None = None) -> Histogram | None:
        summed: dict[float, float] = {}
        for g in groups:
            for le, c in g.items():
                summed[le] = summed.get(le, 0.0) + c
        if not summed:
            return None
        bounds = tuple(sorted(summed))
        return cls(bounds, tuple(summed[b] for b in bounds), total_sum, total_count)

    @property
    def observations(self) -> float:
        if self.bounds and self.bounds[-1] == INF:
            return self.counts[-1]
        return self.count or 0.0

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.bounds, self.counts)

    @property
    def mean(self) -> float | None:
        if self.sum is None or not self.count:
            return None
        return self.sum / self.count


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """Prometheus' histogram_quantile on one merged histogram; None where Prometheus gives NaN."""
    if math.isnan(q):
        return None
    if q < 0:
        return -INF
    if q > 1:
        return INF
    if len(bounds) < 2 or len(bounds) != len(counts) or bounds[-1] != INF:
        return None
    # Cumulative counts must not fall (float noise, scrape skew between series): carry the max forward.
    mono: list[float] = []
    top = 0.0
    for c in counts:
        top = max(top, c)
        mono.append(top)
    observations = mono[-1]
    if observations <= 0:
        return None
    rank = q * observations
    b = next((i for i in range(len(mono) - 1) if mono[i] >= rank), len(mono) - 1)
    if b == len(mono) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], mono[b]
    if b > 0:
        start = bounds[b - 1]
        count -= mono[b - 1]
        rank -= mono[b - 1]
    if count <= 0:
        return end
    return start + (end - start) * (rank / count)


# --- windows between two scrapes ---------------------------------------------------------------------------
def series_increase(prev: Series, cur: Series) -> float:
    """Counter increase summed over label sets; a series that went down restarted from zero."""
    total = 0.0
    for labels, v in cur.items():
        if math.isnan(v):
            continue
        before = prev.get(labels)
        if before is None or math.isnan(before):
            total += v            # new series since the last scrape: counted from zero
        elif v >= before:
            total += v - before
        else:
            total += v            # reset (server restarted)
    return total


def counter_increase(prev: Scrape, cur: Scrape, *names: str) -> float | None:
    n = cur.first(*names)
    if n is None or prev.first(n) is None:
        return None
    return series_increase(prev.values(n), cur.values(n))


def counter_rate(prev: Scrape, cur: Scrape, *names: str) -> float | None:
    dt = cur.time - prev.time
    inc = counter_increase(prev, cur, *names)
    if inc is None or dt <= 0:
        return None
    return inc / dt


def histogram_window(prev: Scrape, cur: Scrape, *bases: str) -> Histogram | None:
    """Observations made between two scrapes: bucket deltas per series, merged; a reset series counts whole."""
    name = cur.first(*(b + "_bucket" for b in bases))
    if name is None:
        return None
    base = name[: -len("_bucket")]
    if prev.first(name) is None:
        return None
    before = _histogram_groups(prev, base)
    deltas: list[dict[float, float]] = []
    for key, buckets in _histogram_groups(cur, base).items():
        old = before.get(key, {})
        reset = any(c < old.get(le, 0.0) for le, c in buckets.items())
        deltas.append(dict(buckets) if reset else {le: c - old.get(le, 0.0) for le, c in buckets.items()})
    inc_sum = counter_increase(prev, cur, base + "_sum")
    inc_count = counter_increase(prev, cur, base + "_count")
    return Histogram.merge(deltas, inc_sum, inc_count)
