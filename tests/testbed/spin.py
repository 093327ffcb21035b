"""Threads that poll without sleeping, given only the CPU nothing else wants.

vLLM 0.32's NixlConnector creates its NIXL agent with NIXL's progress thread on (`nixl_agent_config`'s
`enable_prog_thread` default; no vLLM setting or environment variable reaches it), and on this CPU build that
thread calls UCX's progress in a loop that never sleeps: a whole core per engine, idle or not, from the engine's
start-up to its end (measured: an idle bare server 0.2 CPU s in 20 s without the connector, 20 s with it;
`num_threads` 0 or 1 and `UCX_TLS=tcp` change nothing). The disagg test's two engines then took both of this
machine's cores from every other test for as long as they lived. On SCHED_IDLE the thread keeps polling, so
transfers still progress, on CPU time no other thread asks for.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import psutil


def _thread_times(roots: list[int]) -> dict[int, tuple[float, str]]:
    """CPU seconds of every thread of these processes and their descendants but the processes' main threads
    (an engine's main thread runs its model, busy while it loads and serves), with its process's name."""
    procs: list[psutil.Process] = []
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
    times: dict[int, tuple[float, str]] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            name = p.name()
            times.update({t.id: (t.user_time + t.system_time, name) for t in p.threads() if t.id != p.pid})
    return times


class SpinWatch(threading.Thread):
    """While it runs, every `sample_s` seconds: a thread under `roots()` other than a main thread that ran more
    than `busy` of that time goes on SCHED_IDLE. `roots()` may name no process yet (a launch still starting)."""

    def __init__(self, roots: Callable[[], list[int]], *, sample_s: float = 2.0, busy: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.roots, self.sample_s, self.busy = roots, sample_s, busy
        self.idled: dict[int, str] = {}          # thread id: its process's name
        self._done = threading.Event()

    def run(self) -> None:
        before: dict[int, tuple[float, str]] = {}
        while not self._done.wait(self.sample_s):
            now = _thread_times(self.roots())
            for tid, (t, name) in now.items():
                if tid not in self.idled and tid in before and t - before[tid][0] > self.busy * self.sample_s:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                        self.idled[tid] = name
            before = now

    def stop(self) -> dict[int, str]:
        self._done.set()
        self.join()
        return self.idled

    def __enter__(self) -> SpinWatch:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
