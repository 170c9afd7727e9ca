"""The hottest reads (the board page and the standing) answered in front of the app's middleware.

:class:`~services.api.routes.params.DirectPaths` hands them to their endpoints in the router's
place, below eight layers of middleware: Starlette's and FastAPI's error, telemetry and body
limit middleware, Ladder's three (``CredentialFirst``, ``BodyLimit``, ``JsonBodies``), the
exception handlers' and FastAPI's exit stack. For a ``GET`` with no body, each of them only
passes the request on, yet together they were about a fifth of a rank read's CPU in the API
(docs/architecture.md, "Performance"). :class:`DirectReads` stands above them and answers such a
read itself, as they would have:

- a request they would turn away or look into (one without a credential while reads are not
  public: ``CredentialFirst``'s 401; one that declares a body: the body limits) goes the whole
  way, as does every other request;
- a problem the endpoint raises is answered by the app's handler of its class, as the
  exception handlers' middleware answers it;
- any other exception, which the error middleware would answer with a 500 (and the telemetry
  middleware record), sends the request the whole way again: a read changes nothing, and it
  fails there as it did here.

FastAPI's request telemetry is in the app's own call, before the middleware: it still sees
every request. tests/api/test_direct_paths.py checks that the app answers alike without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.routes.params import DirectPaths

Handler = Callable[[Request, Exception], Awaitable[Response]]
# Headers after which a GET is not a plain read here: a credential is looked for, a body is
# left to the body limits.
_BODY = frozenset({b"content-length", b"transfer-encoding"})


class DirectReads:
    """In front of ``app`` (the app's middleware stack): a ``GET`` of one of ``paths``' routes
    with no body, and with a credential unless reads are public, answered by the route's
    endpoint; everything else passed to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        paths: DirectPaths,
        handlers: Mapping[Any, Callable[..., Any]],
        public_reads: bool,
    ) -> None:
        self.app = app
        self.paths = paths
        self.public_reads = public_reads
        # The exception handlers' middleware's handlers: by class, and HTTP status (no 500 nor
        # Exception: those are the error middleware's, reached by going the whole way).
        self._handlers = {k: v for k, v in handlers.items() if k not in (500, Exception)}

    def _plain(self, scope: Scope) -> bool:
        """No body declared, and a credential unless reads are public."""
        credential = self.public_reads
        for name, value in scope["headers"]:
            if name in _BODY:
                return False
            if name == b"authorization" and value.strip():
                credential = True
        return credential

    def _handler(self, exc: Exception) -> Handler | None:
        """The handler of ``exc`` as Starlette's exception handlers pick it."""
        handlers = self._handlers
        if isinstance(exc, HTTPException) and exc.status_code in handlers:
            return handlers[exc.status_code]
        for cls in type(exc).__mro__:
            if cls in handlers:
                return handlers[cls]
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.paths.match(scope) if scope["type"] == "http" else None
        if route is None or not self._plain(scope):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                await self.app(scope, receive, send)
                return
            response = await handler(request, exc)
        await response(scope, receive, send)
