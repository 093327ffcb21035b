"""The topology matrix: for each topology launch the recipe, wait until it serves, sweep, record, stop.

Launching is behind a small `Launcher` protocol (the lead wires it to the launch engineer's runner), so this
module knows nothing of nodes or plans. A topology whose launch fails is recorded as failed and the matrix goes
on; a sweep that pauses at a failed level (`on_failure="pause"`) stops the matrix there; `stop()` is always
called. With `resume`, topologies already measured in full are not launched again; `simulated` and `speed` say
which clock the launcher's endpoints run on (a real cluster by default), so a real matrix never skips what a demo
measured in the same file. With `keep_last`, the last topology, once measured in full, is left serving (the
launcher releases it): an operator who ends the list with the topology to serve does not wait for a second load.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..errors import UserError
from .measure import run_sweep
from .results import LevelResult, ResultsStore, ThermalNote
from .sweep import Progress, SweepSpec

MATRIX_TOPOLOGIES = ("solo", "cluster-tp2", "2x-solo-shuffle", "2x-solo-least-busy", "disagg")


class Launcher(Protocol):
    async def launch(self, recipe: str, topology: str) -> str:
        """Start `recipe` in `topology`, wait until it is ready, return the endpoint URL to benchmark."""

    async def stop(self) -> None:
        """Stop whatever the last launch started (called even when the launch failed)."""

    def release(self) -> None:
        """Leave the last launch serving: nothing the launcher does afterwards stops it (keep_last)."""


class StaticLauncher:
    """Endpoints that are already running, one URL per topology (`--endpoints topo=URL,…`)."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls

    async def launch(self, recipe: str, topology: str) -> str:
        try:
            return self.urls[topology]
        except KeyError:
            raise UserError(f"no endpoint given for topology {topology!r}", field="--endpoints",
                            fix=f"add {topology}=URL to --endpoints") from None

    async def stop(self) -> None:
        return None

    def release(self) -> None:
        return None


@dataclass
class MatrixOutcome:
    measured: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)       # already complete in the results file
    failed: dict[str, str] = field(default_factory=dict)   # topology -> one-line reason
    paused: str | None = None      # "topology after level: why" when `on_failure="pause"` stopped the matrix
    run_ids: dict[str, str] = field(default_factory=dict)  # topology -> its run in the results file (this call)
    kept: tuple[str, str] | None = None                    # (topology, URL) left serving by keep_last


def recipe_hash(recipe: str) -> str | None:
    """sha256 (16 hex) of the recipe file, so results name exactly what was launched: a path, or a recipe
    name resolved the way the launcher resolves it (./recipes, the user's recipes, the bundle).
    None when nothing by that name exists (`bench run --recipe` may record a free-form name)."""
    from ..recipes import recipe_path
    try:
        p = recipe_path(recipe)
        return hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except (UserError, OSError):
        return None


def _complete(store: ResultsStore, spec: SweepSpec, topology: str, simulated: bool, speed: float) -> bool:
    want = set(spec.levels())
    ident = json.loads(json.dumps(spec.identity()))    # as stored: tuples became lists
    if ident.get("model") is None:
        ident.pop("model")                             # the model the endpoint served is what was stored
    for run in store.runs():
        if (run.source == "sparkconsole" and run.topology == topology and run.recipe == spec.recipe
                and run.simulated == simulated and run.speed == speed and run.recipe_hash == spec.recipe_hash and want <= store.finished_keys(run.run_id)
                and all(run.spec.get(k) == v for k, v in ident.items())):
            return True
    return False


async def run_matrix(recipe: str, topologies: Sequence[str], launcher: Launcher, template: SweepSpec,
                     store: ResultsStore, *, resume: bool = False, simulated: bool = False, speed: float = 1.0,
                     thermal_probe: Callable[[], ThermalNote | None] | None = None,
                     on_level: Callable[[LevelResult], None] | None = None,
                     on_progress: Callable[[Progress], None] | None = None,
                     on_status: Callable[[str], None] | None = None, keep_last: bool = False) -> MatrixOutcome:
    say = on_status or (lambda _msg: None)
    out = MatrixOutcome()
    rhash = recipe_hash(recipe)
    for i, topo in enumerate(topologies, 1):
        spec = replace(template, topology=topo, label=topo, recipe=recipe, recipe_hash=rhash)
        if resume and _complete(store, spec, topo, simulated, speed):
            say(f"[{i}/{len(topologies)}] {topo}: already measured, skipped")
            out.skipped.append(topo)
            continue
        say(f"[{i}/{len(topologies)}] {topo}: launching {recipe}")
        url = ""
        try:
            url = await launcher.launch(recipe, topo)
            say(f"[{i}/{len(topologies)}] {topo}: ready at {url}, sweeping")
            # a disaggregated launch's receiving servers: each level records what crossed the KV connector
            kv = tuple(getattr(launcher, "kv_metrics", ()) or ())
            swept = await run_sweep(replace(spec, url=url, kv_metrics=kv), store, resume=resume, thermal_probe=thermal_probe,
                                    on_level=on_level, on_progress=on_progress)
            out.run_ids[topo] = swept.run_id
            if swept.paused_after is not None:
                # The operator asked to stop at a failed level: this topology is stopped (finally), the rest wait
                # for --resume, which relaunches it and continues its open run from the next level.
                out.paused = f"{topo} after {swept.paused_after}: {swept.levels[-1].failure}"
                say(f"[{i}/{len(topologies)}] {topo}: paused after a failed level; --resume continues here")
                break
            out.measured.append(topo)
        except UserError as exc:
            out.failed[topo] = str(exc)
            say(f"[{i}/{len(topologies)}] {topo}: failed: {exc}")
        finally:
            if keep_last and i == len(topologies) and topo in out.measured:
                launcher.release()
                out.kept = (topo, url)
                say(f"[{i}/{len(topologies)}] {topo}: left serving at {url}")
            else:
                try:
                    await launcher.stop()
                except UserError as exc:
                    out.failed.setdefault(topo, f"stop failed: {exc}")
                    say(f"[{i}/{len(topologies)}] {topo}: stop failed: {exc}")
    return out
