"""The test bed's remedy for threads that poll without sleeping (tests/testbed/spin.py), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests.testbed.spin import SpinWatch

# Like an engine with NIXL's progress thread: a thread that never sleeps, one that always does, and a main thread
# that is busy too (an engine's main thread runs its model: it is never put on SCHED_IDLE).
CHILD = """
import threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
print("up", flush=True)
spin()
"""


def test_only_a_spinning_thread_other_than_the_main_one_goes_on_sched_idle():
    # a shell above it, as a container's init is: the watch looks through the roots' descendants
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c \'{CHILD}\''], stdout=subprocess.PIPE, text=True)
    roots: list[int] = []                       # nothing to watch yet, as while a launch creates its containers
    try:
        with SpinWatch(lambda: roots, sample_s=0.5) as watch:
            assert shell.stdout.readline().strip() == "up"
            (child,) = psutil.Process(shell.pid).children()
            roots.append(shell.pid)
            deadline = time.monotonic() + 60
            while not watch.idled and time.monotonic() < deadline:
                time.sleep(0.2)
        policies = {t.id: os.sched_getscheduler(t.id) for t in child.threads()}
        assert len(watch.idled) == 1 and child.pid not in watch.idled, (watch.idled, policies)
        assert policies.pop(next(iter(watch.idled))) == os.SCHED_IDLE
        assert len(policies) == 2 and set(policies.values()) == {os.SCHED_OTHER}   # the main one and the sleeper
    finally:
        for p in psutil.Process(shell.pid).children():
            p.kill()
        shell.kill()
        shell.wait()
