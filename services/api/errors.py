"""Errors that carry data, mapped to problem+json (RFC 9457) in one place."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, compile_path

from services.api.strict_json import unread_body
from shared.failures import is_transient
from shared.problems import PROBLEM, problem_body

log = structlog.get_logger(__name__)


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
        return problem_body(self.status, self.title, self.slug, self.detail)


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


class Internal(Problem):
    """A fault of the server's own (never of what the client sent), still answered as a
    problem."""

    status, title, slug = 500, "Internal error", "internal"


# --- the problem+json body as the OpenAPI document describes it --------------------------------


class FieldError(BaseModel):
    """One reason a request failed validation."""

    loc: list[str | int] = Field(description="Where: body, query, path or header, then the field")
    msg: str
    type: str


class ProblemDetails(BaseModel):
    """An error (RFC 9457), served as ``application/problem+json``."""

    type: str = Field(description="A URI naming the kind of problem")
    title: str
    status: int = Field(description="The HTTP status code")
    detail: str = Field(description="What went wrong with this request")
    errors: list[FieldError] = Field(
        default_factory=list,
        exclude_if=lambda errors: not errors,
        description="Validation failures (422) only: one entry per failing field",
    )


class EventProblem(ProblemDetails):
    """A batch's problem for one of its events."""

    retry_after: int | None = Field(
        default=None,
        exclude_if=lambda seconds: seconds is None,
        description="429 and 503 only: the seconds to wait before sending this event again, "
        "as a single POST's Retry-After header says",
    )


def event_problem(problem: Problem) -> dict[str, Any]:
    """``problem``'s body as a batch answers it for one event: with ``retry_after`` where a
    single POST's answer would carry ``Retry-After``."""
    body = problem.body()
    if "Retry-After" in problem.headers:
        body["retry_after"] = int(problem.headers["Retry-After"])
    return body


_SCHEMAS = "#/components/schemas/"
_PROBLEM_TEXTS = {
    400: "Malformed JSON",
    401: "Missing or invalid credential (with WWW-Authenticate)",
    403: "Credential not allowed",
    404: "Unknown board, user or period",
    405: "Method not allowed on this path (with Allow)",
    409: "Conflict",
    413: "Body too large",
    422: "Validation failed (a query parameter the route does not take, or given twice, too)",
    429: "Rate limited (with Retry-After)",
    503: "A dependency is down (with Retry-After)",
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying",
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}
_PROBLEM_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "Bearer",
            "required": True,
            "schema": {"type": "string", "pattern": "^Bearer"},
        }
    },
    405: {
        "Allow": {
            "description": "The methods the path has",
            "required": True,
            "schema": {"type": "string"},
        }
    },
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}

PROBLEMS: dict[int, dict[str, Any]] = {
    status: {
        "description": text,
        "content": {PROBLEM: {"schema": {"$ref": _SCHEMAS + ProblemDetails.__name__}}},
        **({"headers": _PROBLEM_HEADERS[status]} if status in _PROBLEM_HEADERS else {}),
    }
    for status, text in _PROBLEM_TEXTS.items()
}
"""Every problem status of the contract (docs/api.md section 1), as OpenAPI responses."""


def problems(*statuses: int, said: Mapping[int, str] | None = None) -> dict[int | str, Any]:
    """The ``responses=`` of a route that may answer these problems; ``said`` tells what a
    status means on that route where the contract's general description is not enough."""
    said = said or {}
    return {
        status: {**PROBLEMS[status], "description": said.get(status, _PROBLEM_TEXTS[status])}
        for status in statuses
    }


def location(where: str) -> dict[str, Any]:
    """The ``headers`` of a response answered with a ``Location`` (a made board, an erasure's or
    a deletion's status), for a route's ``responses=``."""
    return {"Location": {"description": where, "schema": {"type": "string"}}}


