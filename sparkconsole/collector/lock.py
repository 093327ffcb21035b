"""One writer per cluster: the collector's directory under the state dir, its OS lock, and who holds it.

    state_dir()/collector/<cluster_key>/        mode 0700, one per cluster file (named as its recorder file)
        lock                                    flock()ed by the process that writes the recorder file; holds
                                                {"pid", "since", "role"} for the refusal line
        sock                                    the collector's Unix socket (collector/server.py), mode 0600

The lock is the kernel's (flock on an open file description): it goes with the process, so a SIGKILLed collector
leaves no stale lock, and a second writer is refused at once with one line naming the first.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from .. import paths
from ..config import ClusterConfig
from ..errors import UserError
from ..recorder.feed import cluster_key

LOCK_NAME = "lock"
SOCKET_NAME = "sock"


def collector_dir(cluster: ClusterConfig, *, create: bool = False) -> Path:
    d = paths.state_dir() / "collector" / cluster_key(cluster)
    if create:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)       # mkdir's mode is masked by the umask: only this user may reach the socket
    return d


def socket_path(cluster: ClusterConfig) -> Path:
    """Where the collector listens (a viewer only looks: nothing is created)."""
    return collector_dir(cluster) / SOCKET_NAME


def describe_holder(info: dict[str, Any]) -> str:
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"sparkconsole {info.get('role') or '?'} (pid {info.get('pid') or '?'}, since {when})"


class WriterLock:
    def __init__(self, path: Path, fd: int | None, info: dict[str, Any], error: str | None = None) -> None:
        self.path = path
        self.info = info
        self.error = error          # why no lock could be taken (the state dir full or read-only), else None
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, cluster: ClusterConfig, role: str) -> WriterLock:
        """The cluster's writer lock, or a UserError naming the process that holds it. Where the lock file cannot
        be made at all (the state dir full, read-only), a lock with .error: the recorder keeps its rows in memory
        until the disk is back (recorder/store.py), and must not be refused for it."""
        info = {"pid": os.getpid(), "since": time.time(), "role": role}
        try:
            path = collector_dir(cluster, create=True) / LOCK_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return cls(collector_dir(cluster) / LOCK_NAME, None, info, error=exc.strerror or str(exc))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                info = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                info = {}                 # the holder has locked it and not written itself in yet
            os.close(fd)
            raise UserError(f"another collector records this cluster already: {describe_holder(info)}",
                            file=cluster.source, fix="stop that one first; the console, status, serve and exporter "
                            "attach to it by themselves") from None
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
