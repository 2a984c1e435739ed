"""Who may see and do what on the console: credentials, sessions and cross-site requests.

What it decides, for every HTTP request, before any handler runs (:meth:`AccessPolicy.decide`):

* **Reading** (GET/HEAD) needs nothing when the console listens on loopback only, and the
  operator credential otherwise (every page and every API; the sign-in page and the static
  assets, which hold code and no state, excepted). On a loopback console the ``Host`` header
  must be a loopback name too, so a page on another site whose name was re-pointed at
  127.0.0.1 (DNS rebinding) cannot read the fleet (``HOST_NOT_ALLOWED``).
* **Acting** (any other method) always needs the operator credential, from one of:

  - a session cookie, which ``POST /api/session`` exchanges for the credential typed into the
    page: the cookie is ``HttpOnly`` (page scripts cannot read it), ``SameSite=Strict`` (no
    other site's request carries it), ``Path=/`` and ``Secure`` when the console serves TLS.
    A request on the cookie must also carry ``Origin`` equal to the console's own origin
    (``CROSS_ORIGIN`` otherwise) and the session's CSRF token in ``X-Halcyon-CSRF``
    (``CSRF_TOKEN_MISMATCH``): the token is handed to the page's script when it signs in,
    which another site's page cannot read;
  - ``Authorization: Bearer <operator token>``, for scripts: no browser attaches it by itself,
    so it needs no CSRF token, but a foreign ``Origin`` is refused all the same.

  A state-changing request with a foreign ``Origin`` is refused first, signed in or not (a
  cross-site form post never reaches a handler, the sign-in form included).

Why this shape: the credential is compared by :meth:`common.auth.AuthPolicy.roles_of` (SHA-256
digests, ``hmac.compare_digest`` against every known one); sessions are random 256-bit ids kept
only as digests, expire after ``session_ttl_s`` on the injected clock, and at most
``max_sessions`` live (the oldest goes first). Nothing here logs or returns a credential or a
session id. Pure: no sockets, no wall clock.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

import grpc

from common.auth import Access, AuthPolicy
from common.clock import Clock
from common.credentials import is_loopback
from common.errors import Reason
from controller.console.problems import (
    CROSS_ORIGIN,
    CSRF_TOKEN_MISMATCH,
    HOST_NOT_ALLOWED,
    ConsoleError,
)

__all__ = [
    "CSRF_HEADER",
    "SAFE_METHODS",
    "SESSION_COOKIE",
    "AccessPolicy",
    "Identity",
    "RequestFacts",
    "Session",
]

SESSION_COOKIE = "halcyon_console"
CSRF_HEADER = "X-Halcyon-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class RequestFacts:
    """What the policy reads of one request (the HTTP layer fills it in)."""

    method: str
    host: str | None  # the Host header, port included
    origin: str | None  # the Origin header
    scheme: str = "http"
    session_id: str | None = None  # the session cookie
    csrf_token: str | None = None  # the X-Halcyon-CSRF header
    bearer: str | None = None  # Authorization: Bearer ...
    public: bool = False  # the sign-in page and static assets
    bad_authorization: bool = False  # an Authorization header that is not "Bearer <token>"


@dataclass(frozen=True)
class Identity:
    """Who a request is: ``operator`` when it holds the operator credential, and how."""

    operator: bool
    via: str  # "session", "bearer" or "none"
    csrf_token: str | None = None  # the session's, to hand back to its page


@dataclass
class Session:
    csrf_token: str
    expires_at: float


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def host_name(host: str) -> str:
    """``"127.0.0.1:9440"`` -> ``"127.0.0.1"``, ``"[::1]:9440"`` -> ``"::1"``."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host


