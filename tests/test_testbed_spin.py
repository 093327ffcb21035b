"""The test bed's remedy for threads that poll without sleeping (tests/testbed/spin.py), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests.testbed.spin import idle_the_spinning_threads

# A process with a thread that never sleeps and one that always does, like an engine with NIXL's progress thread.
CHILD = """
import threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
print("up", flush=True)
time.sleep(3600)
"""


def test_only_the_spinning_thread_is_put_on_sched_idle():
    # a parent shell, as a container's init is: the threads are found in its descendants
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c \'{CHILD}\''], stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout.readline().strip() == "up"
        time.sleep(0.3)
        spinning = idle_the_spinning_threads([shell.pid], sample_s=1.0)
        assert len(spinning) == 1, spinning
        (child,) = psutil.Process(shell.pid).children()
        policies = {t.id: os.sched_getscheduler(t.id) for t in child.threads()}
        assert policies.pop(spinning[0]) == os.SCHED_IDLE
        assert len(policies) == 2 and set(policies.values()) == {os.SCHED_OTHER}     # main and the sleeper
    finally:
        for p in psutil.Process(shell.pid).children():
            p.kill()
        shell.kill()
        shell.wait()
