"""Answers of the hottest routes, serialised as they are.

Those routes build their answer in the shape of their response model already (from what the
write function or a read returned), so the model only documents it in the OpenAPI schema:
having FastAPI validate and serialise it again cost as much as the rest of a write's Python
time. tests/api/test_schemathesis.py checks every answer against the schema.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response

_JSON = (b"content-type", b"application/json")


class JsonAnswer(Response):
    """A 200 with ``content`` as its JSON body: the headers Starlette's ``Response`` gives it
    (length, then type), made without its general case (a content and headers of any kind)."""

    media_type = "application/json"

    def __init__(self, content: dict[str, Any]) -> None:
        self.status_code = 200
        self.background = None
        self.body = body = orjson.dumps(content)
        self.raw_headers = [(b"content-length", b"%d" % len(body)), _JSON]


def json_answer(content: dict[str, Any]) -> Response:
    return JsonAnswer(content)
