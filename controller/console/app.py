"""The console's HTTP routes: pages, the JSON API and the event stream, behind one gate.

What it decides: which path does what, and that nothing runs before the access gate
(:class:`controller.console.access.AccessPolicy`) has passed the request — one middleware
builds the request's facts, asks the gate, and turns every
:class:`~controller.console.problems.ConsoleError` into its typed JSON answer (or, for a page
on a console that needs signing in, a redirect to ``/login``).

Routes (documented for scripts in ``docs/reference/console.md``)::

    GET    /                                   the console page
    GET    /login                              the sign-in page
    GET    /static/{file}                      the page's CSS and JS (no data)
    GET    /api/state                          GetState + fleet flags + capabilities
    GET    /api/traffic[?since=EPOCH_S]        the traffic history
    GET    /api/rollouts/{model}/decisions     ListRolloutDecisions (?limit=N, default 200)
    GET    /api/events                         server-sent events: state, decision
    GET    /api/session                        whether this request holds the credential
    POST   /api/session                        {"token": ...} -> session cookie + CSRF token
    DELETE /api/session                        sign out
    POST   /api/rollouts/{model}/promote       PromoteRollout
    POST   /api/rollouts/{model}/abort         AbortRollout ({"reason": ...} optional)
    POST   /api/rollouts/{model}/pause         PauseRollout ({"auto_rollback": bool,
                                               "reason": ...} optional)
    POST   /api/rollouts/{model}/resume        ResumeRollout ({"reason": ...} optional)
    POST   /api/rollouts/{model}/approve       ApproveRollout
    POST   /api/replicas/{replica_id}/drain    DrainReplica
    POST   /api/replicas/{replica_id}/undrain  UndrainReplica

Every response carries a strict Content-Security-Policy (scripts, styles and connections from
the console's own origin only, no framing), ``nosniff`` and ``no-referrer``; API answers are
``no-store``. No access log is written (it would be the one place a URL is logged); every
action is logged once with what was asked and how it ended, never who with which credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from common.errors import Reason
from controller.console.access import (
    CSRF_HEADER,
    SESSION_COOKIE,
    AccessPolicy,
    RequestFacts,
)
from controller.console.live import LiveState
from controller.console.operations import Operations
from controller.console.problems import ConsoleError
from controller.console.snapshot import Snapshots
from controller.decision_feed import DecisionFeed

__all__ = ["STATIC_DIR", "build_app"]

_log = logging.getLogger("halcyon.controller.console")

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES = 16 * 1024
DEFAULT_DECISIONS = 200
MAX_DECISIONS = 10_000
_STATIC_TYPES = {
    ".css": "text/css",
    ".js": "text/javascript",
    ".html": "text/html",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error_response(err: ConsoleError) -> web.Response:
    return web.json_response(err.body(), status=err.http_status, headers=err.headers())


def _bearer(request: web.Request) -> tuple[str | None, bool]:
    """The bearer token, and whether an Authorization header was there but malformed."""
    header = request.headers.get("Authorization")
    if header is None:
        return None, False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None, True
    return token.strip(), False


def _is_public(request: web.Request) -> bool:
    path = request.path
    if path == "/login" or path.startswith("/static/"):
        return True
    return path == "/api/session" and request.method == "POST"


def _facts(request: web.Request, tls: bool) -> RequestFacts:
    bearer, malformed = _bearer(request)
    return RequestFacts(
        method=request.method,
        host=request.headers.get("Host"),
        origin=request.headers.get("Origin"),
        scheme="https" if tls else "http",
        session_id=request.cookies.get(SESSION_COOKIE),
        csrf_token=request.headers.get(CSRF_HEADER),
        bearer=bearer,
        public=_is_public(request),
        bad_authorization=malformed,
    )


def _invalid(field: str, description: str) -> ConsoleError:
    return ConsoleError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invalid {field}: {description}",
        Reason.INVALID_FIELD,
        metadata={"field": field},
    )


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body ({} when empty)."""
    if not request.can_read_body:
        return {}
    try:
        text = await request.text()
    except web.HTTPRequestEntityTooLarge:
        raise _invalid("body", f"at most {MAX_BODY_BYTES} bytes") from None
    if not text.strip():
        return {}
    if request.content_type != "application/json":
        raise _invalid("body", "must be JSON (Content-Type: application/json)")
    try:
        body = json.loads(text)
    except ValueError:
        raise _invalid("body", "is not valid JSON") from None
    if not isinstance(body, dict):
        raise _invalid("body", "must be a JSON object")
    return body


