"""One writer per cluster: the collector's directory under the state dir, its OS lock, and who holds it.

    state_dir()/collector/<cluster_key>/        mode 0700, one per cluster file (named as its recorder file)
        lock                                    flock()ed by the process that holds the duties (writes the recorder
                                                file, acts, notifies); holds {"pid", "since", "role", "hands_back"}
        serve.lock                              flock()ed by the `record` that serves the socket: one collector
        sock                                    the collector's Unix socket (collector/server.py), mode 0600

The locks are the kernel's (flock on an open file description): they go with the process, so a SIGKILLed
collector leaves no stale lock, and a second one is refused at once with one line naming the first. A console
that holds the duties while no collector runs says `hands_back`: a `record` that starts then waits for it
(collector/duties.py) instead of being refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from .. import paths
from ..config import ClusterConfig
from ..errors import UserError
from ..recorder.feed import cluster_key
from .seams import Json

LOCK_NAME = "lock"
SERVE_LOCK_NAME = "serve.lock"
SOCKET_NAME = "sock"
REFUSED_FIX = "stop that one first; the console, status, serve and exporter attach to it by themselves"


def collector_dir(cluster: ClusterConfig, *, create: bool = False) -> Path:
    d = paths.state_dir() / "collector" / cluster_key(cluster)
    if create:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)       # mkdir's mode is masked by the umask: only this user may reach the socket
    return d


def socket_path(cluster: ClusterConfig) -> Path:
    """Where the collector listens (a viewer only looks: nothing is created)."""
    return collector_dir(cluster) / SOCKET_NAME


def describe_holder(info: Json) -> str:
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"sparkconsole {info.get('role') or '?'} (pid {info.get('pid') or '?'}, since {when})"


class LockHeld(UserError):
    """Another process holds the lock; `holder` is what it wrote of itself (pid, since, role, hands_back)."""

    def __init__(self, cluster: ClusterConfig, holder: Json) -> None:
        self.holder = holder
        super().__init__(f"another collector records this cluster already: {describe_holder(holder)}",
                         file=cluster.source, fix=REFUSED_FIX)


class WriterLock:
    def __init__(self, path: Path, fd: int | None, info: Json, error: str | None = None) -> None:
        self.path = path
        self.info = info
        self.error = error          # why no lock could be taken (the state dir full or read-only), else None
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, cluster: ClusterConfig, role: str, *, hands_back: bool = False,
                name: str = LOCK_NAME) -> WriterLock:
        """The cluster's writer lock (or, name=SERVE_LOCK_NAME, the one collector's), or LockHeld naming the process
        that holds it. Where the lock file cannot be made at all (the state dir full, read-only), a lock with
        .error: the recorder keeps its rows in memory until the disk is back (recorder/store.py), and must not be
        refused for it."""
        info: Json = {"pid": os.getpid(), "since": time.time(), "role": role}
        if hands_back:
            info["hands_back"] = True
        try:
            path = collector_dir(cluster, create=True) / name
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return cls(collector_dir(cluster) / name, None, info, error=exc.strerror or str(exc))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}               # the holder has locked it and not written itself in yet
            os.close(fd)
            raise LockHeld(cluster, holder if isinstance(holder, dict) else {}) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError:
            pass                          # held all the same; a refused second writer just cannot name us
        return cls(path, fd, info)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)                  # closing the only descriptor lets the lock go
