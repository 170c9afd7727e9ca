"""Limits at the edge: request body size and score submission rates (API.md 1 and 9a)."""

from __future__ import annotations

import hashlib
import math
import time

from prometheus_client import Counter
from redis.asyncio import Redis
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.auth import Principal
from services.api.errors import Problem, problem_response
from shared.keys import Keys
from shared.redis import TAKE_FUNCTION
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
    before anything is read, else by counting while the body streams in.

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
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
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


async def take(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    principal: Principal,
    credential: str,
    user_ids: list[str],
) -> dict[str, RateLimited]:
    """Take one submission per event from the credential's bucket and each user's, in Redis,
    so that every API process shares them; all in one round trip.

    Raises :class:`RateLimited` if the credential is over its limit. Returns the users that are
    over theirs, each with its 429, so that a batch can refuse just their events. A refusal by
    one bucket may still have taken from another, which only errs towards limiting.
    """
    now_ms = int(time.time() * 1000)
    counts: dict[str, int] = {}
    for user in user_ids:
        counts[user] = counts.get(user, 0) + 1
    async with redis.pipeline(transaction=False) as pipe:
        pipe.fcall(
            TAKE_FUNCTION,
            1,
            keys.rate_bucket("key", _credential_id(principal, credential)),
            settings.key_rate,
            settings.key_rate,
            now_ms,
            len(user_ids),
        )
        for user, count in counts.items():
            pipe.fcall(
                TAKE_FUNCTION,
                1,
                keys.rate_bucket("user", user),
                settings.user_rate,
                2 * settings.user_rate,
                now_ms,
                count,
            )
        (key_ok, key_wait_ms), *replies = await pipe.execute()
    if not key_ok:
        LIMITED.labels("credential").inc()
        raise RateLimited("Score submissions by this credential are over the limit.", key_wait_ms)
    denied: dict[str, RateLimited] = {}
    for user, (ok, wait_ms) in zip(counts, replies, strict=True):
        if not ok:
            LIMITED.labels("user").inc()
            denied[user] = RateLimited(
                f"Score submissions by user {user!r} are over the limit.", wait_ms
            )
    return denied
