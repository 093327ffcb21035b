"""The real earlyoom for the guard's tests: the one on PATH, else Debian's package unpacked (never installed: an
installed one would start a daemon that kills processes) into the test bed's cache. Tests run it with --dryrun."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.testbed.cache import TestbedError, cache_root, locked


def earlyoom_binary() -> Path:
    found = shutil.which("earlyoom")
    if found:
        return Path(found)
    exe = cache_root() / "earlyoom" / "usr" / "bin" / "earlyoom"
    with locked("earlyoom"):
        if exe.exists():
            return exe
        with tempfile.TemporaryDirectory(prefix="earlyoom-deb-") as tmp:
            Path(tmp).chmod(0o777)       # apt's download sandbox user writes here
            r = subprocess.run(["apt-get", "download", "-q", "earlyoom"], cwd=tmp, capture_output=True, text=True,
                               timeout=300)
            debs = list(Path(tmp).glob("earlyoom_*.deb"))
            if r.returncode != 0 or not debs:
                raise TestbedError(f"apt-get download earlyoom failed: {(r.stderr or r.stdout).strip()[-300:]}")
            subprocess.run(["dpkg", "-x", str(debs[0]), str(exe.parents[2])], check=True, timeout=60)
    if not exe.exists():
        raise TestbedError(f"the earlyoom package held no {exe.relative_to(exe.parents[2])}")
    return exe
