"""What the operator's OpenSSH client config says about a host: where it is and how to log in.

spark-vllm-docker's runner reaches its workers with a plain `ssh HOST`, so its users keep user, port and key in
~/.ssh/config. sparkconsole names them in the cluster file; this reads them from the same config (asyncssh's
parser, which follows OpenSSH's first-match rules, Match and Include) for `.env` nodes and `sparkconsole init`.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from .config import SshSettings
from .errors import UserError


@dataclass(frozen=True)
class HostEntry:
    alias: str
    address: str                   # HostName, else the alias itself
    ssh: SshSettings
    known_hosts: str | None = None  # the first UserKnownHostsFile, when the config names one
    configured: bool = False       # a Host block other than a catch-all set HostName, User, Port or a key


def default_path() -> Path:
    return Path.home() / ".ssh" / "config"


def lookup(alias: str, path: str | Path | None = None) -> HostEntry:
    """The settings the config gives `alias` (nothing set: the defaults, as `ssh alias` would use)."""
    p = Path(path).expanduser() if path else default_path()
    if not p.is_file():
        return HostEntry(alias, alias, SshSettings())
    from asyncssh.config import SSHClientConfig  # lazy: asyncssh is heavy, and only SSH needs it
    try:
        # () leaves user and port unset, so only the config's own values come back (asyncssh's convention).
        cfg = SSHClientConfig.load(None, [p], False, False, False, getpass.getuser(), (), alias, ())
    except Exception as exc:   # noqa: BLE001 — asyncssh raises its own and OS errors: one line either way
        raise UserError(f"cannot read the SSH client config ({' '.join(str(exc).split())[:200]})", file=str(p),
                        fix="fix the line it names, or check it with `ssh -G HOST`") from None
    # asyncssh types every option `object`: these are the types its parser gives them
    host = cast("str | None", cfg.get("Hostname"))
    user = cast("str | None", cfg.get("User"))
    port = cast("int | None", cfg.get("Port"))
    keys = cast("list[str]", cfg.get("IdentityFile") or [])
    known = cast("list[str]", cfg.get("UserKnownHostsFile") or [])
    settings = SshSettings(user=user or None, port=int(port) if port else 22, identity=str(keys[0]) if keys else None)
    return HostEntry(alias, host or alias, settings, str(known[0]) if known else None,
                     configured=bool(host or user or port or keys))
