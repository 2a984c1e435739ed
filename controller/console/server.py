"""The console's life: wire it to a running controller, bind, serve on the same loop, stop.

What it decides: construction and lifecycle order. :meth:`Console.start` chains the traffic
history behind the outcome aggregator's tap (:mod:`controller.console.tap`), binds the HTTP
port (TLS with the controller's own certificate when it serves TLS) and starts the tick;
:meth:`Console.close` ends every event stream and stops listening — before the controller
ends its gRPC streams, so no page watches a controller that is going away.

Why on the controller's loop rather than a thread: every piece of state the console shows has
one owner, the controller's loop, and the console reads it there, between RPCs, exactly as a
servicer method does; nothing is copied across threads or locked.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

from aiohttp import web

from common.auth import AuthPolicy
from common.credentials import is_loopback
from common.serving import TlsOptions, format_hostport, parse_hostport
from controller.app import Controller
from controller.console.access import AccessPolicy
from controller.console.app import build_app
from controller.console.history import TrafficHistory
from controller.console.live import LiveState
from controller.console.operations import Operations
from controller.console.snapshot import Snapshots
from controller.console.tap import chain_tap

__all__ = ["Console", "ConsoleConfig"]

_log = logging.getLogger("halcyon.controller.console")


@dataclass(frozen=True)
class ConsoleConfig:
    """Where the console listens and what it keeps."""

    listen: str = "127.0.0.1:9440"
    tls: TlsOptions | None = None  # serve HTTPS with this certificate and key
    tick_s: float = 1.0
    history_s: float = 300.0
    session_ttl_s: float = 8 * 3600.0


class Console:
    """The operator console of one controller."""

    def __init__(self, controller: Controller, auth: AuthPolicy, config: ConsoleConfig) -> None:
        host, _ = parse_hostport(config.listen)
        self.config = config
        self._host = host
        self.history = TrafficHistory(controller.clock, horizon_s=config.history_s)
        self.operations = Operations(controller.servicer)
        self.snapshots = Snapshots(
            self.operations,
            self.history,
            controller.view,
            controller.wall,
            lease_ttl_s=controller.config.lease_ttl_s,
        )
        self.live = LiveState(
            self.snapshots,
            self.history,
            controller.registry,
            controller.outcomes,
            tick_s=config.tick_s,
        )
        self.policy = AccessPolicy(
            auth,
            controller.clock,
            loopback=is_loopback(host),
            session_ttl_s=config.session_ttl_s,
        )
        self._controller = controller
        self._app = build_app(
            self.policy,
            self.operations,
            self.snapshots,
            self.live,
            controller.rollouts.feed,
            tls=config.tls is not None,
        )
        self._runner: web.AppRunner | None = None
        self.address: str | None = None
        self.url: str | None = None

    def _ssl_context(self) -> ssl.SSLContext | None:
        tls = self.config.tls
        if tls is None:
            return None
        if tls.cert is None or tls.key is None:
            raise ValueError("serving the console over TLS needs a certificate and its key")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls.cert, tls.key)
        return context

    async def start(self) -> str:
        """Bind and serve; returns the console's URL (raises OSError when it cannot bind)."""
        if self._runner is not None:
            raise RuntimeError("already started")
        _, port = parse_hostport(self.config.listen)
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(
            runner, self._host, port, ssl_context=self._ssl_context(), shutdown_timeout=1.0
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                f"console: cannot bind {self.config.listen}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        bound = runner.addresses[0]
        self.address = format_hostport(self._host, int(bound[1]))
        scheme = "https" if self.config.tls is not None else "http"
        self.url = f"{scheme}://{self.address}/"
        chain_tap(self._controller.outcomes, self.history)
        self.live.start()
        return self.url

    async def close(self) -> None:
        """End every event stream and stop listening (idempotent)."""
        await self.live.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
