"""Sends alerts (warn/bad, raised and cleared) to a webhook, an ntfy-style topic URL and the terminal bell.

    n = Notifier(cluster.notify, bell=app.bell)     # starts one sender thread when a URL is configured
    alerts.subscribe(n.submit)                      # submit() never blocks: the UI thread only queues
    n.close()

- Filter: alerts under min_severity are not sent (their clears neither).
- De-dup and rate limit: one message per alert key and state within rate_limit_s; a clear is sent only when
  its raise was sent, and always passes the rate limit (an operator must learn that it is over).
- Delivery: HTTP POST with a 5 s timeout, retried RETRIES times with doubling back-off on a network error or a
  5xx; the queue is bounded (oldest dropped, counted). All of it in the sender thread.
- Secrets: the URLs are registered with sparkconsole/secrets.py, and whatever this module logs or reports
  goes through redact_url(): no token in a URL (user:password@, a query value, a long path segment such as an
  ntfy topic) is ever shown.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

from .. import secrets
from ..config import NotifySettings

if TYPE_CHECKING:
    from ..alerts import Alert

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
RETRIES = 3
BACKOFF_S = 1.0
QUEUE_MAX = 200
_RANK = {"info": 0, "warn": 1, "bad": 2}
_TOKENISH = re.compile(r"^[A-Za-z0-9_\-.~]{16,}$")


def redact_url(url: str) -> str:
    """scheme://host[:port]/path with user info, query values and token-like path segments masked."""
    try:
        p = urlsplit(url)
    except ValueError:
        return secrets.MASK
    host = p.hostname or ""
    netloc = ("***@" if p.username or p.password else "") + (f"[{host}]" if ":" in host else host) + \
        (f":{p.port}" if p.port else "")
    path = "/".join(secrets.MASK if _TOKENISH.match(seg) else seg for seg in p.path.split("/"))
    query = "&".join(kv.split("=", 1)[0] + "=" + secrets.MASK for kv in p.query.split("&") if kv) if p.query else ""
    return urlunsplit((p.scheme, netloc, path, query, ""))


def _register_url(url: str) -> None:
    p = urlsplit(url)
    for v in (p.password, p.username, *(kv.split("=", 1)[-1] for kv in p.query.split("&") if kv),
              *(seg for seg in p.path.split("/") if _TOKENISH.match(seg))):
        secrets.register(v)


class Notifier:
    def __init__(self, settings: NotifySettings, *, bell: Callable[[], None] | None = None,
                 cluster: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.bell = bell
        self.cluster = cluster
        self.clock = clock
        self.sent: list[tuple[str, str]] = []     # (target, redacted url) of deliveries that succeeded
        self.failures: list[str] = []             # one redacted line per delivery given up
        self.dropped = 0
        self._last: dict[tuple[str, bool], float] = {}   # (key, active) -> when last sent
        self._raised_sent: set[str] = set()
        self._q: collections.deque[Alert] = collections.deque(maxlen=QUEUE_MAX)
        self._cv = threading.Condition()
        self._busy = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        for url in (settings.webhook, settings.ntfy):
            if url:
                _register_url(url)
        if settings.webhook or settings.ntfy:
            self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
            self._thread.start()

    # ---- the producer side (UI thread): filter, de-dup, queue
    def submit(self, alert: Alert) -> bool:
        """Queue one alert (alerts.Alert); False when filtered, de-duplicated or rate-limited."""
        if _RANK.get(alert.severity, 0) < _RANK[self.settings.min_severity]:
            return False
        now = self.clock()
        if alert.active:
            last = self._last.get((alert.key, True))
            if last is not None and now - last < self.settings.rate_limit_s:
                return False
            self._raised_sent.add(alert.key)
        else:
            if alert.key not in self._raised_sent:
                return False                  # its raise was never sent: its clear means nothing to the reader
            self._raised_sent.discard(alert.key)
        self._last[(alert.key, alert.active)] = now
        if alert.active and alert.severity == "bad" and self.settings.bell and self.bell is not None:
            with contextlib.suppress(Exception):  # a terminal that cannot ring is no reason to lose the alert
                self.bell()
        if self._thread is None:
            return True
        with self._cv:
            if len(self._q) == self._q.maxlen:
                self.dropped += 1
            self._q.append(alert)
            self._cv.notify()
        return True

    def announced(self, keys: Iterable[str]) -> None:
        """Alerts that another process raised and sent before this one took the notifications over (the collector
        and a console hand them to each other: collector/duties.py): their raise counts as sent here, so it is not
        sent again within rate_limit_s, and their clear is sent."""
        now = self.clock()
        for key in keys:
            self._raised_sent.add(key)
            self._last[(key, True)] = now

    def flush(self, timeout: float = 60.0) -> bool:
        """Until the queue is empty and nothing is in flight (tests, and `record` before it exits)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while (self._q or self._busy) and time.monotonic() < deadline:
                self._cv.wait(0.05)
            return not self._q and not self._busy

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    # ---- the sender thread
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._closed:
                    self._cv.wait()
                if not self._q and self._closed:
                    return
                alert = self._q.popleft()
                self._busy += 1
            try:
                if self.settings.webhook:
                    self._deliver("webhook", self.settings.webhook, *self._webhook(alert))
                if self.settings.ntfy:
                    self._deliver("ntfy", self.settings.ntfy, *self._ntfy(alert))
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def _webhook(self, a: Alert) -> tuple[bytes, dict[str, str]]:
        body = {"source": "sparkconsole", "cluster": self.cluster, "key": a.key, "severity": a.severity,
                "node": a.source, "message": secrets.redact(a.message), "time": a.time,
                "state": "raised" if a.active else "cleared"}
        return json.dumps(body).encode(), {"Content-Type": "application/json"}

    def _ntfy(self, a: Alert) -> tuple[bytes, dict[str, str]]:
        title = f"sparkconsole {a.source}: {'cleared' if not a.active else a.severity}"
        prio = "high" if a.active and a.severity == "bad" else "default"
        return secrets.redact(a.message).encode(), {"Title": title, "Priority": prio,
                                                    "Tags": "warning" if a.active else "white_check_mark"}

    def _deliver(self, target: str, url: str, body: bytes, headers: dict[str, str]) -> None:
        p = urlsplit(url)
        if p.username or p.password:
            # urllib does not take user:password@ from the URL: send it as HTTP basic auth instead
            cred = base64.b64encode(f"{unquote(p.username or '')}:{unquote(p.password or '')}".encode()).decode()
            headers = {**headers, "Authorization": f"Basic {cred}"}
            host = p.hostname or ""
            url_plain = urlunsplit((p.scheme, (f"[{host}]" if ":" in host else host) + (f":{p.port}" if p.port else ""),
                                    p.path, p.query, ""))
        else:
            url_plain = url
        delay = BACKOFF_S
        why = ""
        for attempt in range(RETRIES + 1):
            try:
                req = urllib.request.Request(url_plain, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                    resp.read(1024)
                self.sent.append((target, redact_url(url)))
                return
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
                if exc.code < 500:
                    break                     # the receiver refuses it: retrying will not help
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                why = type(getattr(exc, "reason", exc)).__name__
            if attempt < RETRIES:
                with self._cv:
                    if self._closed:
                        break
                time.sleep(delay)
                delay *= 2
        line = f"notify: {target} {redact_url(url)} gave up: {why}"
        self.failures.append(line)
        log.warning("%s", line)