def document(app: FastAPI) -> None:
    """Put :class:`ProblemDetails` in the app's OpenAPI components, where :data:`PROBLEMS`
    refers to it, whichever routes there are; and 413 on every operation, which the body limit
    (services/api/bodies.py) answers on any route to a request that says its body is larger,
    one that takes no body included."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            _, defs = models_json_schema(
                [(ProblemDetails, "serialization")], ref_template=_SCHEMAS + "{model}"
            )
            known = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in defs.get("$defs", {}).items():
                known.setdefault(name, definition)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.setdefault("responses", {}).setdefault("413", PROBLEMS[413])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# --- answering ----------------------------------------------------------------------------------


def problem_response(problem: Problem) -> JSONResponse:
    return JSONResponse(
        problem.body(), status_code=problem.status, headers=problem.headers, media_type=PROBLEM
    )


def public_message(error: Any) -> str:
    """A validation error's message as a client reads it: pydantic names the model class where an
    object was wanted ("a valid dictionary or instance of ScoreIn"), a name of the code."""
    if error.get("type") in ("model_type", "model_attributes_type"):
        return "Input should be a JSON object"
    return str(error.get("msg", ""))


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = [
        {"loc": list(e.get("loc", ())), "msg": public_message(e), "type": e.get("type", "")}
        for e in exc.errors()
    ]
    unread = unread_body(exc.errors())
    if unread is not None:
        return problem_response(Problem(unread))
    body = Invalid("The request failed validation.").body()
    body["errors"] = errors
    return JSONResponse(body, status_code=422, media_type=PROBLEM)


# Errors the framework raises (an unparsable body, no such route, too large a body), named as
# Ladder's own problems of the same status are, so that one status has one problem type.
_HTTP_PROBLEMS = {
    400: (Problem.title, Problem.slug),
    404: (NotFound.title, NotFound.slug),
    405: ("Method not allowed", "method-not-allowed"),
    413: ("Content too large", "too-large"),
}


_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


@functools.cache
def _path_regex(template: str) -> re.Pattern[str]:
    return compile_path(template)[0]


def _allowed_methods(request: Request, named: str) -> str:
    """The ``Allow`` of a 405: every method the document gives the path. Starlette names only
    those of the first route it tried, and FastAPI makes a route per operation, so that a
    ``GET`` and a ``PUT`` of one path are two routes. Where templates overlap, the one with the
    fewest parameters names the path (``.../friends/requests`` is the requests list, not a
    friend called "requests"). ``named`` stands for a path the document does not hold."""
    paths: dict[str, dict[str, Any]] = request.app.openapi()["paths"]
    matching = [t for t in paths if _path_regex(t).match(request.scope["path"])]
    fewest = min((t.count("{") for t in matching), default=0)
    methods = {
        method.upper()
        for template in matching
        if template.count("{") == fewest
        for method in paths[template]
        if method in _METHODS
    }
    # HEAD, where a route answers it, is in no document (the ops routes' and the page's): the
    # router is asked whether it has a route for a HEAD of the path.
    head = {**request.scope, "method": "HEAD"}
    if methods and any(route.matches(head)[0] is Match.FULL for route in request.app.routes):
        methods.add("HEAD")
    return ", ".join(sorted(methods)) if methods else named


def install(app: FastAPI) -> None:
    """Register every mapping from an exception to a problem+json answer."""

    async def on_problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_response(exc)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        title, slug = _HTTP_PROBLEMS.get(exc.status_code, ("Error", str(exc.status_code)))
        body = problem_body(exc.status_code, title, slug, str(exc.detail))
        headers = exc.headers
        if exc.status_code == 405 and headers:
            headers = {**headers, "Allow": _allowed_methods(request, headers.get("Allow", ""))}
        return JSONResponse(body, status_code=exc.status_code, headers=headers, media_type=PROBLEM)

    async def on_redis_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("redis unavailable", error=str(exc))
        return problem_response(Unavailable("The cache is unavailable; retry shortly."))

    async def on_mysql_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("history database unavailable", error=str(exc))
        return problem_response(Unavailable("The history database is unavailable.", 5))

    async def on_redis_error(request: Request, exc: Exception) -> JSONResponse:
        # Redis refusing for its state (read-only after a failover, out of memory, busy, a
        # cluster slot moving or down) is an outage like a lost connection; anything else is ours.
        if is_transient(exc):
            return await on_redis_down(request, exc)
        return await on_unexpected(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("request failed", path=request.url.path, exc_info=exc)
        return problem_response(Internal("The request failed on the server; it is logged."))

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RedisConnectionError, on_redis_down)
    app.add_exception_handler(RedisTimeoutError, on_redis_down)
    app.add_exception_handler(RedisError, on_redis_error)
    app.add_exception_handler(RedisClusterException, on_redis_error)
    app.add_exception_handler(OperationalError, on_mysql_down)
    app.add_exception_handler(DBAPIError, on_mysql_down)
    app.add_exception_handler(PoolTimeoutError, on_mysql_down)
    # Last: whatever else escaped a route is a problem+json 500, never a bare text page.
    app.add_exception_handler(Exception, on_unexpected)
    document(app)
