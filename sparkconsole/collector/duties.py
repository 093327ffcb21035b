"""The duties of the cluster's collector — recording, the opt-in guard's action, notifications — held by exactly one
process at a time: whoever holds the cluster's writer lock (collector/lock.py).

    duties = core.duties            # built by the core (collector/core.py) for its role (roles.py)
    await duties.start()            # take them now, or when they come free, or (a console) while no collector runs
    duties.held, duties.line()      # "recording, guard and notifications: this console (collector gone)"
    duties.subscribe(cb)            # cb() each time they change hands

`sparkconsole record` takes them at start; when a console holds them (it says `hands_back` in the lock) it waits,
polling the lock every WAIT_POLL_S, for the console to hand them back, which it does as soon as it has attached.
A console attached to the collector holds none; alone (no collector, or the collector gone) it takes them, trying
again every RETRY_S while another process holds the lock, and hands them back when it attaches again.

What is handed over, so that nothing is lost or said twice:
- the recording: the new holder writes its monitors' ticks of the last BACKFILL_S first (a SIGKILLed writer loses
  its last batch; a handback's own second), into the same file (a console that takes over from a collector records
  into the collector's file). Ticks are keyed by node and time: one written twice is one row.
- notifications: alerts the previous holder had raised (the collector's active alerts as the console last heard
  them; the recorder file's alerts whose last word is a raise) count as sent: their raise is not sent again, their
  clear is. Alerts active now that it had not raised are sent at once.
- the guard: its forecasts run in every process; only the holder's stops a container.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..subscribers import Subscribers
from .lock import LockHeld, WriterLock, describe_holder
from .roles import Duty
from .seams import Attaching, EndpointsWatch, Json

if TYPE_CHECKING:
    from ..alerts import Alert
    from ..notify.notifier import Notifier
    from ..recorder.feed import Recorder
    from .core import Collector

log = logging.getLogger(__name__)

RETRY_S = 2.0          # a console alone tries the lock again this often while another process holds it
WAIT_POLL_S = 0.1      # a collector waiting for a console to hand the duties back tries the lock this often
BACKFILL_S = 60.0      # on taking the recording over, the monitors' ticks of this long are written first
ANNOUNCED_SINCE_S = 86400.0   # the recorder file's alerts older than this are not looked at on taking over


def recorded_alerts(path: Path, since: float) -> set[str]:
    """The keys of the alerts whose last event in the recorder file (since `since`) is a raise."""
    from ..recorder.store import connect
    active: dict[str, bool] = {}
    try:
        db = connect(path, readonly=True)
    except Exception:   # noqa: BLE001 — an unreadable file has told nobody anything: nothing counts as sent
        return set()
    try:
        for (data,) in db.execute("SELECT data FROM events WHERE kind='alert' AND t>=? ORDER BY t, id", (since,)):
            with contextlib.suppress(ValueError, TypeError):
                d = json.loads(data)
                active[str(d["key"])] = bool(d.get("active"))
    except Exception:   # noqa: BLE001 — as above
        log.info("recorder file %s: its alerts could not be read", path)
    finally:
        db.close()
    return {key for key, on in active.items() if on}


class Duties:
    def __init__(self, core: Collector) -> None:
        self.core = core
        self.role = core.role
        self.path: str | Path | None = None          # where to record (Collector.records_to)
        self.on_loop = True
        self.on_postmortem: Callable[[Json], None] | None = None
        self.held = False
        self.other: Json | None = None               # who holds them while this process cannot (the lock's holder)
        self.recorder: Recorder | None = None
        self.lock: WriterLock | None = None
        self.notifier: Notifier | None = None
        self.handovers = 0                           # times this process took them over from another
        self.recorded: list[Recorder] = []           # every recorder it opened, closed or not (their counts)
        self._was_attached = False
        self._unsub: list[Callable[[], None]] = []    # the recorder's and notifier's subscriptions while held
        self._subs: Subscribers[None] = Subscribers("duties")
        self._pursuit: asyncio.Task[None] | None = None
        self._handback: asyncio.Task[None] | None = None
        self._unsub_attached: Callable[[], None] | None = None
        self._taking = asyncio.Lock()
        self._closed = False

    @property
    def names(self) -> str:
        return self.role.describe_duties()

    def subscribe(self, cb: Callable[[], None]) -> Callable[[], None]:
        return self._subs.add(lambda _: cb())

    def _attaching(self) -> Attaching | None:
        mon = self.core.monitor
        return mon if self.role.hands_back and isinstance(mon, Attaching) else None

    def attaching(self) -> bool:
        """Whether these duties follow the monitor's collector (a console over an attaching monitor)."""
        return bool(self.role.duties) and self._attaching() is not None

    def line(self) -> str:
        """Whose duties they are now, for a console's header: '' where nobody else could hold them."""
        mon = self._attaching()
        if mon is None or not self.role.duties:
            return ""
        if self.held:
            who = "this console " + ("(handing back to the collector)" if mon.attached else
                                     "(collector gone)" if self._was_attached else "(no collector)")
        elif mon.attached:
            who = f"the collector (pid {mon.collector.get('pid')})" if mon.collector else "the collector"
        elif self.other is not None:
            who = describe_holder(self.other)
        else:
            return ""
        return f"{self.names}: {who}"

    # --- taking them --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """At the core's start: a console attached to a collector leaves them to it (and takes them whenever it is
        alone); any other role takes them now, or keeps trying (a collector waiting for a console's handback)."""
        if not self.role.duties:
            return
        mon = self._attaching()
        if mon is not None:
            self._unsub_attached = mon.subscribe_attached(self._attached_changed)
            self._was_attached = mon.attached
            if mon.attached:
                self._subs.notify(None)
                return
        if await self.take():
            return
        if not (self.role.hands_back or (self.other or {}).get("hands_back")):
            raise LockHeld(self.core.cluster, self.other or {})    # another collector: refused, naming it
        self.pursue(now=False)

    def pursue(self, *, now: bool) -> None:
        """Keep trying until they are held (or, a console, until it attaches); the first try at once (now)."""
        if self._pursuit is None or self._pursuit.done():
            self._pursuit = asyncio.get_running_loop().create_task(self._pursue(now), name="collector:duties")

    async def _pursue(self, now: bool) -> None:
        every = RETRY_S if self.role.hands_back else WAIT_POLL_S
        while not self.held and not self._closed and not self._attached_now():
            if not now:
                await asyncio.sleep(every)
            now = False
            if not self._attached_now():
                await self.take()

    async def stop_pursuing(self) -> None:
        """At the core's stop: no more taking or handing back."""
        for task in (self._pursuit, self._handback):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._pursuit = self._handback = None

    def _attached_now(self) -> bool:
        mon = self._attaching()
        return mon is not None and mon.attached

    def _attached_changed(self, attached: bool) -> None:
        if attached:
            self._was_attached = True
            if self.held and (self._handback is None or self._handback.done()):
                self._handback = asyncio.get_running_loop().create_task(self._hand_back_settled(),
                                                                         name="collector:hand-back")
        elif not self._closed:
            self.pursue(now=True)          # the collector is gone: take them now
        self._subs.notify(None)

    async def take(self) -> bool:
        """Take the duties if the lock can be had now; False (and .other set) while another process holds it."""
        async with self._taking:
            if self.held or self._closed or self._attached_now():
                return self.held
            lock = None
            if self.role.locked:
                try:
                    lock = WriterLock.acquire(self.core.cluster, self.role.name, hands_back=self.role.hands_back)
                except LockHeld as exc:
                    if exc.holder != self.other:
                        self.other = exc.holder
                        self._subs.notify(None)
                    return False
                if lock.error:
                    log.warning("recorder writer lock not taken (%s): recording without it", lock.error)
            try:
                announced = await self._announced()
                if self._closed or self._attached_now():      # it attached (or stopped) meanwhile: not ours
                    if lock is not None:
                        lock.release()
                    return False
                self._hold(lock, announced)
            except BaseException:
                if lock is not None and self.lock is not lock:
                    lock.release()
                raise
        return True

    def record_path(self) -> Path | None:
        """Where this process records while it holds the duties; None where it does not record."""
        if Duty.RECORD not in self.role.duties or not self.core.cluster.recorder.enabled:
            return None
        if self.path is not None:
            return Path(self.path)
        mon = self._attaching()
        theirs = mon.collector.get("recorder") if mon is not None and mon.collector else None
        if isinstance(theirs, str) and theirs:
            return Path(theirs)          # the collector's file: the recording goes on where it was
        from ..recorder.feed import recorder_path
        return recorder_path(self.core.cluster)

    async def _announced(self) -> set[str]:
        """Alerts the previous holder raised (and so sent): the collector's as this console last heard them, and
        the recorder file's."""
        keys: set[str] = set()
        mon = self._attaching()
        if mon is not None:
            keys |= {k for k, a in mon.collector_alerts.items() if a.get("active")}
        path = self.record_path()
        if path is not None and path.exists() and Duty.NOTIFY in self.role.duties:
            keys |= await asyncio.to_thread(recorded_alerts, path, time.time() - ANNOUNCED_SINCE_S)
        return keys

    def _hold(self, lock: WriterLock | None, announced: set[str]) -> None:
        core, cluster = self.core, self.core.cluster
        had = self.other
        rec = self._open_recorder(lock)
        self.lock, self.recorder = lock, rec
        if rec is not None:
            self._backfill(rec)
            rec.attach(core.monitor)
            rec.attach_alerts(core.alerts)
            if core.serving is not None:
                self._unsub.append(core.serving.subscribe(rec.on_endpoint))
        guardian = core.guardian
        if guardian is not None and Duty.GUARD in self.role.duties:
            guardian.recorder = rec
            guardian.threshold_s = cluster.protect.stop_container_before_exhaustion_s
        if Duty.NOTIFY in self.role.duties and not self.role.replay:
            self._notify(announced)
        self.held, self.other = True, None
        if had is not None or self._was_attached:
            self.handovers += 1
            core.say(f"took over {self.names} from {describe_holder(had) if had else 'the collector'}", "info")
        self._subs.notify(None)

    def _open_recorder(self, lock: WriterLock | None) -> Recorder | None:
        """The recorder file opened. A console whose file cannot be opened says so and holds the other duties all
        the same (a disk problem must not take its guard down); `record` and the demo stop on it."""
        from ..recorder.feed import Recorder
        path = self.record_path()
        if path is None:
            return None
        try:
            rec = Recorder.open(self.core.cluster, path, on_status=self.core.say, on_loop=self.on_loop)
        except Exception as exc:
            if not self.role.hands_back:
                if lock is not None:
                    lock.release()
                raise
            self.core.say(f"flight recorder off: {' '.join(str(exc).split())[:200]}", "warn")
            return None
        if rec is not None:
            rec.on_postmortem = self.on_postmortem
            self.recorded.append(rec)
        return rec

    def _backfill(self, rec: Recorder) -> None:
        since = time.time() - BACKFILL_S
        for nm in self.core.monitor.nodes.values():
            for tick in list(nm.history):
                if tick.received >= since:
                    rec.store.put_tick(nm.name, tick, nm.config.container)

    def _notify(self, announced: set[str]) -> None:
        from ..notify.notifier import Notifier
        core = self.core
        self.notifier = notifier = Notifier(core.cluster.notify, bell=core.bell or (lambda: None),
                                            cluster=core.cluster.source)
        notifier.announced(announced)
        for alert in list(core.alerts.active.values()):
            if alert.key not in announced:
                notifier.submit(alert)        # raised while nobody sent: sent now, once

        def send(alert: Alert) -> None:
            notifier.submit(alert)            # False when filtered or rate-limited: nothing to do then
        self._unsub.append(core.alerts.subscribe(send))

    def serving_started(self, serving: EndpointsWatch) -> None:
        """A serving monitor made after the duties were taken (a launch followed): its polls are recorded too."""
        if self.recorder is not None:
            self._unsub.append(serving.subscribe(self.recorder.on_endpoint))

    # --- handing them back --------------------------------------------------------------------------------------
    async def _hand_back_settled(self) -> None:
        """Once the post-mortems under way are written (an incident this console recorded is explained in its own
        file; seconds), unless the collector went again meanwhile. Until then this console still holds them all."""
        rec = self.recorder
        if rec is not None:
            await rec.wait_postmortems()
        if self._attached_now():
            self.hand_back()

    def hand_back(self) -> None:
        """The collector is back: recording, guard and notifications are its own again. What the recorder queued is
        committed and the file closed before the lock goes; what the notifier queued is still sent."""
        if not self.held:
            return
        self._let_go(flush_s=0.0)
        self.core.say(f"handed {self.names} back to the collector", "info")
        self._subs.notify(None)

    def _let_go(self, *, flush_s: float, closing: bool = False) -> None:
        self.held = False
        for unsub in self._unsub:
            unsub()
        self._unsub.clear()
        if self.core.guardian is not None:
            self.core.guardian.threshold_s = 0
            self.core.guardian.recorder = None
        rec = self.recorder
        if not closing:
            self.recorder = None          # (at the end it stays, closed: its file and counts are still asked for)
        if rec is not None:
            rec.close()
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()
        notifier, self.notifier = self.notifier, None
        if notifier is not None:
            if flush_s > 0:
                notifier.flush(flush_s)
            notifier.close()              # its sender thread still sends what it queued, then ends

    def close(self, *, flush_s: float = 0.0) -> None:
        """At the core's end: let go of whatever is held, once."""
        if self._closed:
            return
        self._closed = True
        if self._unsub_attached is not None:
            self._unsub_attached()
            self._unsub_attached = None
        if self.held:
            self._let_go(flush_s=flush_s, closing=True)
