"""Which topology to use when, derived from the user's own results (never typed in).

For each workload shape (pp, tg, depth) and concurrency band, every run label (topology) is scored by its mean
over the band's concurrency levels that all compared labels measured; the best wins decode, prefill and TTFT,
with its margin over the runner-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .results import LevelResult

# (metric, title, unit, higher is better)
CRITERIA = (("tg_throughput", "decode", "t/s", True), ("pp_throughput", "prefill", "t/s", True),
            ("e2e_ttft", "TTFT", "ms", False))
# Band edges follow the published "when to use which" table: c1–c4, c8–c16, c32–c64, and anything above.
BAND_EDGES = ((1, 4), (5, 16), (17, 64), (65, 1 << 30))


@dataclass(frozen=True)
class Verdict:
    shape: tuple[int, int, int]       # pp, tg, depth
    edges: tuple[int, int]            # the band's limits (one of BAND_EDGES)
    band: tuple[int, int]             # lowest and highest concurrency compared in the band
    criterion: str                    # decode | prefill | TTFT
    unit: str
    winner: str
    value: float
    runner_up: str | None
    runner_value: float | None
    margin: float | None              # winner vs runner-up: +0.20 = 20% more t/s; -0.30 = 30% less TTFT
    compared: tuple[str, ...]

    @property
    def band_label(self) -> str:
        lo, hi = self.band
        return f"c{lo}" if lo == hi else f"c{lo}–c{hi}"

    def cell(self) -> str:
        v = f"{self.value:.1f}" if self.unit == "t/s" and self.value < 1000 else f"{self.value:.0f}"
        return f"{self.winner} {v} {self.unit}{margin_text(self.margin)}"


def margin_text(margin: float | None) -> str:
    """' (+20%)'; a margin under 1% keeps a decimal, so a near tie does not read as '+0%'."""
    if margin is None:
        return ""
    pct = margin * 100
    return f" ({pct:+.1f}%)" if abs(pct) < 1 else f" ({pct:+.0f}%)"


def advise(levels: Sequence[LevelResult]) -> list[Verdict]:
    by_shape: dict[tuple[int, int, int], dict[str, dict[int, LevelResult]]] = {}
    for lv in levels:
        shape = (lv.key.pp, lv.key.tg, lv.key.depth)
        by_shape.setdefault(shape, {}).setdefault(lv.label, {})[lv.key.concurrency] = lv
    out = []
    for shape, labels in sorted(by_shape.items()):
        if len(labels) < 1:
            continue
        all_c = sorted({c for per in labels.values() for c in per})
        for lo_edge, hi_edge in BAND_EDGES:
            band_c = [c for c in all_c if lo_edge <= c <= hi_edge]
            if not band_c:
                continue
            for metric, title, unit, higher in CRITERIA:
                scores = _band_scores(labels, band_c, metric)
                if not scores:
                    continue
                ranked = sorted(scores.items(), key=lambda kv: kv[1][0], reverse=higher)
                (win, (val, used)), rest = ranked[0], ranked[1:]
                ru, ru_val = (rest[0][0], rest[0][1][0]) if rest else (None, None)
                margin = (val / ru_val - 1.0) if ru_val else None
                out.append(Verdict(shape, (lo_edge, hi_edge), (min(used), max(used)), title, unit, win, val, ru,
                                   ru_val, margin, tuple(label for label, _ in ranked)))
    return out


def _band_scores(labels: dict[str, dict[int, LevelResult]], band_c: list[int],
                 metric: str) -> dict[str, tuple[float, list[int]]]:
    have = {label: {c: m for c in band_c if c in per and (m := per[c].mean(metric)) is not None}
            for label, per in labels.items()}
    have = {k: v for k, v in have.items() if v}
    if not have:
        return {}
    common = sorted(set.intersection(*(set(v) for v in have.values())))
    if not common:
        # No level every label measured: compare each on what it has (stated by the band shown).
        return {k: (sum(v.values()) / len(v), sorted(v)) for k, v in have.items()}
    return {k: (sum(v[c] for c in common) / len(common), common) for k, v in have.items()}


def markdown(verdicts: Sequence[Verdict]) -> str:
    if not verdicts:
        return "No finished levels to compare.\n"
    parts = []
    shapes = sorted({v.shape for v in verdicts})
    for shape in shapes:
        pp, tg, depth = shape
        vs = [v for v in verdicts if v.shape == shape]
        compared = sorted({label for v in vs for label in v.compared})
        head = f"### When to use which — pp{pp} tg{tg}" + (f" depth {depth}" if depth else "")
        parts.append(head)
        if len(compared) < 2:
            parts.append(f"Only {compared[0] if compared else 'one run'} was measured: its figures per band (mean "
                         "over the band's levels). Sweep another topology to compare.\n")
        else:
            parts.append(f"Compared: {', '.join(compared)}. Winner per band (mean over the band's levels), "
                         "margin over the runner-up.\n")
        titles = [t for _, t, _, _ in CRITERIA]
        best = "best " if len(compared) >= 2 else ""
        parts.append("| concurrency | " + " | ".join(f"{best}{t}" for t in titles) + " |")
        parts.append("|---|" + "---|" * len(titles))
        for edges in sorted({v.edges for v in vs}):
            row = [x for x in vs if x.edges == edges]
            lo, hi = min(x.band[0] for x in row), max(x.band[1] for x in row)
            cells = []
            for t in titles:
                v = next((x for x in row if x.criterion == t), None)
                # A criterion compared on fewer levels than the band holds says which.
                cells.append("—" if v is None else v.cell() + ("" if v.band == (lo, hi) else f" [{v.band_label}]"))
            parts.append(f"| {f'c{lo}' if lo == hi else f'c{lo}–c{hi}'} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts) + "\n"