class _Routes:
    def __init__(
        self,
        policy: AccessPolicy,
        operations: Operations,
        snapshots: Snapshots,
        live: LiveState,
        decisions: DecisionFeed,
        *,
        tls: bool,
    ) -> None:
        self.policy = policy
        self.ops = operations
        self.snapshots = snapshots
        self.live = live
        self.decisions = decisions
        self.tls = tls

    # -- the gate -----------------------------------------------------------------------------

    @web.middleware
    async def gate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            self.policy.decide(_facts(request, self.tls))
            response = await handler(request)
        except ConsoleError as err:
            wants_page = request.method == "GET" and not request.path.startswith("/api/")
            if wants_page and err.code == grpc.StatusCode.UNAUTHENTICATED:
                response = web.HTTPSeeOther("/login")
            else:
                response = _error_response(err)
        except web.HTTPException as exc:
            response = exc
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("console request failed", extra={"route": request.path})
            response = _error_response(
                ConsoleError(grpc.StatusCode.INTERNAL, "internal error in the console")
            )
        if not response.prepared:
            response.headers.update(_SECURITY_HEADERS)
            if request.path.startswith("/api/"):
                response.headers["Cache-Control"] = "no-store"
        return response

    # -- pages --------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def login(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "login.html", headers={"Cache-Control": "no-store"})

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = (STATIC_DIR / name).resolve()
        if path.parent != STATIC_DIR or path.suffix not in _STATIC_TYPES or not path.is_file():
            raise ConsoleError(grpc.StatusCode.NOT_FOUND, "no such file", "NOT_FOUND")
        return web.FileResponse(
            path, headers={"Content-Type": _STATIC_TYPES[path.suffix], "Cache-Control": "no-cache"}
        )

    # -- reading ------------------------------------------------------------------------------

    async def state(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(await self.snapshots.state())

    async def traffic(self, request: web.Request) -> web.StreamResponse:
        since: float | None = None
        if "since" in request.query:
            try:
                since = float(request.query["since"])
            except ValueError:
                raise _invalid("since", "must be epoch seconds") from None
        return web.json_response(self.snapshots.traffic(since))

    async def decision_list(self, request: web.Request) -> web.StreamResponse:
        limit = DEFAULT_DECISIONS
        if "limit" in request.query:
            try:
                limit = int(request.query["limit"])
            except ValueError:
                raise _invalid("limit", "must be a whole number") from None
            if not 1 <= limit <= MAX_DECISIONS:
                raise _invalid("limit", f"must be in [1, {MAX_DECISIONS}]")
        found = await self.ops.decisions(request.match_info["model"], limit)
        return web.json_response(found)

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``state`` (about once a second) and ``decision`` (as stored)."""
        if self.live.closed or self.decisions.closed:
            raise ConsoleError(
                grpc.StatusCode.UNAVAILABLE,
                "the controller is shutting down",
                Reason.SHUTTING_DOWN,
                retry_after_s=1.0,
            )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
                **_SECURITY_HEADERS,
            }
        )
        await response.prepare(request)
        self.live.viewers += 1
        subscription = self.decisions.subscribe(None)
        state_wait: asyncio.Future[dict[str, Any] | None] | None = None
        decision_wait: asyncio.Future[Any] | None = None
        try:
            await response.write(b"retry: 2000\n\n")
            if self.live.latest is None or self.live.viewers == 1:
                # Nobody was watching: the last document is stale (or there is none yet).
                document = await self.live.refresh()
            else:
                document = self.live.latest
            version = self.live.version
            await _send(response, "state", document)
            while True:
                if state_wait is None:
                    state_wait = asyncio.ensure_future(self.live.wait_newer(version))
                if decision_wait is None:
                    decision_wait = asyncio.ensure_future(subscription.next())
                await asyncio.wait((state_wait, decision_wait), return_when=asyncio.FIRST_COMPLETED)
                if decision_wait.done():
                    decision = decision_wait.result()
                    decision_wait = None
                    if decision is None:  # feed closed (shutdown) or this stream overflowed
                        break
                    await _send(response, "decision", self.snapshots.decision(decision))
                if state_wait.done():
                    newer = state_wait.result()
                    state_wait = None
                    if newer is None:
                        break
                    version = self.live.version
                    await _send(response, "state", newer)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.live.viewers -= 1
            subscription.close()
            for waiter in (state_wait, decision_wait):
                if waiter is not None:
                    waiter.cancel()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    # -- the session --------------------------------------------------------------------------

    async def session_info(self, request: web.Request) -> web.StreamResponse:
        identity = self.policy.decide(_facts(request, self.tls))  # the gate let it through
        return web.json_response(
            {
                "operator": identity.operator,
                "via": identity.via,
                "csrf_token": identity.csrf_token,
                "sign_in_required_to_read": not self.policy.loopback,
            }
        )

    async def sign_in(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        token = body.get("token")
        if token is not None and not isinstance(token, str):
            raise _invalid("token", "must be a string")
        session_id, session = self.policy.sign_in(token)
        _log.info("console sign-in", extra={"result": "ok"})
        response = web.json_response(
            {
                "operator": True,
                "via": "session",
                "csrf_token": session.csrf_token,
                "expires_in_s": self.policy.session_ttl_s,
            }
        )
        response.set_cookie(
            SESSION_COOKIE,
            session_id,
            max_age=int(self.policy.session_ttl_s),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.tls,
        )
        return response

    async def sign_out(self, request: web.Request) -> web.StreamResponse:
        ended = self.policy.sign_out(request.cookies.get(SESSION_COOKIE))
        response = web.json_response({"operator": False, "ended": ended})
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    # -- actions ------------------------------------------------------------------------------

    async def _act(
        self, action: str, target: str, call: Callable[[], Awaitable[dict[str, Any]]]
    ) -> web.StreamResponse:
        try:
            result = await call()
        except ConsoleError as err:
            _log.info(
                "console action refused",
                extra={"action": action, "target": target[:128], "reason": err.reason},
            )
            raise
        _log.info("console action", extra={"action": action, "target": target[:128]})
        if self.live.viewers:
            await self.live.refresh()
        return web.json_response(result)

    async def promote(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        return await self._act("promote", model, lambda: self.ops.promote(model))

    async def abort(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        body = await _json_body(request)
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise _invalid("reason", "must be a string")
        why = reason.strip() or "aborted from the console"
        return await self._act("abort", model, lambda: self.ops.abort(model, why))

    async def pause(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        body = await _json_body(request)
        auto_rollback = body.get("auto_rollback", True)
        if not isinstance(auto_rollback, bool):
            raise _invalid("auto_rollback", "must be true or false")
        why = _reason(body) or "paused from the console"
        return await self._act("pause", model, lambda: self.ops.pause(model, auto_rollback, why))

    async def resume(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        why = _reason(await _json_body(request)) or "resumed from the console"
        return await self._act("resume", model, lambda: self.ops.resume(model, why))

    async def approve(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        return await self._act("approve", model, lambda: self.ops.approve(model))

    async def drain(self, request: web.Request) -> web.StreamResponse:
        replica_id = request.match_info["replica_id"]
        return await self._act("drain", replica_id, lambda: self.ops.drain(replica_id))

    async def undrain(self, request: web.Request) -> web.StreamResponse:
        replica_id = request.match_info["replica_id"]
        return await self._act("undrain", replica_id, lambda: self.ops.undrain(replica_id))


def _reason(body: dict[str, Any]) -> str:
    """The optional ``reason`` of an action's body, stripped."""
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise _invalid("reason", "must be a string")
    return reason.strip()


async def _send(response: web.StreamResponse, event: str, data: dict[str, Any]) -> None:
    payload = json.dumps(data, separators=(",", ":"))
    await response.write(f"event: {event}\ndata: {payload}\n\n".encode())


def build_app(
    policy: AccessPolicy,
    operations: Operations,
    snapshots: Snapshots,
    live: LiveState,
    decisions: DecisionFeed,
    *,
    tls: bool,
) -> web.Application:
    """The console's aiohttp application (not yet bound)."""
    routes = _Routes(policy, operations, snapshots, live, decisions, tls=tls)
    app = web.Application(middlewares=[routes.gate], client_max_size=MAX_BODY_BYTES)
    app.add_routes(
        [
            web.get("/", routes.page),
            web.get("/login", routes.login),
            web.get("/static/{name}", routes.static),
            web.get("/api/state", routes.state),
            web.get("/api/traffic", routes.traffic),
            web.get("/api/rollouts/{model}/decisions", routes.decision_list),
            web.get("/api/events", routes.events),
            web.get("/api/session", routes.session_info),
            web.post("/api/session", routes.sign_in),
            web.delete("/api/session", routes.sign_out),
            web.post("/api/rollouts/{model}/promote", routes.promote),
            web.post("/api/rollouts/{model}/abort", routes.abort),
            web.post("/api/rollouts/{model}/pause", routes.pause),
            web.post("/api/rollouts/{model}/resume", routes.resume),
            web.post("/api/rollouts/{model}/approve", routes.approve),
            web.post("/api/replicas/{replica_id}/drain", routes.drain),
            web.post("/api/replicas/{replica_id}/undrain", routes.undrain),
        ]
    )
    return app
