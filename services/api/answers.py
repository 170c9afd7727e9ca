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


def json_answer(content: dict[str, Any]) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
