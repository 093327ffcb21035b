"""The control-plane HTTP client: short timeouts, bounded bodies, one-line error texts."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

# /metrics of a busy vLLM is ~100 KB; anything past this is not a metrics page.
MAX_BODY = 8 * 1024 * 1024


def make_client(timeout: float = 2.0, *, max_connections: int = 32) -> httpx.AsyncClient:
    # trust_env=False: a desktop's HTTP(S)_PROXY must not capture requests to cluster-LAN addresses.
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections // 2),
        follow_redirects=True, trust_env=False,
        headers={"User-Agent": "sparkconsole", "Accept-Encoding": "gzip"},
    )


@dataclass(frozen=True)
class Reply:
    status: int
    text: str
    seconds: float
    headers: Mapping[str, str] = field(default_factory=dict)   # names lower-cased

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.text)
        except ValueError:
            return None


class FetchError(Exception):
    """Could not get an answer at all (refused, timed out, reset, too large); the message is one line."""


def describe(exc: BaseException, timeout: float | None = None) -> str:
    """A one-line operator-facing text for a transport failure."""
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {timeout:g} s" if timeout else "timed out"
    if isinstance(exc, httpx.ConnectError):
        # httpx says "All connection attempts failed"; the OS error underneath says why.
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, ConnectionRefusedError):
                return "connection refused"
            if isinstance(cause, OSError) and cause.strerror:
                return f"cannot connect: {cause.strerror.lower()}"
            cause = cause.__cause__ or cause.__context__
        text = str(exc) or "connection failed"
        if "refused" in text.lower():
            return "connection refused"
        return " ".join(text.split())[:160]
    if isinstance(exc, httpx.RemoteProtocolError):
        return "server closed the connection without a valid reply"
    text = " ".join(str(exc).split())
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:200]


async def fetch(client: httpx.AsyncClient, url: str, *, limit: int = MAX_BODY, timeout: float | None = None) -> Reply:
    """GET url → Reply (any status). Raises FetchError with a one-line message when no reply came."""
    t0 = time.monotonic()
    try:
        async with client.stream("GET", url, timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT) as r:
            chunks: list[bytes] = []
            size = 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise FetchError(f"reply from {url} larger than {limit // 1048576} MiB")
                chunks.append(chunk)
            body = b"".join(chunks)
            text = body.decode(r.encoding or "utf-8", errors="replace")
            return Reply(r.status_code, text, time.monotonic() - t0,
                         {k.lower(): v for k, v in r.headers.items()})
    except FetchError:
        raise
    except (httpx.HTTPError, OSError, ValueError) as exc:
        eff = timeout
        if eff is None and isinstance(client.timeout, httpx.Timeout):
            eff = client.timeout.read
        raise FetchError(describe(exc, eff)) from None

