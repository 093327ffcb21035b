"""The HTTP side of the exporter: GET /metrics (Prometheus text, or OpenMetrics when the scraper asks for it),
on aiohttp in the monitors' own event loop, so a scrape reads the readings between two ticks and never races
them. Off loopback every request needs `Authorization: Bearer <token>` (Prometheus: `authorization:
{credentials_file: …}`); a wrong or missing one gets 401 and no hint.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from ..errors import UserError
from .collector import ConsoleCollector
from .listen import Listen, QuietRunner, bearer_ok
from .readings import Readings

INDEX = b"sparkconsole exporter: metrics at /metrics\n"


def make_registry(readings: Readings, *, process: bool = True) -> CollectorRegistry:
    """A registry of our own (not the global one): the console's families, and this process's CPU and memory
    (process_*), which is what an operator checks to see the exporter costs nothing."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ConsoleCollector(readings))
    if process:
        ProcessCollector(registry=reg)
    return reg


def make_app(registry: CollectorRegistry, token: str | None) -> web.Application:
    @web.middleware
    async def auth(request: web.Request, handler):
        if token is not None and not bearer_ok(request.headers.get("Authorization"), token):
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Bearer realm="sparkconsole"'},
                                       text="401: a bearer token is required\n")
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
    return app


class ExporterServer:
    """Readings + the HTTP server; `await start()`, `await stop()`. The port is known after start()."""

    def __init__(self, readings: Readings, listen: Listen, token: str | None, *, own_readings: bool = True) -> None:
        """own_readings=False: the readings are started and stopped by their owner (`record --exporter`)."""
        if not listen.loopback and not token:
            raise UserError(f"{listen.host} is reachable from the network and no token was given",
                            field="--listen", fix="give --token-file FILE (or SPARKCONSOLE_EXPORTER_TOKEN), "
                            "or listen on 127.0.0.1")
        self.readings = readings
        self.listen = listen
        self.registry = make_registry(readings)
        self.app = make_app(self.registry, token)
        self._runner: web.AppRunner | None = None
        self.port = listen.port
        self.own_readings = own_readings

    async def start(self) -> None:
        if self.own_readings:
            await self.readings.start()
        self._runner = QuietRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.listen.host, self.listen.port)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            raise UserError(f"cannot listen on {self.listen.host}:{self.listen.port}: {exc.strerror or exc}",
                            field="--listen", fix="pick a free port") from None
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or ()
        if sockets:
            self.port = sockets[0].getsockname()[1]      # --listen HOST:0 picks a free one

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
