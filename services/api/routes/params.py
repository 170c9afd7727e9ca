"""The path and query parameters the read routes share, declared once so that every route
documents and checks them alike."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any, TypeVar, cast

from fastapi import Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)
from starlette.convertors import StringConvertor
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.errors import Invalid
from services.api.reads import views
from services.api.reads.styles import RankStyle
from services.api.strict_query import query_errors
from shared.boards import BOARD_ID_PATTERN
from shared.events import USER_ID_PATTERN
from shared.periods import Period

_DIGITS = re.compile(r"-?[0-9]{1,20}")


def _in_digits(value: Any) -> Any:
    """A query's integer as JSON writes one: digits, with a minus sign if negative. pydantic
    also reads ``5.0``, ``1_0`` (ten), ``+5`` and `` 5`` as integers."""
    if isinstance(value, str) and not _DIGITS.fullmatch(value):
        raise ValueError("an integer is written in digits only, such as 10")
    return value


IN_DIGITS = BeforeValidator(_in_digits)
"""The check of an integer of a query string, given after its ``Field`` or ``Query`` (placed
before them, it leaves their bounds out of the document's schema)."""


def _true_or_false(value: Any) -> Any:
    """A query's boolean as JSON writes one: ``true`` or ``false``. pydantic also reads ``1``,
    ``yes``, ``on``, ``TRUE`` and ``off`` (and their opposites) as booleans."""
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError("a boolean is written true or false")
    return value


TRUE_OR_FALSE = BeforeValidator(_true_or_false)
"""The check of a boolean of a query string, given after its ``Query``."""

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])]
ScopeQuery = Annotated[
    str,
    Query(
        max_length=80,
        pattern=views.SCOPE_PATTERN,
        description="global, region:{region}, teams (incr boards) or friends:{user_id} (that "
        "player's token or a server key)",
    ),
]
# The standing read takes a user, and the teams scope has none (422 there): the document leaves
# it out, while the server's own check keeps giving that 422 its message.
UserScopeQuery = Annotated[
    str,
    Query(
        max_length=80,
        pattern=views.SCOPE_PATTERN,
        json_schema_extra={"pattern": views.SCOPE_PATTERN.replace("|teams|", "|")},
        description="global, region:{region} or friends:{user_id} (that player's token or a "
        "server key)",
    ),
]
PeriodQuery = Annotated[Period, Query()]
PeriodIdQuery = Annotated[
    str | None,
    Query(
        max_length=16, pattern=views.PERIOD_ID_PATTERN, description="Defaults to the current period"
    ),
]
RankStyleQuery = Annotated[
    RankStyle,
    Query(
        description="ordinal: every rank unique (ties to whoever got there first); "
        "competition: equal scores share a rank and the next skips (1, 1, 3); "
        "dense: equal scores share a rank and the next does not skip (1, 1, 2)"
    ),
]
PeriodIdItem = Annotated[str, StringConstraints(max_length=16, pattern=views.PERIOD_ID_PATTERN)]


# --- the leaderboard and standing reads: their query as one model ------------------------------
# The two hottest reads take their path and query as one pydantic validation each, from the
# request itself, instead of FastAPI solving each parameter and dependency on its own, which was
# over a third of a read's CPU in the API (docs/architecture.md, "Performance"). The OpenAPI
# document still describes every parameter, from these same models, through ``openapi_extra``;
# a bad one answers the same 422, with the same ``loc``s, as FastAPI's own validation did.

_SCOPE_TEXT = (
    "global, region:{region}, teams (incr boards) or friends:{user_id} (that player's token or a "
    "server key)"
)
_USER_SCOPE_TEXT = (
    "global, region:{region} or friends:{user_id} (that player's token or a server key)"
)
_RANK_STYLE_TEXT = (
    "ordinal: every rank unique (ties to whoever got there first); competition: equal scores "
    "share a rank and the next skips (1, 1, 3); dense: equal scores share a rank and the next "
    "does not skip (1, 1, 2)"
)
_PeriodId = Annotated[
    str | None,
    Field(
        max_length=16, pattern=views.PERIOD_ID_PATTERN, description="Defaults to the current period"
    ),
]
_RankStyle = Annotated[RankStyle, Field(description=_RANK_STYLE_TEXT)]


