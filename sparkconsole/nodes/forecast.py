"""Time to memory exhaustion, per node and per vLLM container: samples in, estimate out (pure, no I/O).

On a GB10 the GPU's memory is the host's: when MemAvailable reaches zero the machine freezes (no CUDA OOM
error, SSH hangs, a power cycle follows). A container with a memory cap is OOM-killed at its cap — but only by what
its cgroup is charged, its CPU side: CUDA memory is not charged to it there (graphistry/pygraphistry pull request
1671; Blackwellboy/model-serving-minefield issue 57), so a runaway in GPU memory never reaches the cap. This module
estimates how long either has left at the current rate, and names what grew: from the agent's per-process
readings (NVML's GPU memory per PID, mapped to containers: nodes/workload_memory.py), the workload whose memory
grew most over the window (`Estimate.grower`: a container, or a GPU process in no container).

Method (per series: node MemAvailable, or container memory.max − memory.current):
  1. Keep the last WINDOW_S seconds of (time, headroom) samples; estimate from at most MAX_POINTS of them,
     evenly thinned (cost stays flat at any tick rate).
  2. Slope: Theil–Sen (the median of all pairwise slopes). Up to ~29 % of the points can be wild (a page-cache
     drop, a short spike, a late tick) without moving it.
  3. Noise: 1.4826 × the median absolute residual around that line (the MAD, a robust standard deviation).
  4. It is a trend, not noise, only when all hold:
       - at least MIN_POINTS samples spanning MIN_SPAN_S seconds;
       - the fitted decline over the window exceeds K_NOISE × noise and MIN_DROP_FRAC of the total (node
         MemTotal, or the container's cap);
       - the most recent RECENT_FRAC of the window declines too (Theil–Sen on those points alone < 0), so a
         step that already levelled off (a model finished loading) does not count;
       - at least CONSISTENT_FRAC of the pairwise slopes are negative.
  5. Time to exhaustion = (headroom now − reserve) / −rate, where rate is the steeper of the window's slope and
     the recent points' slope once the window spans RECENT_MIN_SPAN_S (an accelerating runaway is not
     underestimated), and "headroom now" is the median of the last
     3 samples and reserve is NODE_RESERVE_B for a node (the kernel stalls before MemAvailable hits 0) and 0
     for a container (the cap is the cap).
  6. Severity: warn when the estimate is under WARN_S, bad under BAD_S; memory PSI full_avg10 ≥ PSI_FULL_BAD
     with a trend makes it bad at any horizon (the kernel is already stalling tasks on reclaim).

Constants were chosen against the recorded and generated runaways in tests/test_forecast.py: a 1 GiB/s runaway
on 128 GiB is flagged ~2 minutes ahead, a 30 MiB/s container leak to a 512 MiB cap is flagged with > 5 s to
spare, and flat or noisy traces (±4 GiB uniform noise, spikes, cache drops) never alert.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from .samples import Tick
from .workload_memory import workload_memory

WINDOW_S = 60.0
MAX_POINTS = 30
MIN_POINTS = 6
MIN_SPAN_S = 10.0
K_NOISE = 4.0
MIN_DROP_FRAC = 0.02
RECENT_FRAC = 0.34
RECENT_MIN_SPAN_S = 20.0
CONSISTENT_FRAC = 0.7
NODE_RESERVE_B = 512 << 20
WARN_S = 120.0
BAD_S = 30.0
PSI_FULL_BAD = 10.0
EVAL_EVERY_S = 1.0          # the console estimates each series at most this often (CPU at 32 nodes × 2 Hz)
GROWER_MIN_B = 256 << 20    # a workload that grew less than this over the window is not named as the runaway


def theil_sen(ts: list[float], ys: list[float]) -> tuple[float, list[float]]:
    """(median pairwise slope, all pairwise slopes) of points ordered by time."""
    slopes = []
    n = len(ts)
    for i in range(n):
        ti, yi = ts[i], ys[i]
        for j in range(i + 1, n):
            dt = ts[j] - ti
            if dt > 0:
                slopes.append((ys[j] - yi) / dt)
    return (statistics.median(slopes) if slopes else 0.0), slopes


def _thin(points: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


@dataclass(frozen=True)
class Estimate:
    what: str                       # "node" or the container's name
    headroom_b: float               # now
    total_b: float                  # MemTotal or the container's cap
    slope_b_s: float                # headroom change per second (negative: shrinking)
    noise_b: float
    span_s: float
    trend: bool                     # a real decline, not noise (see the method above)
    seconds: float | None           # to exhaustion at this rate; None without a trend
    severity: str | None = None     # None | warn | bad
    psi_some: float | None = None
    psi_full: float | None = None
    growth: dict[str, float] = field(default_factory=dict)   # what grew over the window, bytes (node only)
    grower: Grower | None = None    # the workload whose memory grew most while MemAvailable fell (node only)


@dataclass(frozen=True)
class Grower:
    """What grew: a container (its processes' GPU memory and its cgroup), or a GPU process in no container."""
    container: str | None           # None: a process in no container (the guard cannot stop it with docker)
    gpu_b: float                    # its GPU memory's growth over the window (NVML, per process)
    cgroup_b: float                 # its cgroup's growth (the part its memory cap sees)
    cap_b: int | None               # its cgroup's limit, when it has one
    procs: tuple[tuple[int, str | None, float], ...] = ()   # (pid, comm, growth) of its processes that grew, largest first

    @property
    def name(self) -> str:
        if self.container:
            return self.container
        pid, comm, _ = self.procs[0] if self.procs else (0, None, 0.0)
        return f"PID {pid}" + (f" ({comm})" if comm else "")

    @property
    def total_b(self) -> float:
        return self.gpu_b + self.cgroup_b

    def words(self) -> str:
        """`vllm_node +38.0 GiB: GPU memory +37.9 GiB (PID 4242 python3), cgroup +0.1 GiB of its 100.0 GiB cap`."""
        who = ", ".join(f"PID {pid}" + (f" {comm}" if comm else "") for pid, comm, _ in self.procs[:2])
        text = f"{self.name} +{_gib(self.total_b)}: GPU memory +{_gib(self.gpu_b)}" + (f" ({who})" if who else "")
        if self.container:
            text += f", cgroup +{_gib(self.cgroup_b)}" + (f" of its {_gib(self.cap_b)} cap" if self.cap_b else "")
        return text


class HeadroomSeries:
    """One headroom series (a node's MemAvailable, or a container's cap − usage)."""

    def __init__(self, what: str, reserve_b: float = 0.0) -> None:
        self.what = what
        self.reserve_b = reserve_b
        self.points: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, t: float, headroom_b: float) -> None:
        if self.points and t <= self.points[-1][0]:
            if t < self.points[-1][0] - WINDOW_S:
                self.points.clear()      # the clock went back a lot (a replay restarted): start over
            else:
                return
        self.points.append((t, headroom_b))
        while self.points and self.points[0][0] < t - WINDOW_S:
            self.points.popleft()

    def reset(self) -> None:
        self.points.clear()

    def estimate(self, total_b: float, psi_some: float | None = None, psi_full: float | None = None) -> Estimate | None:
        pts = list(self.points)
        if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < MIN_SPAN_S or total_b <= 0:
            return None
        span = pts[-1][0] - pts[0][0]
        thin = _thin(pts, MAX_POINTS)
        ts = [p[0] - thin[0][0] for p in thin]
        ys = [p[1] for p in thin]
        slope, slopes = theil_sen(ts, ys)
        intercept = statistics.median(y - slope * t for t, y in zip(ts, ys, strict=False))
        noise = 1.4826 * statistics.median(abs(y - (intercept + slope * t)) for t, y in zip(ts, ys, strict=False))
        now_b = statistics.median(p[1] for p in pts[-3:])
        k = max(int(len(thin) * RECENT_FRAC), 3)
        recent_slope, _ = theil_sen(ts[-k:], ys[-k:])
        decline = -slope * span
        trend = (slope < 0 and recent_slope < 0 and decline > K_NOISE * noise and decline > MIN_DROP_FRAC * total_b
                 and sum(1 for s in slopes if s < 0) >= CONSISTENT_FRAC * len(slopes))
        # An accelerating runaway (a leak that grows with load) is underestimated by the whole window's slope:
        # once the trend is real, the steeper of the two slopes sets the time.
        # (Only on a window long enough that its recent third is not one wobble of noise.)
        rate = min(slope, recent_slope) if span >= RECENT_MIN_SPAN_S else slope
        seconds = max((now_b - self.reserve_b) / -rate, 0.0) if trend else None
        sev = None
        if seconds is not None:
            if seconds <= BAD_S or (psi_full is not None and psi_full >= PSI_FULL_BAD):
                sev = "bad"
            elif seconds <= WARN_S:
                sev = "warn"
        return Estimate(self.what, now_b, total_b, rate if trend else slope, noise, span, trend, seconds, sev, psi_some, psi_full)