class AccessPolicy:
    """The console's gate: see the module docstring for the rules."""

    def __init__(
        self,
        auth: AuthPolicy,
        clock: Clock,
        *,
        loopback: bool,
        session_ttl_s: float = 8 * 3600.0,
        max_sessions: int = 64,
    ) -> None:
        if not session_ttl_s > 0.0:
            raise ValueError(f"session_ttl_s must be positive, got {session_ttl_s}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self._auth = auth
        self._clock = clock
        self.loopback = loopback
        self.session_ttl_s = float(session_ttl_s)
        self._max_sessions = max_sessions
        # sha256(session id) -> session, oldest first.
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()

    # -- sessions -----------------------------------------------------------------------------

    def sign_in(self, token: str | None) -> tuple[str, Session]:
        """A new session for the operator credential ``token`` (its id, and the session);
        :class:`ConsoleError` for no token, an unknown one, or one of another role."""
        token = (token or "").strip()
        if not token:
            raise ConsoleError(
                grpc.StatusCode.UNAUTHENTICATED,
                "signing in needs the operator credential",
                Reason.MISSING_CREDENTIALS,
            )
        self._check_operator(token)
        self._expire()
        while len(self._sessions) >= self._max_sessions:
            self._sessions.popitem(last=False)
        session_id = secrets.token_urlsafe(32)
        session = Session(
            csrf_token=secrets.token_urlsafe(32),
            expires_at=self._clock.now() + self.session_ttl_s,
        )
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def sign_out(self, session_id: str | None) -> bool:
        """End a session; whether there was one."""
        if not session_id:
            return False
        return self._sessions.pop(_digest(session_id), None) is not None

    def session(self, session_id: str | None) -> Session | None:
        """The live session with this id, or None (unknown or expired)."""
        if not session_id:
            return None
        key = _digest(session_id)
        found = self._sessions.get(key)
        if found is None:
            return None
        if self._clock.now() >= found.expires_at:
            del self._sessions[key]
            return None
        return found

    def _expire(self) -> None:
        now = self._clock.now()
        for key in [k for k, s in self._sessions.items() if now >= s.expires_at]:
            del self._sessions[key]

    def __len__(self) -> int:
        self._expire()
        return len(self._sessions)

    def _check_operator(self, token: str) -> None:
        roles = self._auth.roles_of(token)
        if not roles:
            raise ConsoleError(
                grpc.StatusCode.UNAUTHENTICATED,
                "that is not a known credential",
                Reason.INVALID_CREDENTIALS,
            )
        if Access.OPERATOR not in roles:
            raise ConsoleError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the console needs the operator credential; this one is {'/'.join(sorted(roles))}",
                Reason.WRONG_ROLE,
                metadata={"required_role": str(Access.OPERATOR)},
            )

    # -- the gate -----------------------------------------------------------------------------

    def own_origin(self, facts: RequestFacts) -> str | None:
        return f"{facts.scheme}://{facts.host}" if facts.host else None

    def decide(self, facts: RequestFacts) -> Identity:
        """The identity of a request that may proceed; :class:`ConsoleError` if it may not."""
        if self.loopback and not (facts.host and is_loopback(host_name(facts.host))):
            raise ConsoleError(
                grpc.StatusCode.PERMISSION_DENIED,
                "this console listens on loopback and answers loopback host names only "
                "(127.0.0.1, localhost, [::1])",
                HOST_NOT_ALLOWED,
            )
        acting = facts.method.upper() not in SAFE_METHODS
        if acting and facts.origin is not None and facts.origin != self.own_origin(facts):
            raise ConsoleError(
                grpc.StatusCode.PERMISSION_DENIED,
                "refused a state-changing request from another origin",
                CROSS_ORIGIN,
            )
        identity = self._identify(facts)
        if acting:
            if facts.public:
                return identity  # signing in: the credential is in the body
            if not identity.operator:
                raise self._unauthenticated(facts)
            if identity.via == "session":
                if facts.origin is None:
                    raise ConsoleError(
                        grpc.StatusCode.PERMISSION_DENIED,
                        "a state-changing request on a session cookie must carry an Origin header",
                        CROSS_ORIGIN,
                    )
                expected = identity.csrf_token or ""
                given = facts.csrf_token or ""
                if not (given and hmac.compare_digest(given.encode(), expected.encode())):
                    raise ConsoleError(
                        grpc.StatusCode.PERMISSION_DENIED,
                        f"a state-changing request on a session cookie needs the session's "
                        f"CSRF token in {CSRF_HEADER}",
                        CSRF_TOKEN_MISMATCH,
                    )
            return identity
        if facts.public or self.loopback or identity.operator:
            return identity
        raise self._unauthenticated(facts)

    def _identify(self, facts: RequestFacts) -> Identity:
        if facts.bad_authorization:
            raise ConsoleError(
                grpc.StatusCode.UNAUTHENTICATED,
                "the Authorization header must be 'Bearer <operator token>'",
                Reason.INVALID_CREDENTIALS,
            )
        if facts.bearer is not None:
            self._check_operator(facts.bearer)
            return Identity(operator=True, via="bearer")
        session = self.session(facts.session_id)
        if session is not None:
            return Identity(operator=True, via="session", csrf_token=session.csrf_token)
        return Identity(operator=False, via="none")

    def _unauthenticated(self, facts: RequestFacts) -> ConsoleError:
        if facts.session_id:
            return ConsoleError(
                grpc.StatusCode.UNAUTHENTICATED,
                "the console session has expired or is unknown; sign in again with the "
                "operator credential",
                Reason.INVALID_CREDENTIALS,
            )
        what = "this action" if facts.method.upper() not in SAFE_METHODS else "this console"
        return ConsoleError(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{what} needs the operator credential: sign in on the page, or send "
            "'Authorization: Bearer <operator token>'",
            Reason.MISSING_CREDENTIALS,
        )
