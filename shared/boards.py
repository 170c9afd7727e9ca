"""Board definitions: what a leaderboard counts and how it ranks.

Definitions live in the Redis hash ``Keys.boards``. Board ``main`` exists out of the box with
:data:`MAIN_BOARD`; every service that needs a definition reads it through :class:`BoardCatalog`.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from redis.asyncio import Redis

from shared.keys import Keys
from shared.periods import Period
from shared.ranking import MAX_SCORE

BOARD_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
BoardId = Annotated[str, Field(pattern=BOARD_ID_PATTERN)]
MAIN_BOARD_ID = "main"


class Retention(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    daily: int = Field(default=35, ge=1, le=3660)
    weekly: int = Field(default=12, ge=1, le=520)
    monthly: int = Field(default=12, ge=1, le=120)

    def of(self, period: Period) -> int | None:
        return None if period == "alltime" else int(getattr(self, period))


class BoardSpec(BaseModel):
    """A board definition as a client sends it; every field has the default of board ``main``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operator: Literal["incr", "best", "set"] = "incr"
    order: Literal["desc", "asc"] = "desc"
    periods: tuple[Period, ...] = ("daily", "weekly", "monthly", "alltime")
    timezone: str = "UTC"
    min_value: int = Field(default=-1_000_000, ge=-MAX_SCORE, le=MAX_SCORE)
    max_value: int = Field(default=1_000_000, ge=-MAX_SCORE, le=MAX_SCORE)
    retention: Retention = Retention()
    notify_top: tuple[Annotated[int, Field(ge=1, le=1000)], ...] = (1, 10, 100)
    player_writes: bool = False
    badges: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")], int] = Field(
        default_factory=dict
    )

    @field_validator("periods")
    @classmethod
    def _periods(cls, value: tuple[Period, ...]) -> tuple[Period, ...]:
        if not value:
            raise ValueError("a board needs at least one period")
        if len(set(value)) != len(value):
            raise ValueError("periods must not repeat")
        return value

    @field_validator("notify_top")
    @classmethod
    def _brackets(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value):
            raise ValueError("notify_top must not repeat")
        return tuple(sorted(value))

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r}") from exc
        return value

    @model_validator(mode="after")
    def _bounds(self) -> BoardSpec:
        if self.min_value > self.max_value:
            raise ValueError("min_value must not exceed max_value")
        return self

    @property
    def descending(self) -> bool:
        return self.order == "desc"


class Board(BoardSpec):
    """A stored definition: a spec with its id."""

    board_id: BoardId


MAIN_BOARD = Board(board_id=MAIN_BOARD_ID)


class BoardCatalog:
    """Reads board definitions from Redis, caching each for a few seconds."""

    def __init__(self, redis: Redis, keys: Keys, ttl: float = 5.0) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl = ttl
        self._cache: dict[str, tuple[float, Board | None]] = {}

    async def ensure_defaults(self) -> None:
        """Create board ``main`` if no definition of it is stored yet."""
        await self._redis.hsetnx(self._keys.boards, MAIN_BOARD_ID, MAIN_BOARD.model_dump_json())

    async def get(self, board_id: str) -> Board | None:
        now = time.monotonic()
        hit = self._cache.get(board_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        raw = await self._redis.hget(self._keys.boards, board_id)
        board = Board.model_validate_json(raw) if raw is not None else None
        self._cache[board_id] = (now + self._ttl, board)
        return board

    async def all(self) -> list[Board]:
        raw = await self._redis.hgetall(self._keys.boards)
        return sorted(
            (Board.model_validate_json(v) for v in raw.values()), key=lambda b: b.board_id
        )
