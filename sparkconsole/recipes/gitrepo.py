"""A registry's git repository on this machine, with the real `git`: cloned sparse (its manifest, then the folders
its sections name), updated only when the remote moved, and never left half-cloned.

URLs: https://, ssh:// and scp-like `user@host:path`, and file:// (a local repository); nothing else reaches git
(no http://, no `ext::`, nothing that starts with `-`). git never asks for a password (GIT_TERMINAL_PROMPT=0):
a private repository without a key fails with git's own reason, in one line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ..errors import UserError

T = TypeVar("T")
GIT_TIMEOUT_S = 120.0
_SCP = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9._~/-]+$")
_URL = re.compile(r"^(https|ssh|file)://[^\s]+$")
# git's words for "the network is not there" (DNS, routing, a refused connection)
_OFFLINE = ("Could not resolve host", "Network is unreachable", "Failed to connect", "Connection timed out",
            "Temporary failure in name resolution", "Could not resolve hostname", "No route to host")


def check_url(url: str) -> str:
    url = url.strip()
    if url.startswith("-") or not (_URL.match(url) or _SCP.match(url)):
        scheme = url.split("://", 1)[0] + "://" if "://" in url else url[:20]
        raise UserError(f"registry URL scheme {scheme!r} is not allowed", field="URL",
                        fix="use an https://, ssh:// (or git@host:path) or file:// URL")
    return url


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="", SSH_ASKPASS="", GCM_INTERACTIVE="never",
               GIT_CONFIG_NOSYSTEM="1")
    return env


def git(args: Sequence[str], *, cwd: Path | None = None, timeout: float = GIT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=_env(), check=False)
    except FileNotFoundError:
        raise UserError("git is not installed", field="git", fix="install git (registries are git repositories)") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"git {args[0]} took longer than {timeout:g} s", field="URL",
                        fix="check the network, then run it again") from None


def failure(res: subprocess.CompletedProcess[str], url: str, what: str) -> UserError:
    text = " ".join((res.stderr or res.stdout or "").split())
    if any(m in text for m in _OFFLINE):
        host = re.sub(r"^[a-z]+://", "", url).split("/", 1)[0].split("@")[-1].split(":")[0]
        return UserError(f"no network: cannot reach {host}", field="URL",
                         fix="connect this machine to the network, then run `sparkconsole recipe registry update`")
    reason = text.replace("fatal: ", "")[:200] or f"git exited with code {res.returncode}"
    return UserError(f"git could not {what} {url[:100]}: {reason}", field="URL",
                     fix="check the URL and that you may read the repository")


def clone(url: str, dest: Path, prepare: Callable[[Path], T]) -> T:
    """A sparse clone of the default branch's newest commit into `dest` (which must not exist): its manifest
    first, then `prepare(repo)` (which reads it and checks out the folders it names). Built in a temporary folder
    beside `dest` and renamed into place only when all of it worked: a failure leaves nothing behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        args = ["clone", "--quiet", "--depth", "1", "--filter=blob:none", "--sparse", "--", url, str(tmp / "repo")]
        res = git(args)
        if res.returncode != 0:
            raise failure(res, url, "clone")
        set_sparse(tmp / "repo", [".sparkrun"], url)
        out = prepare(tmp / "repo")
        (tmp / "repo").rename(dest)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def set_sparse(repo: Path, paths: Sequence[str], url: str) -> None:
    if "/" in paths:
        res = git(["sparse-checkout", "disable"], cwd=repo)
    else:
        res = git(["sparse-checkout", "set", "--", *sorted(set(paths))], cwd=repo)
    if res.returncode != 0:
        raise failure(res, url, "check out the folders of")


def head(repo: Path) -> str | None:
    res = git(["rev-parse", "HEAD"], cwd=repo, timeout=30)
    return res.stdout.strip() if res.returncode == 0 else None


def remote_head(url: str) -> str:
    res = git(["ls-remote", "--", url, "HEAD"])
    if res.returncode != 0:
        raise failure(res, url, "reach")
    first = res.stdout.split()
    if not first:
        raise UserError(f"{url[:100]} has no default branch", field="URL", fix="check the URL")
    return first[0]


def update(repo: Path, url: str) -> bool:
    """Brings the clone to the remote's newest commit; False when it already was (nothing fetched)."""
    if remote_head(url) == head(repo):
        return False
    res = git(["fetch", "--quiet", "--depth", "1", "--filter=blob:none", "origin", "HEAD"], cwd=repo)
    if res.returncode != 0:
        raise failure(res, url, "fetch")
    res = git(["reset", "--quiet", "--hard", "FETCH_HEAD"], cwd=repo, timeout=60)
    if res.returncode != 0:
        raise failure(res, url, "update")
    return True
