"""JSON bodies as RFC 8259 has them: ``NaN``, ``Infinity`` and ``-Infinity``, which Python's
``json`` and pydantic's parser take (and a metadata object would then keep as ``null``), are not
JSON, and a body holding one is a 400 like any other invalid body.

FastAPI reads a route's body through ``Request.json()``, before the route's dependencies run.
Routers whose routes take a body use :class:`StrictJsonRoute`, whose request parses with ``json``
as before (integers of any size stay exact) but refuses those three words, and hands a body that
is not JSON on as :class:`Malformed`, so that the credential and the board are judged before it
is answered 400; the single score POST parses its body itself (:func:`refuse_non_json_numbers`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from services.api.strict_query import StrictQueryRoute

M = TypeVar("M", bound=BaseModel)


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")


# A string escape of half a UTF-16 surrogate pair (``\ud800``): JSON's grammar takes it, but it
# is no text, which UTF-8 cannot carry (RFC 8259 section 8.2; I-JSON, RFC 7493, forbids it).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


# Integers of more digits than Python's and pydantic's parsers read (4300, Python's default bound
# on a conversion from text, which spares the service the quadratic cost of a longer one): RFC
# 8259 section 9 lets a reader bound its numbers, and such a body is a 400 that says so.
TOO_LONG = "The body holds an integer of more than 4300 digits, which is not read."
NOT_JSON = "The body is not valid JSON."


def loads(body: bytes) -> Any:
    """``json.loads`` of a UTF-8 body, as the single score POST's parser reads one: a
    ``json.JSONDecodeError`` for ``NaN`` and the infinities, for bytes that are not UTF-8 (in
    place of ``json``'s guess at UTF-16 or UTF-32), for a byte-order mark, and for a string
    holding half a surrogate pair (which no answer could echo: it has no UTF-8)."""
    try:
        found = json.loads(body.decode("utf-8"), parse_constant=_not_json)
        if _SURROGATE_ESCAPE.search(body):
            json.dumps(found, ensure_ascii=False).encode("utf-8")
        return found
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # UnicodeError included
        reason = TOO_LONG if "integer string conversion" in str(exc) else str(exc)
        raise json.JSONDecodeError(reason, body.decode(errors="replace"), 0) from None
    except RecursionError:  # nested deeper than the parser goes
        raise json.JSONDecodeError("nested too deep", body.decode(errors="replace"), 0) from None


class Malformed:
    """A body that is not JSON, as :class:`StrictJsonRequest` reads it: carried on to the
    route's validation instead of refused where it is read, because FastAPI reads a body before
    it runs the route's dependencies, and the credential (401, 403) and the board of the path
    (404) are judged first (docs/api.md section 1, "The credential first"). No body type takes
    it: FastAPI validates a body model from an object's attributes too, and reading any of this
    one's fails, so validation fails, and the error handler answers that failure 400, as invalid
    JSON (:func:`unread_body`)."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail  # the 400's

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # Python's own look-ups (hasattr of a protocol): not there
            raise AttributeError(name)
        raise ValueError("the body is not valid JSON")


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = loads(await self.body())
            except json.JSONDecodeError as exc:
                self._json = Malformed(TOO_LONG if exc.msg == TOO_LONG else NOT_JSON)
        return self._json


def unread_body(errors: Any) -> str | None:
    """The 400's detail where validation ``errors`` (pydantic's) are those of a body not read:
    a :class:`Malformed` one, or one pydantic's parser refused; ``None`` for any other."""
    for error in errors:
        found = error.get("input")
        if isinstance(found, Malformed):
            return found.detail
        if error.get("type") == "json_invalid":
            said = str(error.get("msg"))
            return TOO_LONG if "number out of range" in said or TOO_LONG in said else NOT_JSON
    return None


class StrictJsonRoute(StrictQueryRoute):
    """A route whose JSON body is read by :func:`loads` (:class:`StrictJsonRequest`), and whose
    query string is checked as strictly (services/api/strict_query.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict


def validated(model: type[M], raw: bytes) -> M:
    """``model.model_validate_json(raw)``, but for a number pydantic's parser refuses for its
    length where Python's reads it (a decimal of more than 4300 digits): then the body as
    :func:`loads` reads it, as a batch's is, validated from that. A ``ValidationError`` as
    pydantic raises it; for an integer of more than 4300 digits, which neither reads, a
    ``RequestValidationError`` that the error handler answers 400 (:data:`TOO_LONG`)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if not any("number out of range" in str(e.get("msg")) for e in exc.errors()):
            raise
    try:
        found = loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": exc.msg}]
        ) from None
    return model.model_validate(found)


def refuse_non_json_numbers(raw: bytes) -> None:
    """400 (invalid JSON) for a body with ``NaN`` or an infinity outside a string, which
    pydantic's own JSON parser takes. A body without those letters is not parsed twice."""
    if b"NaN" not in raw and b"Infinity" not in raw:
        return
    try:
        loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": f"JSON decode error: {exc}"}]
        ) from None
