"""The node agent: samples GPU, host memory, OOM-guard inputs and containers; prints one JSON line per tick.

Runs on a node with nothing installed: the console streams this package's modules over SSH stdin (nodes/monitor.py
BOOTSTRAP and agent_payload) and runs them with the node's own `python3`. Standard library only at import time; the
NVML bindings (`pynvml`) are imported when asked for and the console sends them along when the node has none. Most
of the standard library is imported where used (the nvidia-smi fallback, the container poller, the hello): a node
pays for starting the agent on every connection, and a tick needs little. Wire format: sparkconsole/nodes/samples.py
(the field names there are the contract). Readings a source cannot give are left out, never reported as 0.

    smi.py         nvidia-smi's CSV, its GPU source, the clock-event reasons' words
    nvml.py        the NVML GPU source (reason counters, power limit, per-process GPU memory)
    sources.py     the other sources (none, replay, sim) and the choice of one
    host.py        memory, pressure, the OOM guards' inputs
    containers.py  the docker poller, container cgroups, GPU processes mapped to containers
    main.py        the hello and the tick loop

    python3 -m sparkconsole.agent [--interval 0.5] [--container-interval 5] [--count N]
        [--gpu-source auto|nvml|nvidia-smi|none|replay:FILE|sim:FILE] [--proc-root /proc]
        [--containers docker|none] [--docker-host URL] [--cgroup-root /sys/fs/cgroup] [--watch-stdin]

--watch-stdin: end when stdin reaches end-of-file (the console left); the bootstrap sets it.

This file is not sent to nodes (the bootstrap makes the package itself): the names below are for the console's
side and its tests, which read the agent's parts in process.
"""

from .containers import (
    PROCS_REFRESH_S,
    ContainerPoller,
    GpuProcsReader,
    ProcessMapper,
    cgroup_memory_files,
    container_from_inspect,
    container_id_in_cgroup,
    find_cgroup_memory,
    read_cgroup_memory,
)
from .host import GUARDS_REFRESH_S, guards_now, read_guards, read_meminfo, read_pressure
from .main import AGENT_VERSION, main, make_hello, make_tick
from .nvml import POWER_LIMIT_REFRESH_S, REASON_COUNTER_FIELDS, REASON_COUNTERS_REFRESH_S, NvmlSource
from .smi import REASON_BITS, SMI_FIELDS, SmiSource, parse_smi_csv, reasons_from_mask
from .sources import NoGpu, ReplaySource, SimSource, open_gpu_source

# the modules in the order a node runs them: each after those it imports (nodes/monitor.py sends them so)
MODULES = ("smi", "nvml", "sources", "host", "containers", "main")

__all__ = [
    "AGENT_VERSION", "GUARDS_REFRESH_S", "MODULES", "POWER_LIMIT_REFRESH_S", "PROCS_REFRESH_S", "REASON_BITS",
    "REASON_COUNTERS_REFRESH_S", "REASON_COUNTER_FIELDS", "SMI_FIELDS", "ContainerPoller", "GpuProcsReader",
    "NoGpu", "NvmlSource", "ProcessMapper", "ReplaySource", "SimSource", "SmiSource", "cgroup_memory_files",
    "container_from_inspect", "container_id_in_cgroup", "find_cgroup_memory", "guards_now", "main", "make_hello",
    "make_tick", "open_gpu_source", "parse_smi_csv", "read_cgroup_memory", "read_guards", "read_meminfo",
    "read_pressure", "reasons_from_mask",
]