class NodeForecaster:
    """Both series of one node, fed with its ticks (nodes/samples.Tick); estimates at most every EVAL_EVERY_S."""

    def __init__(self, container: str | None) -> None:
        self.container = container
        self.node = HeadroomSeries("node", NODE_RESERVE_B)
        self.cont = HeadroomSeries(container or "container")
        self._parts: collections.deque[tuple[float, float, float]] = collections.deque()  # t, cached_b, cont_b
        # each per-process reading: t, {container: (gpu_b, cgroup_b, cap_b)}, {pid: (used_b, comm, container)}
        self._reads: collections.deque[tuple[float, dict[str, tuple[float, float, int | None]],
                                             dict[int, tuple[float, str | None, str | None]]]] = collections.deque()
        self._read_at: float | None = None
        self._last_eval = float("-inf")
        self.last: list[Estimate] = []

    def add(self, tick: Tick) -> list[Estimate] | None:
        """Feed one tick; the new estimates when it was time to estimate again, else None."""
        t = tick.time
        m, p = tick.mem, tick.pressure
        total = m.total_kb * 1024 if m and m.total_kb else 0
        cg = next((c for c in tick.cgroups if c.name == self.container), None) if self.container else None
        if m and m.available_kb is not None:
            self.node.add(t, m.available_kb * 1024)
        if cg and cg.current_b is not None and cg.max_b:
            self.cont.add(t, cg.max_b - cg.current_b)
        elif cg is None:
            self.cont.reset()            # no running container (stopped, restarted): its history is over
        self._parts.append((t, (m.cached_kb or 0) * 1024 if m else 0, cg.current_b or 0 if cg else 0))
        while self._parts and self._parts[0][0] < t - WINDOW_S:
            self._parts.popleft()
        self._add_read(tick)
        if t - self._last_eval < EVAL_EVERY_S:
            return None
        self._last_eval = t
        psi_some, psi_full = (p.some_avg10, p.full_avg10) if p else (None, None)
        out = []
        e = self.node.estimate(total, psi_some, psi_full)
        if e is not None:
            first, last = self._parts[0], self._parts[-1]
            span_pts = [x for x in self.node.points]
            used = (span_pts[0][1] - span_pts[-1][1]) if span_pts else 0.0
            growers = self._growers(self.node.points[0][0])
            if growers:
                # each workload by name (its GPU memory and cgroup), and what none of them accounts for
                grow = {g.name: g.total_b for g in growers}
                grow["page cache"] = last[1] - first[1]
                grow["other"] = used - sum(g.total_b for g in growers)
            else:
                grow = {"container": last[2] - first[2], "page cache": last[1] - first[1]}
                grow["other"] = used - grow["container"]   # page cache is mostly reclaimable: shown, not subtracted
            top = growers[0] if growers and growers[0].total_b > GROWER_MIN_B else None
            out.append(Estimate(**{**e.__dict__, "growth": grow, "grower": top}))
        if cg and cg.max_b:
            e = self.cont.estimate(cg.max_b, psi_some, psi_full)
            if e is not None:
                out.append(e)
        self.last = out
        return out


    def _add_read(self, tick: Tick) -> None:
        """Keep each new per-process reading (the agent repeats one between its reads) for the window."""
        gp = tick.gpu_procs
        if gp is None or not gp.measured or gp.read_at == self._read_at:
            return
        self._read_at = gp.read_at
        conts = {name: (float(w.gpu_b or 0), float(w.cgroup_b or 0), w.cap_b)
                 for name, w in workload_memory(tick).items()}
        procs = {p.pid: (float(p.used_b or 0), p.comm, p.container) for p in gp.procs}
        self._reads.append((tick.time, conts, procs))
        while self._reads and self._reads[0][0] < tick.time - WINDOW_S:
            self._reads.popleft()

    def _growers(self, since: float) -> list[Grower]:
        """Every workload that grew since `since` (the node series' window), largest first: containers (GPU +
        cgroup) and GPU processes in no container. Empty without two per-process readings in that span (an older
        agent, NVML without the list)."""
        reads = [r for r in self._reads if r[0] >= since - 2.0]    # a reading is repeated for 2 s: the one in force
        if len(reads) < 2:
            return []
        (_, c0, p0), (_, c1, p1) = reads[0], reads[-1]
        grew: dict[int, tuple[str | None, float, str | None]] = {}
        for pid, (used, comm, cont) in p1.items():
            d = used - p0.get(pid, (0.0, None, None))[0]
            if d > 0:
                grew[pid] = (comm, d, cont)
        out = []
        for name, (gpu, cgroup, cap) in c1.items():
            g0, cg0, _ = c0.get(name, (0.0, 0.0, None))
            procs = sorted(((pid, comm, d) for pid, (comm, d, cont) in grew.items() if cont == name),
                           key=lambda x: -x[2])
            out.append(Grower(name, gpu - g0, cgroup - cg0, cap, tuple(procs)))
        for pid, (comm, d, cont) in grew.items():
            if cont is None:
                out.append(Grower(None, d, 0.0, None, ((pid, comm, d),)))
        return sorted((g for g in out if g.total_b > 0), key=lambda g: -g.total_b)


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def describe(node: str, e: Estimate) -> str:
    """The alert's one line: when, how fast, and the facts behind it."""
    rate = f"{-e.slope_b_s / 2**20:.0f} MiB/s"
    if e.what == "node":
        head = f"{node}: unified memory exhausted in ~{e.seconds:.0f} s at the current rate"
    else:
        head = f"{node}: container {e.what} reaches its {_gib(e.total_b)} cap in ~{e.seconds:.0f} s"
    facts = [f"headroom {_gib(e.headroom_b)} falling {rate}"]
    if e.psi_some is not None:
        facts.append(f"PSI some {e.psi_some:.0f}% full {e.psi_full or 0:.0f}%")
    grew = [f"{k} +{_gib(v)}" for k, v in sorted(e.growth.items(), key=lambda kv: -kv[1]) if v > 64 << 20
            and not (e.grower and k == e.grower.name)]
    if e.grower is not None:
        grew.insert(0, e.grower.words())
    if grew:
        facts.append(f"grew in {e.span_s:.0f} s: " + ", ".join(grew))
    return f"{head} ({'; '.join(facts)})"


FIXES = ("stop or restart the workload that grew (s / r on its panel)",
         "relaunch with a lower --gpu-memory-utilization or --max-model-len",
         "a container's memory cap does not stop GPU memory on a GB10 (it holds the CPU side): run earlyoom "
         "preferring vLLM/SGLang (its guard check says how), and keep protect on (its default for launched workloads)",
         "turn protect on: {stop_container_before_exhaustion_s: 15} in the cluster file")
