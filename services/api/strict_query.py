"""Query strings checked as strictly as bodies: a parameter the route does not declare, or a
second value of one that takes a single value, is a 422 naming it (docs/api.md section 1), as an
unknown field of a body is, instead of being ignored (a typo such as ``?limt=5`` answered as if
no limit were asked) or silently losing to the other value (``?limit=5&limit=50``).

What a route declares is taken from its own definition: the query parameters FastAPI solves for
it (its endpoint's and its dependencies'), and those its ``openapi_extra`` documents (the routes
that read their query themselves, :class:`~services.api.routes.params.DirectRoute`). A parameter
whose type is a list takes several values.

Routes solved by FastAPI use :class:`StrictQueryRoute`: their credential and board (dependencies)
are judged first, then these errors come in one 422 with those of the path, query and body, and
the endpoint does not run. A direct route calls :func:`query_errors` where it checks its query.
"""

from __future__ import annotations

import collections.abc
import contextvars
import functools
import inspect
import types
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Request, Response, params
from fastapi.dependencies.utils import get_flat_params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.datastructures import QueryParams

UNKNOWN = "Extra inputs are not permitted"
"""What an undeclared parameter's error says: what pydantic says of a body's unknown field."""


class Declared:
    """The query parameters a route declares: their names, and those of them that take a list."""

    __slots__ = ("lists", "names")

    def __init__(self, names: frozenset[str], lists: frozenset[str]) -> None:
        self.names = names
        self.lists = lists


def takes_several(annotation: Any) -> bool:
    """Whether a query parameter of type ``annotation`` takes several values: a list, set or
    tuple of them, optional or annotated (``list[str] | None``), as FastAPI reads it."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return takes_several(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(takes_several(arg) for arg in get_args(annotation) if arg is not type(None))
    kind = origin or annotation
    return (
        isinstance(kind, type)
        and issubclass(kind, (collections.abc.Sequence, collections.abc.Set))
        and not issubclass(kind, (str, bytes))
    )


def declared_of(route: APIRoute) -> Declared:
    """What ``route`` declares (kept on the route: it is asked on each request)."""
    found = route.__dict__.get("_ladder_query")
    if isinstance(found, Declared):
        return found
    names: set[str] = set()
    lists: set[str] = set()
    for field in get_flat_params(route.dependant):
        if not isinstance(field.field_info, params.Query):
            continue
        names.add(field.alias)
        if takes_several(field.field_info.annotation):
            lists.add(field.alias)
    for parameter in (route.openapi_extra or {}).get("parameters", ()):
        if parameter.get("in") == "query":
            names.add(parameter["name"])
            if parameter.get("schema", {}).get("type") == "array":
                lists.add(parameter["name"])
    declared = Declared(frozenset(names), frozenset(lists))
    route.__dict__["_ladder_query"] = declared
    return declared


def errors_of(query: QueryParams, declared: Declared) -> list[dict[str, Any]]:
    """One error for each parameter of ``query`` that ``declared`` does not have, and for each
    single-valued one given more than once, in the order they first appear."""
    counts = Counter(name for name, _ in query.multi_items())
    errors: list[dict[str, Any]] = []
    for name, count in counts.items():
        if name not in declared.names:
            errors.append({"type": "extra_forbidden", "loc": ("query", name), "msg": UNKNOWN})
        elif count > 1 and name not in declared.lists:
            errors.append(
                {
                    "type": "repeated_parameter",
                    "loc": ("query", name),
                    "msg": f"A single value is allowed; the query gives {count}",
                }
            )
    return errors


def query_errors(request: Request) -> list[dict[str, Any]]:
    """The errors of the request's query string against its route's declared parameters. A
    request without a query string costs one look."""
    if not request.scope["query_string"]:
        return []
    return errors_of(request.query_params, declared_of(request.scope["route"]))


# The errors of the query of the request being handled, for its endpoint's guard.
_PENDING: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "ladder_query_errors", default=None
)


def _refuse_pending() -> None:
    errors = _PENDING.get()
    if errors:
        raise RequestValidationError(errors)


def _guarded(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint``, unless the query had errors: then they are raised in its place (after
    FastAPI found every other error valid). FastAPI reads the signature through the wrap."""
    if inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            _refuse_pending()
            return await endpoint(*args, **kwargs)

        return guarded_async

    @functools.wraps(endpoint)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _refuse_pending()
        return endpoint(*args, **kwargs)

    return guarded


class StrictQueryRoute(APIRoute):
    """A route solved by FastAPI whose query string is checked against what it declares. A
    request whose query is refused goes through FastAPI's handler as any other (dependencies
    first: the credential and the board judged before it), its path, query and body errors
    joined with the query's in one 422; its endpoint never runs."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _guarded(endpoint), **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        route = self

        async def checked(request: Request) -> Response:
            if not request.scope["query_string"]:
                return await handler(request)
            errors = errors_of(request.query_params, declared_of(route))
            if not errors:
                return await handler(request)
            token = _PENDING.set(errors)
            try:
                return await handler(request)
            except RequestValidationError as exc:
                found = list(exc.errors())
                if found is errors or found == errors:
                    raise
                raise RequestValidationError([*found, *errors], body=exc.body) from None
            finally:
                _PENDING.reset(token)

        return checked
