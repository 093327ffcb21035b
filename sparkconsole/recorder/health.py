"""What the recorder's writer says about its file: each fault once, in one line naming the file and the fix, and
when it is over, what it cost. recorder/store.py calls these from its writer thread; `say(text, severity)` is
the store's (log + the console's or `record`'s on_status).

    recorder: cannot write /…/c-1a2b.sqlite: the disk is full (0 B free) — fix: free space on that filesystem, or
      record elsewhere (--file PATH or SPARKCONSOLE_STATE_DIR); rows wait in memory and are written once it can
    recorder: writing /…/c-1a2b.sqlite again: the 240 rows held while it could not are in it
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .damage import is_damage

RETRY_NOTE = "rows wait in memory and are written once it can"


def _free(d: Path) -> str:
    while not d.exists() and d != d.parent:
        d = d.parent
    try:
        n = float(shutil.disk_usage(d).free)
    except OSError:
        return "free space unknown"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit} free" if unit == "B" else f"{n:.1f} {unit} free"
        n /= 1024
    return ""


def _probe(d: Path) -> int | None:
    """The errno of creating a file in d (or the nearest existing directory above), None when it can: SQLite's
    own error ("disk I/O error", "readonly database") does not say whether the disk, the filesystem or the
    permissions refused, and a filesystem turned read-only after a disk error still reads "rw" in statvfs."""
    while not d.exists() and d != d.parent:
        d = d.parent
    probe = d / f".sparkconsole-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        probe.unlink()
        return None
    except OSError as exc:
        return exc.errno


def diagnose(exc: BaseException, path: Path) -> tuple[str, str]:
    """(kind, one line) for an error opening or writing the recorder file."""
    text = " ".join(str(exc).split())[:100]
    name = getattr(exc, "sqlite_errorname", "") or ""
    d = path.parent
    code = getattr(exc, "errno", None) or _probe(d)
    elsewhere = "or record elsewhere (--file PATH or SPARKCONSOLE_STATE_DIR)"
    if name.startswith("SQLITE_FULL") or code in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in text:
        return "full", (f"recorder: cannot write {path}: the disk is full ({_free(d)}) — fix: free space on that "
                        f"filesystem, {elsewhere}; {RETRY_NOTE}")
    if code in (errno.ENOTDIR, errno.EEXIST) or isinstance(exc, (NotADirectoryError, FileExistsError)):
        return "not-dir", (f"recorder: cannot write {path}: {d} or a directory above it is not a directory — fix: "
                           f"move what is there aside, {elsewhere}; {RETRY_NOTE}")
    if code == errno.EROFS:
        return "read-only-fs", (f"recorder: cannot write {path}: its filesystem is read-only — fix: remount it "
                                f"read-write (check dmesg: a disk error can cause it), {elsewhere}; {RETRY_NOTE}")
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")) \
            or code in (errno.EACCES, errno.EPERM) or isinstance(exc, PermissionError):
        return "denied", (f"recorder: cannot write {path}: {text} — fix: let this user write {d} and the file "
                          f"(chmod u+w), {elsewhere}; {RETRY_NOTE}")
    return "io", f"recorder: cannot write {path}: {text} — fix: check the disk (dmesg), {elsewhere}; {RETRY_NOTE}"


class Health:
    def __init__(self, path: Path, say: Callable[[str, str], None]) -> None:
        self.path = path
        self.say = say
        self.trouble: str | None = None     # the current fault's line; None while writing works
        self._kind: str | None = None
        self.held = 0                       # rows waiting in memory, at most
        self.dropped = 0                    # rows lost: held past the memory cap, or still held at exit
        self._dropped_now = 0
        self._drop_span: list[float] = []
        self.set_asides: list[Path] = []

    @staticmethod
    def is_damage(exc: BaseException) -> bool:
        return is_damage(exc, reading=False)

    def failed(self, exc: BaseException) -> None:
        kind, line = diagnose(exc, self.path)
        if kind != self._kind:
            self.say(line, "bad")
        self.trouble, self._kind = line, kind

    def drop(self, item: tuple[Any, ...]) -> None:
        if not self._dropped_now:
            self.say(f"recorder: {self.path} still cannot be written and the memory cap is reached: the oldest "
                     "held rows are dropped from now on (counted, and said when it can write again)", "bad")
        self.dropped += 1
        self._dropped_now += 1
        t = item[2]
        self._drop_span = [min(self._drop_span[0], t), max(self._drop_span[1], t)] if self._drop_span else [t, t]

    def written(self, n: int) -> None:
        if self.trouble is None:
            return
        text = f"recorder: writing {self.path} again: the {n} rows held while it could not are in it"
        if self._dropped_now:
            a, b = (time.strftime("%H:%M:%S", time.localtime(x)) for x in self._drop_span)
            text += f"; {self._dropped_now} older rows were dropped (recorded {a} to {b})"
        self.say(text, "warn" if self._dropped_now else "info")
        self.trouble = self._kind = None
        self._dropped_now = 0
        self._drop_span = []

    def moved(self, how: str) -> None:
        self.say(f"recorder: {self.path} was {how} while recording — a new file is started at that path; the rows "
                 f"written before are in the {how} file, not this one", "warn")

    def set_aside(self, exc: BaseException, aside: Path, counts: dict[str, int] | None, gaps: list[str], *,
                  copy_failed: BaseException | None = None) -> None:
        err = " ".join(str(exc).split())[:80]
        self.set_asides.append(aside)
        if copy_failed is not None:
            why = " ".join(str(copy_failed).split())[:80]
            self.say(f"recorder: {self.path} was damaged ({err}) — kept as {aside}; copying its readable rows into a "
                     f"new file failed ({why}) — fix: `sparkconsole record repair {aside}` once there is room; "
                     f"recording goes on in a new {self.path.name}", "bad")
            return
        if counts is None:
            self.say(f"recorder: {self.path} is damaged ({err}) and nothing in it is readable — kept as {aside}; "
                     f"recording goes on in a new {self.path.name}", "bad")
            return
        lost = f"; unreadable: {gaps[0]}" + (f" and {len(gaps) - 1} more" if len(gaps) > 1 else "") if gaps else ""
        self.say(f"recorder: {self.path} was damaged ({err}) — kept as {aside}; the {sum(counts.values())} readable "
                 f"rows are copied into a new {self.path.name}{lost}; recording goes on", "bad")

    def unwritten(self, n: int) -> None:
        self.dropped += n
        self.say(f"recorder: {n} rows held in memory could not be written to {self.path} before exit (still "
                 "failing, as said above): they are lost", "bad")
