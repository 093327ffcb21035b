"""Who may use a listener: a bearer token, or a user of the web config's `basic_auth_users` (bcrypt hashes), or
either. Shared by `exporter` and `serve`.

A bcrypt check costs ~0.1 s of CPU by design, so it runs in a worker thread (the event loop keeps answering) and
at most two at a time; a pair once checked is remembered as an HMAC under a key made at start (never the password
itself), right or wrong, as the Prometheus exporter toolkit does: Prometheus scraping every second costs one
bcrypt per process, not one per scrape, and a client repeating a wrong password costs none after the first. The
same pair asked again while its check runs waits for that check. At most MAX_WAITING checks wait behind the two
slots; a request past them is answered 429 at once (`Busy`), so clients trying passwords cannot queue a real login
behind seconds of bcrypt. An unknown user costs a bcrypt too, against a dummy hash, so a wrong user name answers no
faster than a wrong password.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping

import bcrypt

from .listen import bearer_ok

MAX_REMEMBERED = 256
SLOTS = 2                 # bcrypt checks at once (each one a worker thread's CPU)
MAX_WAITING = 8           # checks queued behind them (~0.4 s at cost 10); more are answered 429 at once
# An unknown user is checked against this (cost 10, a password nobody has), so it costs what a known one does.
_DUMMY = b"$2b$10$lUoI2oH76J0Lk5oWmr77K.tTjn66jlGhA9nT5lvCiI5yuTiwkIPDa"


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """`Authorization: Basic base64(user:password)` -> (user, password bytes); None for anything else."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(value.strip().encode("ascii", "surrogateescape"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", "surrogateescape"), password


class Busy(Exception):
    """More password checks are waiting than MAX_WAITING: the request is answered 429 at once."""


class BasicUsers:
    """The web config's users and their bcrypt hashes; `await verify(header)`."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        self._key = os.urandom(32)
        self._verified: set[bytes] = set()
        self._refused: set[bytes] = set()
        self._checks = asyncio.Semaphore(SLOTS)
        self._running: dict[bytes, asyncio.Task[bool]] = {}      # mark -> its check, running or waiting a slot
        self.bcrypt_runs = 0          # how many bcrypt checks ran (the cache's worth, read by tests and benchmarks)

    def _mark(self, user: str, password: bytes) -> bytes:
        name = user.encode("utf-8", "surrogateescape")
        return hmac.new(self._key, len(name).to_bytes(4, "big") + name + password, hashlib.sha256).digest()

    async def verify(self, header: str | None) -> bool:
        """Whether the header names a user and its password; raises Busy when too many checks wait already."""
        creds = parse_basic(header)
        if creds is None:
            return False
        user, password = creds
        mark = self._mark(user, password)
        if mark in self._verified:
            return True
        if mark in self._refused:
            return False
        task = self._running.get(mark)
        if task is None:
            if len(self._running) >= SLOTS + MAX_WAITING:
                raise Busy
            # a task of its own: a client that goes away does not cancel a check others may be waiting for
            task = asyncio.ensure_future(self._checked(mark, password, self.users.get(user)))
            self._running[mark] = task
        return await asyncio.shield(task)

    async def _checked(self, mark: bytes, password: bytes, hashed: bytes | None) -> bool:
        try:
            async with self._checks:
                ok = await asyncio.to_thread(self._check, password, hashed if hashed is not None else _DUMMY)
        finally:
            del self._running[mark]
        ok = ok and hashed is not None
        remembered = self._verified if ok else self._refused
        if len(remembered) >= MAX_REMEMBERED:
            remembered.clear()
        remembered.add(mark)
        return ok

    def _check(self, password: bytes, hashed: bytes) -> bool:
        self.bcrypt_runs += 1
        try:
            return bcrypt.checkpw(password, hashed)
        except ValueError:             # longer than bcrypt's 72 bytes, or a hash bcrypt cannot read
            return False


class Access:
    """A listener's rule for every request: open (loopback, nothing configured), a bearer token, basic auth users,
    or either of the two."""

    def __init__(self, token: str | None = None, users: BasicUsers | None = None) -> None:
        self.token = token
        self.users = users if users is not None and users.users else None

    @property
    def required(self) -> bool:
        return self.token is not None or self.users is not None

    async def allows(self, authorization: str | None) -> bool:
        if not self.required:
            return True
        if self.token is not None and bearer_ok(authorization, self.token):
            return True
        return self.users is not None and await self.users.verify(authorization)

    def challenge(self) -> list[tuple[str, str]]:
        """The WWW-Authenticate headers of a 401: Basic first, so a browser asks for a user and password."""
        out = []
        if self.users is not None:
            out.append(("WWW-Authenticate", 'Basic realm="sparkconsole", charset="UTF-8"'))
        if self.token is not None:
            out.append(("WWW-Authenticate", 'Bearer realm="sparkconsole"'))
        return out

    def describe(self) -> str:
        """What a client must send, for the line printed at start (never the token itself)."""
        kinds = (["bearer token"] if self.token is not None else []) + (["basic auth"] if self.users is not None else [])
        return " or ".join(kinds) + " required" if kinds else ""


def as_access(access: Access | str | None) -> Access:
    """An Access from a token (the older calling convention) or as given."""
    return access if isinstance(access, Access) else Access(token=access)
