"""What a score write takes and answers (docs/api.md section 4), as the OpenAPI document shows
them."""

from __future__ import annotations

import math
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from shared.events import DisplayName, EventId, Region, Rfc3339Time, TeamId, UserId
from shared.ranking import MAX_SCORE

METADATA_MAX_BYTES = 1024
# Levels of objects and arrays in metadata, the object itself the first. An event's metadata
# travels four levels down a broker message, whose consumers' parser stops at about 200 levels:
# deeper metadata would make the whole message, every event of it, unreadable.
METADATA_MAX_DEPTH = 32
"""The most bytes an entry's metadata may take, serialised as compact JSON."""


def metadata_text(metadata: dict[str, Any]) -> str:
    """Metadata as the compact JSON text that is kept, stored and measured."""
    return orjson.dumps(metadata).decode()


class ScoreIn(BaseModel):
    """A score as a game sends it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "event_id": "c0ffee-42",
                    "user_id": "u-42",
                    "region": "eu",
                    "value": 25,
                    "team_id": "red-wombats",
                    "display_name": "Ana",
                }
            ]
        },
    )

    event_id: EventId | None = Field(default=None, description="Idempotency key")
    user_id: UserId
    region: Region
    value: StrictInt = Field(
        ge=-MAX_SCORE, le=MAX_SCORE, description="A delta (incr) or a score (best, set)"
    )
    team_id: TeamId | None = None
    display_name: DisplayName | None = None
    occurred_at: Rfc3339Time | None = Field(
        default=None, description="RFC 3339 with an offset; defaults to now"
    )
    subscore: StrictInt | None = Field(
        default=None,
        ge=-MAX_SCORE,
        le=MAX_SCORE,
        description="Required on boards with a subscore_order, refused on others: equal scores "
        "rank by it, in the board's subscore_order",
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description=f"A JSON object of at most {METADATA_MAX_BYTES} bytes as compact JSON and "
        f"{METADATA_MAX_DEPTH} levels of objects and arrays, kept "
        "with the entry's score and returned with it (a replay id, a car, a loadout)",
    )

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if _deeper_than(value, METADATA_MAX_DEPTH):
            raise ValueError(
                f"metadata nests objects and arrays more than {METADATA_MAX_DEPTH} levels deep"
            )
        try:
            text = metadata_text(value)
        except orjson.JSONEncodeError as exc:
            # Nested past orjson's depth, or an integer past 64 bits.
            raise ValueError(f"metadata cannot be kept as JSON: {exc}") from None
        # A number past a double's range (1e400) is read as an infinity, which JSON has no
        # word for: it would be kept as null.
        if "null" in text and _non_finite(value):
            raise ValueError("metadata holds a number past a double's range (about 1.8e308)")
        size = len(text.encode())
        if size > METADATA_MAX_BYTES:
            raise ValueError(
                f"metadata is {size} bytes as compact JSON; at most {METADATA_MAX_BYTES}"
            )
        return value


def _deeper_than(value: Any, levels: int) -> bool:
    """Whether objects and arrays nest in ``value`` more than ``levels`` deep (``value`` the
    first level); it stops at the first branch that does."""
    if not isinstance(value, dict | list):
        return False
    if levels == 0:
        return True
    inner = value.values() if isinstance(value, dict) else value
    return any(_deeper_than(v, levels - 1) for v in inner)


def _non_finite(value: Any) -> bool:
    """Whether a parsed JSON value holds an infinity (or a NaN) anywhere."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


class PeriodOut(BaseModel):
    period_id: str
    score: int
    rank: int = Field(description="1-based rank in the user's region for this period")
    previous_rank: int | None
    improved: bool


class ScoreOut(BaseModel):
    event_id: str
    duplicate: bool
    board_id: str
    user_id: str
    region: str
    periods: dict[str, PeriodOut]
