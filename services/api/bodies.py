"""Request bodies at the edge: their size limit and their media type (docs/api.md section 1)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.errors import Problem, problem_response


class TooLarge(Problem):
    status, title, slug = 413, "Content too large", "too-large"


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with a problem+json 413: by Content-Length
    before anything is read, and by counting while the body streams in.

    (Starlette's own body limit answers in plain text, outside the problem+json contract.)
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.detail = f"Request bodies are limited to {limit} bytes."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        detail = self.detail
        # The first Content-Length, as Starlette's Headers finds it (ASGI's names are lower
        # case), without making the Headers of every request.
        declared = next(
            (
                value.decode("latin-1")
                for name, value in scope["headers"]
                if name == b"content-length"
            ),
            None,
        )
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
    """Every request body is JSON (docs/api.md section 1), whatever its Content-Type says.

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
