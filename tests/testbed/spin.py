"""Threads that poll without sleeping, given only the CPU nothing else wants.

vLLM 0.32's NixlConnector creates its NIXL agent with NIXL's progress thread on (`nixl_agent_config`'s
`enable_prog_thread` default; no vLLM setting or environment variable reaches it), and on this CPU build that
thread calls UCX's progress in a loop that never sleeps: a whole core per engine, idle or not (measured: an idle
bare server 0.2 CPU s in 20 s without the connector, 20 s with it; `num_threads` 0 or 1 and `UCX_TLS=tcp` change
nothing). The disagg test's two engines then take both of this machine's cores from every other test for as
long as they live. SCHED_IDLE keeps the thread polling, so transfers still progress, on CPU time no other
thread asks for.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil


def _thread_times(roots: list[int]) -> dict[int, float]:
    """CPU seconds of every thread of these processes and their descendants."""
    procs: list[psutil.Process] = []
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
    times: dict[int, float] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            times.update({t.id: t.user_time + t.system_time for t in p.threads()})
    return times


def idle_the_spinning_threads(roots: list[int], *, sample_s: float = 2.0, busy: float = 0.2) -> list[int]:
    """Put on SCHED_IDLE every thread under `roots` that ran more than `busy` of `sample_s` seconds: call it
    while the servers have no request, when only a spinning thread runs. Returns the threads' ids."""
    before = _thread_times(roots)
    time.sleep(sample_s)
    after = _thread_times(roots)
    spinning = [tid for tid, t in after.items() if t - before.get(tid, t) > busy * sample_s]
    for tid in spinning:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    return spinning
