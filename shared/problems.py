"""Problem details (RFC 9457) as every Ladder server answers them: the API's routes
(services/api/errors.py) and the consumers' operations routes (shared/ops.py)."""

from __future__ import annotations

from typing import Any

PROBLEM = "application/problem+json"
TYPE_BASE = "https://ladder.dev/problems/"


def problem_body(status: int, title: str, slug: str, detail: str) -> dict[str, Any]:
    """A problem's body: its ``type`` is ``TYPE_BASE`` and ``slug``."""
    return {"type": TYPE_BASE + slug, "title": title, "status": status, "detail": detail}
