"""The HTTP side of the exporter: GET /metrics (Prometheus text, or OpenMetrics when the scraper asks for it),
on aiohttp in the monitors' own event loop, so a scrape reads the readings between two ticks and never races
them. Off loopback every request needs `Authorization: Bearer <token>` (Prometheus: `authorization:
{credentials_file: …}`) or a web config's basic auth user (`basic_auth: {username, password_file}`); a wrong or
missing one gets 401 and no hint. With the web config's tls_server_config it answers HTTPS only.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from ..errors import UserError
from .access import Access, as_access
from .collector import ConsoleCollector
from .listen import Listen, QuietRunner
from .listener import Listener, add_headers, allowed, as_listener, start_site

if TYPE_CHECKING:
    from ..collector.core import Collector

INDEX = b"sparkconsole exporter: metrics at /metrics\n"


def make_registry(readings: Collector, *, process: bool = True) -> CollectorRegistry:
    """A registry of our own (not the global one): the console's families, and this process's CPU and memory
    (process_*), which is what an operator checks to see the exporter costs nothing."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ConsoleCollector(readings))
    if process:
        ProcessCollector(registry=reg)
    return reg


def make_app(registry: CollectorRegistry, access: Access | str | None,
             headers: dict[str, str] | None = None) -> web.Application:
    access = as_access(access)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not await allowed(access, request.headers.get("Authorization")):
            raise web.HTTPUnauthorized(headers=access.challenge(), text=f"401: {access.describe()}\n")
        return await handler(request)

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=INDEX, content_type="text/plain")

    app = web.Application(middlewares=[auth])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", index)
    add_headers(app, headers or {})
    return app


class ExporterServer:
    """Readings + the HTTP(S) server; `await start()`, `await stop()`. The port is known after start().
    `listen`: a Listener (listener.make_listener: TLS, basic auth, token), or a bare Listen with `token`."""

    # readings: exporter/readings.Readings, or the collector core it extends (`record --exporter` passes its own)
    def __init__(self, readings: Collector, listen: Listen | Listener, token: str | None = None, *,
                 own_readings: bool = True) -> None:
        """own_readings=False: the readings are started and stopped by their owner (`record --exporter`)."""
        self.listener = as_listener(listen, token)
        self.listener.refuse_open_network(
            "give --token-file FILE (or SPARKCONSOLE_EXPORTER_TOKEN), basic_auth_users in --web-config-file, "
            "or listen on 127.0.0.1")
        self.readings = readings
        self.listen = self.listener.listen
        self.registry = make_registry(readings)
        self.app = make_app(self.registry, self.listener.access, dict(self.listener.headers))
        self._runner: web.AppRunner | None = None
        self.port = self.listen.port
        self.own_readings = own_readings

    def url(self, path: str = "/metrics") -> str:
        return self.listener.url(path, port=self.port)

    async def start(self) -> None:
        if self.own_readings:
            await self.readings.start()
        self._runner = QuietRunner(self.app, access_log=None)
        await self._runner.setup()
        try:
            self.port = await start_site(self._runner, self.listener)
        except UserError:
            self._runner = None          # start_site cleaned it up
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self.own_readings:
            await self.readings.stop()

    async def serve_forever(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()