class PageQuery(BaseModel):
    """The leaderboard read's query."""

    model_config = ConfigDict(frozen=True)

    scope: Annotated[
        str, Field(max_length=80, pattern=views.SCOPE_PATTERN, description=_SCOPE_TEXT)
    ] = "global"
    period: Period = "alltime"
    period_id: _PeriodId = None
    limit: Annotated[int, Field(ge=1, le=1000), IN_DIGITS] = 10
    cursor: Annotated[
        str | None,
        Field(
            max_length=512,
            description="The next_cursor of the page before, given with the same board, scope, "
            "period and period_id (another view's is a 422)",
        ),
    ] = None
    rank_style: _RankStyle = "ordinal"


class StandingQuery(BaseModel):
    """The standing read's query. The teams scope has no users (422 there): the document leaves
    it out, while the server's own check keeps giving that 422 its message."""

    model_config = ConfigDict(frozen=True)

    scope: Annotated[
        str,
        Field(
            max_length=80,
            pattern=views.SCOPE_PATTERN,
            json_schema_extra={"pattern": views.SCOPE_PATTERN.replace("|teams|", "|")},
            description=_USER_SCOPE_TEXT,
        ),
    ] = "global"
    period: Period = "alltime"
    period_id: _PeriodId = None
    around: Annotated[int, Field(ge=0, le=50), IN_DIGITS] = 0
    rank_style: _RankStyle = "ordinal"


class _PathDoc(BaseModel):
    """The path parameters as the document describes them (checked by :func:`path_errors`)."""

    user_id: Annotated[str, Field(pattern=USER_ID_PATTERN, examples=["u-42"])]
    board_id: Annotated[
        str, Field(pattern=BOARD_ID_PATTERN, description="Board id", examples=["main"])
    ]


Q = TypeVar("Q", bound=BaseModel)
_PATHS = {"board_id": re.compile(BOARD_ID_PATTERN), "user_id": re.compile(USER_ID_PATTERN)}


def parameters_of(
    path: tuple[str, ...], query: type[BaseModel] | None = None
) -> list[dict[str, Any]]:
    """The OpenAPI parameters of these path parameters and of a query model (if any), as FastAPI
    writes those of parameters declared one by one."""
    out: list[dict[str, Any]] = []
    for where, model, names in (("path", _PathDoc, path), ("query", query, None)):
        if model is None:
            continue
        properties = model.model_json_schema()["properties"]
        for name in names or properties:
            schema = properties[name]
            parameter = {"name": name, "in": where, "required": where == "path", "schema": schema}
            if "description" in schema:
                parameter["description"] = schema["description"]
            out.append(parameter)
    return out


def path_errors(request: Request, *names: str) -> list[dict[str, Any]]:
    """The errors of path parameters, as FastAPI would give them."""
    errors: list[dict[str, Any]] = []
    for name in names:
        value = request.path_params[name]
        if not _PATHS[name].fullmatch(value):
            pattern = _PATHS[name].pattern
            errors.append(
                {
                    "type": "string_pattern_mismatch",
                    "loc": ("path", name),
                    "msg": f"String should match pattern '{pattern}'",
                    "input": value,
                }
            )
    return errors


# Valid queries as validated, by model and query string: the reads of a client or a bench repeat a
# few query strings (a standing's user is in its path), so most reads skip the parse and the
# validation. The oldest entry leaves first; a query that fails is never kept.
_QUERIES: dict[tuple[type[BaseModel], bytes], BaseModel] = {}
_QUERIES_KEPT = 512


