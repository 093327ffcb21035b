"""Watches every node: starts the agent over the node's transport, parses its lines into samples, keeps a
bounded history, marks STALE (3 ticks missed) and DOWN (connection lost), and reconnects by itself with a
capped, jittered back-off.

    mon = ClusterMonitor(cluster)
    unsubscribe = mon.subscribe(lambda node: ...)   # any node's tick or state change; runs on the event loop
    await mon.start(); ...; await mon.stop()        # stop ends the remote agents and closes connections

How the agent gets to a node (nothing is installed there): the console runs `python3 -u -c BOOTSTRAP ARGS`
and writes to its stdin one header line "<len pynvml> <len agent>" followed by the zlib-compressed pynvml
bindings and agent source. The bootstrap keeps the bindings aside (the agent uses the node's own pynvml when it
has one, and compiles the bundled copy only when it wants NVML) and runs the agent with --watch-stdin. stdin then stays open: its end-of-file (console gone, channel closed)
ends the agent within a tick, so no agent outlives its console.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import json
import logging
import random
import time
import zlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..config import ClusterConfig, NodeConfig, SshPolicy
from ..errors import UserError
from ..subscribers import Subscribers
from .connect import make_transport
from .samples import ContainerInfo, NodeInfo, NodeState, Tick
from .transport import LineStream, Transport, TransportError, bounded

log = logging.getLogger(__name__)

STALE_TICKS = 3
FLOOD_BAD_LINES = 1000      # this many bad lines since the last good tick: the node is flooding, drop its stream
BACKOFF_CAP_S = 30.0
MAX_LINE = 1 << 20

# What a node runs (`python3 -u -c BOOTSTRAP`): it reads agent_payload() from stdin, makes the agent's package
# (sparkconsole/agent/) in memory as `scagent`, each module after those it imports, and runs its main loop.
BOOTSTRAP = (
    "import sys,zlib,types\n"
    "r=sys.stdin.buffer\n"
    "h=r.readline().split()\n"
    "sys._sparkconsole_pynvml=r.read(int(h[0]))\n"
    "a=zlib.decompress(r.read(int(h[1])))\n"
    "p=types.ModuleType('scagent');p.__path__=[];sys.modules['scagent']=p\n"
    "sys.argv=['agent']+sys.argv[1:]+['--watch-stdin']\n"
    "o=0\n"
    "for e in h[2:]:\n"
    " k,n=e.decode().split(':');n=int(n);m=types.ModuleType('scagent.'+k)\n"
    " m.__package__='scagent';m.__file__=k+'.py';sys.modules[m.__name__]=m\n"
    " exec(compile(a[o:o+n],m.__file__,'exec'),m.__dict__);o+=n\n"
    "sys.exit(m.main())\n"
)


@lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """What the bootstrap reads from stdin: a header line (the sizes of the compressed pynvml and agent, then each
    agent module's name and size, in the order it runs them), pynvml compressed (may be empty), the agent's modules
    compressed as one."""
    from .. import agent
    folder = Path(agent.__file__).resolve().parent
    sources = [(name, (folder / f"{name}.py").read_bytes()) for name in agent.MODULES]
    nvml = b""
    spec = importlib.util.find_spec("pynvml")
    if spec and spec.origin and spec.origin.endswith(".py"):
        nvml = zlib.compress(Path(spec.origin).read_bytes(), 6)
    bundle = zlib.compress(b"".join(src for _, src in sources), 6)
    header = " ".join([str(len(nvml)), str(len(bundle)), *(f"{name}:{len(src)}" for name, src in sources)])
    return header.encode() + b"\n" + nvml + bundle


def agent_command(python: str, interval: float, extra: tuple[str, ...] = ()) -> list[str]:
    return [python, "-u", "-c", BOOTSTRAP, "--interval", f"{interval:g}", *extra]


# (node monitor, the parsed line, when it was received, the line): what subscribe_lines hears
AgentLine = tuple["NodeMonitor", dict[str, Any], float, str]


class NodeMonitor:
    """One node: its connection, its agent stream, its latest samples and state."""

    def __init__(self, config: NodeConfig, transport: Transport | None, *, interval: float, history: int) -> None:
        self.name = config.name
        self.config = config
        self.transport = transport
        self.interval = interval
        self.state = NodeState.CONNECTING
        self.since = time.time()
        self.info: NodeInfo | None = None
        self.last: Tick | None = None
        self.history: collections.deque[Tick] = collections.deque(maxlen=history)
        self.containers: tuple[ContainerInfo, ...] = ()
        self.containers_rx: float | None = None   # console clock when the last container list came (collector/core.py)
        self.last_error: str | None = None
        self.bad_lines = 0
        self.reboots = 0                   # new boot_id seen in a hello after the first
        self.boot_ids: list[str] = []
        self.connects = 0
        self.last_rx = 0.0                 # time.monotonic() of the last tick
        self._subs: Subscribers[NodeMonitor] = Subscribers("node monitor")
        self._line_subs: Subscribers[AgentLine] = Subscribers("agent line")
        self._task: asyncio.Task[None] | None = None
        self._stream: LineStream | None = None
        self._failures = 0
        self._bad_at_last_tick = 0
        self._stopping = False

    # -------- publishing
    def subscribe(self, cb: Callable[[NodeMonitor], None]) -> Callable[[], None]:
        return self._subs.add(cb)

    def subscribe_lines(self, cb: Callable[[AgentLine], None]) -> Callable[[], None]:
        """cb((node, parsed, received, line)) for each hello and tick line taken, before the node's subscribers hear
        of it: the agent's own words, which the collector passes on to the viewers attached to it (collector/)."""
        return self._line_subs.add(cb)

    def _notify(self) -> None:
        self._subs.notify(self)            # a broken subscriber must not stop telemetry

    def _set_state(self, state: NodeState, error: str | None = None) -> None:
        if error is not None:
            self.last_error = error
        if state != self.state:
            self.state = state
            self.since = time.time()
            self._notify()

    @property
    def tick_interval(self) -> float:
        return (self.info.interval_s if self.info and self.info.interval_s else None) or self.interval

    # -------- lines
    def handle_line(self, line: str, received: float | None = None) -> None:
        """Parse one agent line; anything that is not a hello or a tick is counted in bad_lines and dropped."""
        if len(line) > MAX_LINE:
            self.bad_lines += 1
            return
        try:
            d = json.loads(line)
        except ValueError:
            self.bad_lines += 1
            return
        kind = d.get("type") if isinstance(d, dict) else None
        if kind == "tick":
            seq = d.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                self.bad_lines += 1       # the agent always numbers its ticks: anything else is not one of them
                return
            try:
                tick = Tick.from_json(d, time.time() if received is None else received)
            except (ValueError, TypeError, AttributeError):
                self.bad_lines += 1
                return
            self.last = tick
            self.history.append(tick)
            if self._line_subs:
                self._line_subs.notify((self, d, tick.received, line))
            if tick.containers is not None:
                self.containers = tick.containers
                self.containers_rx = tick.received
            self.last_rx = time.monotonic()
            self._failures = 0
            self._bad_at_last_tick = self.bad_lines
            if self.state != NodeState.LIVE:
                self.last_error = None
                self.state = NodeState.LIVE
                self.since = time.time()
            self._notify()
        elif kind == "hello":
            try:
                info = NodeInfo.from_json(d)
            except (ValueError, TypeError, AttributeError):
                self.bad_lines += 1
                return
            if info.boot_id:
                if self.boot_ids and info.boot_id != self.boot_ids[-1]:
                    self.reboots += 1     # same node, new boot: it rebooted while we were away
                if not self.boot_ids or info.boot_id != self.boot_ids[-1]:
                    self.boot_ids.append(info.boot_id)
            self.info = info
            if self._line_subs:
                self._line_subs.notify((self, d, time.time() if received is None else received, line))
            self._notify()
        else:
            self.bad_lines += 1

    def check_stale(self, now: float) -> None:
        if self.state == NodeState.LIVE and now - self.last_rx > STALE_TICKS * self.tick_interval:
            self._set_state(NodeState.STALE, f"no tick for {now - self.last_rx:.1f} s")

    # -------- the connection loop
    def backoff(self) -> float:
        base = max(2 * self.interval, 1.0)
        delay: float = min(base * (2 ** max(self._failures - 1, 0)), BACKOFF_CAP_S)
        return delay * random.uniform(0.8, 1.2)

    async def run(self) -> None:
        while not self._stopping:
            try:
                await self._session()
                rc = self._stream.returncode if self._stream else None
                reason = "agent ended" + (f" (exit {rc})" if rc is not None else "")
            except asyncio.CancelledError:
                await self._teardown()
                raise
            except (TransportError, UserError) as exc:
                reason = str(exc)
            except Exception as exc:  # noqa: BLE001 — keep watching whatever went wrong
                log.exception("node %s", self.name)
                reason = f"{type(exc).__name__}: {exc}"
            self._failures += 1
            if self.state == NodeState.DOWN:
                self.last_error = reason
                self._notify()
            else:
                self._set_state(NodeState.DOWN, reason)   # said before the (bounded) teardown waits
            await self._teardown(keep_connection=True)
            await asyncio.sleep(self.backoff())

    async def _session(self) -> None:
        t = self.transport
        if t is None:
            raise TransportError("no transport")
        await t.connect()
        self.connects += 1
        stream = t.stream(agent_command(t.python, self.interval, self.config.agent_args), input=agent_payload())
        self._stream = stream
        seen_overlong = 0
        n = 0
        try:
            async for line in stream:
                if stream.overlong != seen_overlong:
                    self.bad_lines += stream.overlong - seen_overlong
                    seen_overlong = stream.overlong
                self.handle_line(line)
                if self.bad_lines - self._bad_at_last_tick > FLOOD_BAD_LINES:
                    # A real agent prints one line per tick; reading a flood only fills memory (asyncssh re-opens
                    # the window as it buffers): drop the stream and come back after the back-off.
                    self._bad_at_last_tick = self.bad_lines
                    raise TransportError(f"{self.name}: more than {FLOOD_BAD_LINES} bad lines in a row; "
                                         "stream dropped")
                n += 1
                if n % 64 == 0:
                    # A flooding node's buffered lines come back without suspending: let the other nodes run.
                    await asyncio.sleep(0)
        finally:
            # An overlong line just before the stream ends has no later line to be counted by.
            self.bad_lines += stream.overlong - seen_overlong

    async def _teardown(self, *, keep_connection: bool = False) -> None:
        """End the agent's stream; close the connection too unless it is still up and may be reused (the
        transport is shared: commands others run over it should not die because the agent did)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(TimeoutError, TransportError, OSError):
                await bounded(stream.close(), 5)
        if self.transport is not None and not (keep_connection and self.transport.connected):
            with contextlib.suppress(TimeoutError, TransportError, OSError):
                await bounded(self.transport.close(), 5)

    def start(self) -> None:
        self._stopping = False           # a viewer stops its own agents while attached and starts them again
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"monitor:{self.name}")

    async def stop(self) -> None:
        self._stopping = True
        stream = self._stream
        task, self._task = self._task, None
        if task is not None:
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=2)   # again if a cancel was swallowed on the way
            if not task.cancelled():
                task.exception()                       # retrieved (logged by run() already)
        # Again, and on the stream seen before the cancel: a second cancel that lands inside the loop's own
        # teardown ends only its wait; the stream's closing goes on, and is waited for here.
        if self._stream is None:
            self._stream = stream
        await self._teardown()


class ClusterMonitor:
    """Every node of the cluster file, watched at once; one staleness timer for all of them."""

    # transport_factory makes a Transport, or what acts as one (collector/attach.py's _LazyTransport)
    def __init__(self, config: ClusterConfig, *,
                 transport_factory: Callable[[NodeConfig, SshPolicy], Any] = make_transport,
                 history: int = 600) -> None:
        self.config = config
        self.nodes: dict[str, NodeMonitor] = {}
        for n in config.nodes:
            err: str | None
            try:
                t = transport_factory(n, config.ssh)
            except (UserError, TransportError) as exc:
                t = None
                err = str(exc)
            else:
                err = None
            nm = NodeMonitor(n, t, interval=config.agent_interval_s, history=history)
            if err:
                nm.state, nm.last_error = NodeState.DOWN, err
            nm.subscribe(self._on_node)
            self.nodes[n.name] = nm
        self._subs: Subscribers[NodeMonitor] = Subscribers("cluster monitor")
        self._watchdog: asyncio.Task[None] | None = None
        self.notes: list[str] = []          # what a replay cannot show (recorder/replay.py), for the console to say

    def subscribe(self, cb: Callable[[NodeMonitor], None]) -> Callable[[], None]:
        return self._subs.add(cb)

    def _on_node(self, node: NodeMonitor) -> None:
        self._subs.notify(node)

    async def start(self) -> None:
        for nm in self.nodes.values():
            if nm.transport is not None:
                nm.start()
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="monitor:stale")

    async def _watch(self) -> None:
        while True:
            period = max(min((nm.tick_interval for nm in self.nodes.values()), default=0.5) / 4, 0.02)
            await asyncio.sleep(period)
            now = time.monotonic()
            for nm in self.nodes.values():
                nm.check_stale(now)

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        await asyncio.gather(*(nm.stop() for nm in self.nodes.values()), return_exceptions=True)

    async def wait_first_ticks(self, timeout: float) -> None:
        """Until every node has ticked once or is DOWN, or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(nm.last is not None or nm.state == NodeState.DOWN for nm in self.nodes.values()):
                return
            await asyncio.sleep(0.05)
