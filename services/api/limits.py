"""Limits at the edge: request body size and score submission rates (API.md 1 and 9a)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from prometheus_client import Counter
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.auth import Principal
from services.api.errors import Problem, problem_response
from shared.keys import Keys
from shared.settings import LadderSettings

LIMITED = Counter("ladder_api_rate_limited_total", "Submissions refused with 429", ["bucket"])


class TooLarge(Problem):
    status, title, slug = 413, "Content too large", "too-large"


class RateLimited(Problem):
    status, title, slug = 429, "Too many requests", "rate-limited"

    def __init__(self, detail: str, retry_after_ms: int) -> None:
        super().__init__(
            detail, headers={"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000)))}
        )


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with a problem+json 413: by Content-Length
    before anything is read, and by counting while the body streams in.

    (Starlette's own body limit answers in plain text, outside the problem+json contract.)
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        detail = f"Request bodies are limited to {self.limit} bytes."
        declared = Headers(scope=scope).get("content-length")
        # A length that is not a number is the HTTP server's to refuse (uvicorn answers 400
        # before the app is called); the body is counted as it streams in all the same.
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await problem_response(TooLarge(detail))(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # An HTTPException passes through FastAPI's body parsing to the handlers.
                    raise HTTPException(413, detail)
            return message

        await self.app(scope, counting_receive, send)


class JsonBodies:
    """Every request body is JSON (API.md section 1), whatever its Content-Type says.

    Game clients often send JSON labelled as a form or as plain text; rather than refuse them,
    the label is corrected so that a body is parsed, and malformed JSON answers 400 as it
    should.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            headers.append((b"content-type", b"application/json"))
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


def _credential_id(principal: Principal, credential: str) -> str:
    if principal.kind == "player" and principal.user_id:
        return "player:" + principal.user_id
    return "key:" + hashlib.sha256(credential.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Quota:
    """The rate limits one request's score writes are held to (API.md section 9a).

    The limits are checked and taken inside the write itself (``ladder_write_v2``), so a score
    costs one Redis round trip and a refused one writes nothing at all. Both buckets live under
    the board's hash tag: a Redis Function may touch keys of one hash slot only, and the write's
    keys are the board's. So a user's and a credential's rates hold per board, across every API
    process (docs/architecture.md, "Rate limits").
    """

    keys: Keys
    board_id: str
    credential_id: str
    user_rate: float
    key_rate: float

    def call(self, user_id: str, now_ms: int) -> tuple[list[str], list[str | int | float]]:
        """The bucket keys and arguments that go in front of a write's own."""
        return (
            [
                self.keys.rate_bucket(self.board_id, "user", user_id),
                self.keys.rate_bucket(self.board_id, "key", self.credential_id),
            ],
            # A user may burst to twice its rate; a credential to its rate.
            [self.user_rate, 2 * self.user_rate, self.key_rate, self.key_rate, now_ms],
        )


def quota(
    keys: Keys,
    settings: LadderSettings,
    board_id: str,
    principal: Principal,
    credential: str,
) -> Quota:
    return Quota(
        keys,
        board_id,
        _credential_id(principal, credential),
        settings.user_rate,
        settings.key_rate,
    )


def refusal(payload: str, user_id: str) -> RateLimited:
    """The 429 for a write the function refused with ``limited``: ``"<bucket> <ms>"``."""
    bucket, _, wait_ms = payload.partition(" ")
    LIMITED.labels(bucket).inc()
    if bucket == "user":
        detail = f"Score submissions by user {user_id!r} are over the limit."
    else:
        detail = "Score submissions by this credential are over the limit."
    return RateLimited(detail, int(float(wait_ms or "1000")))