def query_of(model: type[Q], request: Request, errors: list[dict[str, Any]]) -> Q:
    """The query as ``model`` in one validation, or one 422 naming its errors after ``errors``
    (those of the path), as FastAPI would, with a parameter the route does not declare or one
    given twice. ``model`` is frozen: one instance serves every read of the same query string
    (which was checked once)."""
    key = (model, request.scope["query_string"])
    query = _QUERIES.get(key)
    if query is None:
        # A parameter the route does not declare, or one given twice (strict_query.py).
        refused = query_errors(request)
        try:
            query = model.model_validate(dict(request.query_params))
        except ValidationError as exc:
            errors = errors + [
                {**e, "loc": ("query", *e["loc"])}
                for e in exc.errors(include_url=False, include_context=False)
            ]
            raise RequestValidationError(errors + refused) from None
        if refused:
            raise RequestValidationError(errors + refused)
        if len(_QUERIES) >= _QUERIES_KEPT:
            del _QUERIES[next(iter(_QUERIES))]
        _QUERIES[key] = query
    if errors:
        raise RequestValidationError(errors)
    return cast(Q, query)


class DirectRoute(APIRoute):
    """A route whose endpoint takes only the request and returns its ``Response``: documented
    as any other, but called directly, without FastAPI's request handler around it, which
    solves the (empty) dependencies and parses the query string again on every request (a tenth
    of a worker's CPU under single score POSTs). The endpoint checks its path and query itself
    (path_errors, query_of); problems it raises go to the app's handlers as before."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return cast(Callable[[Request], Coroutine[Any, Any, Response]], self.endpoint)


class DirectPaths:
    """The router's shortcut to the hottest reads: a ``GET`` of one of these :class:`DirectRoute`
    paths goes straight to the route's endpoint, without the walk over the app's routers and
    their routes that finds it (FastAPI's included routers are matched one inside the other:
    about a fifth of a rank read's samples in the API, py-spy). It stands in the router's place,
    inside every middleware and the exception handlers, so what a read answers, problems
    included, is what it answered through the router; every other request goes on to the
    router.

    Give it only routes that the router would pick first for a ``GET`` of their paths (no route
    before them matches one), with plain ``{name}`` parameters; tests/api/test_direct_paths.py
    checks that the app answers alike without it.
    """

    def __init__(self, app: ASGIApp, routes: Sequence[DirectRoute]) -> None:
        self.app = app
        self._routes: list[tuple[re.Pattern[str], DirectRoute]] = []
        for route in routes:
            if route.methods != {"GET"} or not all(
                type(convertor) is StringConvertor for convertor in route.param_convertors.values()
            ):
                raise ValueError(f"not a GET route of plain parameters: {route.path}")
            self._routes.append((route.path_regex, route))

    def match(self, scope: Scope) -> DirectRoute | None:
        """The route of a ``GET`` of one of these paths, its match put in ``scope``; else None."""
        # A root path (the app mounted below one) is the router's to strip: left to it.
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            path = scope["path"]
            for regex, route in self._routes:
                match = regex.match(path)
                if match is not None:
                    # What the route's own match puts in the scope (Starlette's, then FastAPI's).
                    scope["endpoint"] = route.endpoint
                    scope["path_params"] = {**scope.get("path_params", {}), **match.groupdict()}
                    scope["route"] = route
                    return route
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.match(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        response = await route.endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


def no_idempotency_key(request: Request) -> None:
    """A batch takes no ``Idempotency-Key`` (422, before its events are judged): the header names
    one event, and a batch's events carry their own ``event_id`` each; a retried batch read as
    idempotent by it would count its events without ids again (docs/api.md section 4)."""
    if "idempotency-key" in request.headers:
        raise Invalid(
            "A batch takes no Idempotency-Key: each event carries its own event_id.",
            loc=("header", "Idempotency-Key"),
        )


NoIdempotencyKey = Annotated[None, Depends(no_idempotency_key)]
