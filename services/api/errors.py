"""Errors that carry data, mapped to problem+json (RFC 9457) in one place."""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = structlog.get_logger(__name__)

PROBLEM = "application/problem+json"
TYPE_BASE = "https://ladder.dev/problems/"


class Problem(Exception):
    """An error answered as problem+json; subclasses fix status and title."""

    status = 400
    title = "Bad request"
    slug = "bad-request"

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "type": TYPE_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }


class Unauthorized(Problem):
    status, title, slug = 401, "Unauthorized", "unauthorized"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(Problem):
    status, title, slug = 403, "Forbidden", "forbidden"


class NotFound(Problem):
    status, title, slug = 404, "Not found", "not-found"


class Conflict(Problem):
    status, title, slug = 409, "Conflict", "conflict"


class Invalid(Problem):
    status, title, slug = 422, "Unprocessable content", "validation"

    def __init__(self, detail: str, *, loc: tuple[str, ...] = ()) -> None:
        super().__init__(detail)
        self.loc = loc

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["errors"] = [{"loc": list(self.loc), "msg": self.detail, "type": "value_error"}]
        return body


class Unavailable(Problem):
    status, title, slug = 503, "Service unavailable", "unavailable"

    def __init__(self, detail: str, retry_after: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


def problem_response(problem: Problem) -> JSONResponse:
    return JSONResponse(
        problem.body(), status_code=problem.status, headers=problem.headers, media_type=PROBLEM
    )


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in exc.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(Problem("The body is not valid JSON."))
    body = Invalid("The request failed validation.").body()
    body["errors"] = errors
    return JSONResponse(body, status_code=422, media_type=PROBLEM)


_STATUS_TITLES = {
    400: "Bad request",
    404: "Not found",
    405: "Method not allowed",
    413: "Content too large",
}


def install(app: FastAPI) -> None:
    """Register every mapping from an exception to a problem+json answer."""

    async def on_problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_response(exc)

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        body = {
            "type": TYPE_BASE + str(exc.status_code),
            "title": _STATUS_TITLES.get(exc.status_code, "Error"),
            "status": exc.status_code,
            "detail": str(exc.detail),
        }
        return JSONResponse(
            body, status_code=exc.status_code, headers=exc.headers, media_type=PROBLEM
        )

    async def on_redis_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("redis unavailable", error=str(exc))
        return problem_response(Unavailable("The cache is unavailable; retry shortly."))

    async def on_mysql_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("history database unavailable", error=str(exc))
        return problem_response(Unavailable("The history database is unavailable.", 5))

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RedisConnectionError, on_redis_down)
    app.add_exception_handler(RedisTimeoutError, on_redis_down)
    app.add_exception_handler(OperationalError, on_mysql_down)
    app.add_exception_handler(DBAPIError, on_mysql_down)
