"""Fit the simulator's few constants to the published gpt-oss-120b topology sweep (least squares).

    .venv/bin/python benchmarks/fit_sim.py [--stage engine|router|all] [--runs N] [--smoke]

Stage "engine" fits the hardware efficiencies and the MoE routing exponent on the single-engine rows
(solo and cluster-tp2, c1-c32, where no router or proxy limit is involved) by minimising the sum of
squared log errors with Nelder-Mead. Stage "router" then grid-searches the proxy's per-backend limit and
LiteLLM least-busy's update lags on all 84 points. Prints the constants to paste into profiles.py,
experiment.py and routing.py, and the scorecard. Pure Python (no numpy/scipy): ~1-3 minutes. `--smoke`: every stage, one step of each search, on c1 and c2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace

from sparkconsole.sim.engine import EngineArgs
from sparkconsole.sim.experiment import LITELLM, run_sweep
from sparkconsole.sim.profiles import GB10, MODELS
from sparkconsole.sim.reference import METRICS, load_topology_study, score

ARGS = EngineArgs(max_num_batched_tokens=32768, gpu_memory_utilization=0.70, max_model_len=4096,
                  kv_cache_dtype="fp8")
TABLE = load_topology_study()
LEVELS = TABLE.concurrency
SMOKE = False              # --smoke: one step of each search, c1 and c2 only

# (name, where, initial, low, high)
ENGINE_PARAMS = [
    ("mem_bw_efficiency", "hw", 0.9, 0.3, 1.3),
    ("compute_flops_s", "hw", 80e12, 10e12, 400e12),
    ("step_overhead_s", "hw", 0.002, 0.0, 0.05),
    ("seq_overhead_s", "hw", 0.0005, 0.0, 0.005),
    ("allreduce_latency_s", "hw", 60e-6, 1e-6, 500e-6),
    ("link_efficiency", "hw", 0.5, 0.05, 1.0),
    ("expert_routing_exponent", "model", 0.8, 0.3, 1.0),
]


def simulate(hw, model, proxy, topologies, levels, runs, seed=0):
    out = {}
    for topo in topologies:
        res = run_sweep(topo, model, ARGS, levels, 1024, 128, runs, seed, hw=hw, proxy=proxy)
        out[topo] = {r.concurrency: {"decode_tps": r.decode_tps, "prefill_tps": r.prefill_tps,
                                     "ttft_ms": r.ttft_ms, "imbalance": r.imbalance} for r in res}
    return out


def sq_log_error(sim, topologies, levels):
    total = 0.0
    for topo in topologies:
        for c in levels:
            pub = TABLE.get(topo, c)
            for m in METRICS:
                total += math.log(sim[topo][c][m] / pub.value(m)) ** 2
    return total


def apply(values, hw, model):
    hwc, mc = {}, {}
    for (name, where, *_), v in zip(ENGINE_PARAMS, values, strict=False):
        (hwc if where == "hw" else mc)[name] = v
    return replace(hw, **hwc), replace(model, **mc)


def nelder_mead(f, x0, scale, iters=250):
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (scale[j] if j == i else 0.0) for j in range(n)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        centroid = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        refl = [centroid[j] + (centroid[j] - pts[-1][j]) for j in range(n)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [centroid[j] + 2 * (centroid[j] - pts[-1][j]) for j in range(n)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [centroid[j] + 0.5 * (pts[-1][j] - centroid[j]) for j in range(n)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(n)]
                    vals[i] = f(pts[i])
    best = min(range(n + 1), key=lambda i: vals[i])
    return pts[best], vals[best]


def fit_engine(runs: int, proxy=LITELLM, start=None):
    model = MODELS["gpt-oss-120b"]
    topologies = ["solo", "cluster-tp2"]
    levels = [c for c in LEVELS if c <= 32]
    iters = (1, 1) if SMOKE else (250, 250)

    # search in a unit box per parameter (log scale for the wide ones)
    def decode(u):
        vals = []
        for (_name, _, _, lo, hi), x in zip(ENGINE_PARAMS, u, strict=False):
            x = min(1.0, max(0.0, x))
            if lo > 0 and hi / lo > 20:
                vals.append(math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo))))
            else:
                vals.append(lo + x * (hi - lo))
        return vals

    def encode(vals):
        u = []
        for (_name, _, _, lo, hi), v in zip(ENGINE_PARAMS, vals, strict=False):
            if lo > 0 and hi / lo > 20:
                u.append((math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)))
            else:
                u.append((v - lo) / (hi - lo))
        return u

    def f(u):
        hw, m = apply(decode(u), GB10, model)
        sim = simulate(hw, m, proxy, topologies, levels, runs)
        return sq_log_error(sim, topologies, levels)

    x0 = encode(start or [p[2] for p in ENGINE_PARAMS])
    best, err = nelder_mead(f, x0, [0.15] * len(x0), iters[0])
    best, err = nelder_mead(f, best, [0.05] * len(x0), iters[1])
    return decode(best), err


# proxy constants searched one at a time (coordinate descent, two passes) on all 84 points
ROUTER_GRID = [
    ("route_s", (0.0003, 0.0006, 0.001, 0.002, 0.004)),
    ("forward_s", (0.0003, 0.0006, 0.001, 0.002, 0.004)),
    ("client_jitter_s", (0.0, 0.001, 0.002, 0.004, 0.008)),
    ("engine_wakeup_s", (0.0, 0.004, 0.008, 0.016, 0.03)),
    ("max_inflight_per_backend", (None, 40, 44, 48)),
]


def fit_router(hw, model, proxy, runs):
    def f(px):
        return sq_log_error(simulate(hw, model, px, TABLE.topologies, LEVELS, runs), TABLE.topologies, LEVELS)

    best = f(proxy)
    for _ in range(1 if SMOKE else 2):
        for name, values in ROUTER_GRID:
            for v in values[:1] if SMOKE else values:
                cand = replace(proxy, **{name: v})
                err = f(cand)
                if err < best:
                    best, proxy = err, cand
    return proxy, best


def engine_stage(label: str, runs: int, hw, model, proxy, *, base_hw, t0: float):
    """Fit the engine constants from the current ones, print them, and apply them to `base_hw` and `model`."""
    vals, err = fit_engine(runs, proxy, start=[getattr(hw if w == "hw" else model, n) for n, w, *_ in ENGINE_PARAMS])
    print(f"{label}: sum sq log error {err:.4f} ({time.time() - t0:.0f}s)")
    for (name, where, *_), v in zip(ENGINE_PARAMS, vals, strict=False):
        print(f"  {where}.{name} = {v:.6g}")
    return apply(vals, base_hw, model)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=["engine", "router", "all", "score"], default="all")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a run of a few seconds, figures printed (the suite runs "
                                                          "every benchmark so)")
    ns = ap.parse_args(argv)
    global SMOKE, LEVELS, TABLE
    if ns.smoke:
        SMOKE, LEVELS = True, LEVELS[:2]
        TABLE = replace(TABLE, points=tuple(p for p in TABLE.points if p.concurrency in LEVELS))
    t0 = time.time()
    hw, model, proxy = GB10, MODELS["gpt-oss-120b"], LITELLM
    if ns.stage in ("engine", "all"):
        hw, model = engine_stage("engine fit", ns.runs, hw, model, proxy, base_hw=hw, t0=t0)
    if ns.stage in ("router", "all"):
        proxy, err = fit_router(hw, model, proxy, max(ns.runs, 8))
        print(f"router fit: sum sq log error {err:.4f} ({time.time() - t0:.0f}s)")
        for name, _ in ROUTER_GRID:
            print(f"  proxy.{name} = {getattr(proxy, name)}")
    if ns.stage == "all":
        hw, model = engine_stage("engine refit", ns.runs, hw, model, proxy, base_hw=GB10, t0=t0)
    sim = simulate(hw, model, proxy, TABLE.topologies, LEVELS, ns.runs if SMOKE else max(ns.runs, 10))
    card = score(sim, TABLE)
    print(f"{'topology':24} {'c':>3} | {'decode sim/pub':>15} | {'prefill sim/pub':>15} | {'ttft ms sim/pub':>15}")
    for topo in TABLE.topologies:
        for c in LEVELS:
            pub = TABLE.get(topo, c)
            cells = [f"{sim[topo][c][m]:7.0f}/{pub.value(m):<7.0f}" for m in METRICS]
            print(f"{topo:24} {c:>3} | " + " | ".join(cells) + f" | imb {sim[topo][c]['imbalance']:.2f}")
    print(card.summary())
    for line in card.misses:
        print("  winner miss:", line)
    for (topo, c, m), e in sorted(card.errors.items(), key=lambda kv: -abs(kv[1])):
        if abs(e) > card.tolerance:
            print(f"  off by {e:+.0%}: {topo} c{c} {m}")
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
