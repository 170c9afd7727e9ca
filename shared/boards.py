"""Board definitions: what a leaderboard counts and how it ranks.

The history database (table ``boards``, :mod:`shared.db_boards`) is the source of truth of the
definitions; the Redis hash ``Keys.boards`` is their projection, which every service reads
through :class:`BoardCatalog`. The API writes a definition to MySQL, then to Redis, and at
start-up restores the hash from MySQL, so definitions outlive a Redis that keeps nothing. Board
``main`` exists out of the box with :data:`MAIN_BOARD`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cachetools import TTLCache
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)
from redis.asyncio import Redis

from shared.keys import Keys
from shared.periods import CALENDAR_PERIODS, Period, schedule_error
from shared.ranking import MAX_SCORE, SubscoreOrder

# The IANA zones (the tzdata package's, and the host's): not the host-only names that ZoneInfo
# also finds on disk (localtime, posixrules) or Factory, which names no place.
_ZONES = frozenset(available_timezones()) - {"localtime", "posixrules", "Factory"}

BOARD_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
BoardId = Annotated[str, Field(pattern=BOARD_ID_PATTERN)]
# The pattern of shared.events.Region (which imports this module), the same as a board id's.
DeclaredRegion = Annotated[str, Field(pattern=BOARD_ID_PATTERN)]
MAIN_BOARD_ID = "main"
MAX_REGIONS = 64
"""The most regions a board may declare: what a read or merge walking a user's regions costs at
most on a board that declares them (docs/security.md, "Invented regions and teams")."""


class Retention(BaseModel):
    # Strict integers, as scores are (docs/api.md section 1): "7", 7.0 and true are refused.
    model_config = ConfigDict(frozen=True, extra="forbid")

    daily: StrictInt = Field(default=35, ge=1, le=3660)
    weekly: StrictInt = Field(default=12, ge=1, le=520)
    monthly: StrictInt = Field(default=12, ge=1, le=120)
    season: StrictInt = Field(default=12, ge=1, le=10_000)

    def of(self, period: Period) -> int | None:
        return None if period == "alltime" else int(getattr(self, period))


class BoardSpec(BaseModel):
    """A board definition as a client sends it; every field has the default of board ``main``.
    Its integers and booleans are JSON's own: ``"500"``, ``500.0`` and ``true`` are no integer,
    and ``1`` and ``"yes"`` no boolean (a lax ``true`` made a ``max_value`` of 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operator: Literal["incr", "best", "set"] = "incr"
    order: Literal["desc", "asc"] = "desc"
    subscore_order: SubscoreOrder | None = None
    periods: tuple[Period, ...] = ("daily", "weekly", "monthly", "alltime")
    timezone: str = Field(default="UTC", description="An IANA time zone name: Europe/Berlin")
    min_value: StrictInt = Field(default=-1_000_000, ge=-MAX_SCORE, le=MAX_SCORE)
    max_value: StrictInt = Field(default=1_000_000, ge=-MAX_SCORE, le=MAX_SCORE)
    retention: Retention = Retention()
    notify_top: tuple[Annotated[StrictInt, Field(ge=1, le=1000)], ...] = (1, 10, 100)
    player_writes: StrictBool = False
    regions: tuple[DeclaredRegion, ...] | None = Field(
        default=None,
        max_length=MAX_REGIONS,
        description="The board's regions: an event naming another is refused (422). null: any "
        "region a server key names; a board with player_writes must declare them",
    )
    badges: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")], StrictInt] = Field(
        default_factory=dict
    )
    schedule: str | None = Field(
        default=None,
        max_length=200,
        description="A 5-field cron expression in the board's timezone (no R or H, which pick "
        "a time anew at each reading): it adds the period season, from one firing to the next "
        "(ids like 2026-12-04T18:00). null: no seasons",
    )

    @model_validator(mode="before")
    @classmethod
    def _season_period(cls, data: Any) -> Any:
        """A schedule adds ``season`` to the periods (stored and returned with them), last: a
        ``season`` the client named elsewhere moves there (one named twice is left for the
        periods' own check to refuse)."""
        if isinstance(data, dict) and data.get("schedule") is not None:
            periods = data.get("periods", CALENDAR_PERIODS)
            if isinstance(periods, list | tuple) and list(periods).count("season") <= 1:
                rest = tuple(period for period in periods if period != "season")
                data = {**data, "periods": (*rest, "season")}
        return data

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is None:
            return None
        error = schedule_error(value)
        if error is not None:
            raise ValueError(error)
        return " ".join(value.split())

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

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("regions must name at least one region, or be null")
        if len(set(value)) != len(value):
            raise ValueError("regions must not repeat")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        # An IANA name: not a file ZoneInfo finds on one host only (localtime, posixrules,
        # Factory), whose periods would differ from host to host.
        if value not in _ZONES:
            raise ValueError(f"unknown timezone {value!r} (an IANA name, e.g. Europe/Berlin)")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> BoardSpec:
        if self.min_value > self.max_value:
            raise ValueError("min_value must not exceed max_value")
        if self.subscore_order is not None and self.operator == "incr":
            raise ValueError("subscore_order is for best and set boards: incr sums no subscores")
        if "season" in self.periods and self.schedule is None:
            raise ValueError("the period season needs a schedule")
        return self

    @property
    def descending(self) -> bool:
        return self.order == "desc"

    @property
    def takes_player_writes(self) -> bool:
        """Whether player tokens may write: ``player_writes`` on a board that declares its
        regions. A definition stored before regions could be declared keeps ``player_writes``
        but refuses players until an admin declares its regions (docs/api.md section 3)."""
        return self.player_writes and self.regions is not None

    def names_region(self, region: str) -> bool:
        """Whether an event may name ``region`` on this board."""
        return self.regions is None or region in self.regions


def stored_schedule(value: str | None) -> str | None:
    """A board's schedule as definitions were checked before croniter's ``R`` was refused: a
    stored one reads as it was, and a ``PUT`` may keep it (:func:`refused_new`)."""
    if value is None:
        return None
    error = schedule_error(value, stored=True)
    if error is not None:
        raise ValueError(error)
    return " ".join(value.split())


def stored_timezone(value: str) -> str:
    """A board's timezone as definitions were checked before only IANA names were taken: any
    zone ZoneInfo finds here. A stored one reads as it was, and a ``PUT`` may keep it."""
    try:
        ZoneInfo(value)
    # OSError: a name too long for a file name, which ZoneInfo looks for on disk.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown timezone {value!r} (an IANA name, e.g. Europe/Berlin)") from exc
    return value


def refused_new(board: BoardSpec, previous: BoardSpec | None) -> tuple[str, str] | None:
    """The field of ``board`` that a ``PUT`` may not bring in, and why (None: none): a timezone
    that is no IANA name, or a schedule using croniter's ``R``, which only a board stored with
    it already may keep (docs/api.md section 3)."""
    if board.timezone not in _ZONES and (previous is None or previous.timezone != board.timezone):
        return "timezone", f"unknown timezone {board.timezone!r} (an IANA name, e.g. Europe/Berlin)"
    if board.schedule is not None and (previous is None or previous.schedule != board.schedule):
        error = schedule_error(board.schedule)
        if error is not None:
            return "schedule", error
    return None


class StoredSpec(BoardSpec):
    """A spec whose timezone and schedule are judged as a stored definition's: a timezone that
    names a host's file (``localtime``, ``posixrules``, ``Factory``) or a schedule using
    croniter's ``R``, which definitions took before they were refused, still reads. Whether a
    ``PUT`` may bring one in is judged against the stored definition (:func:`refused_new`)."""

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        return stored_schedule(value)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        return stored_timezone(value)


class Board(StoredSpec):
    """A stored definition: a spec with its id.

    Read back as it was stored (:class:`StoredSpec`), as a board stored with ``player_writes``
    and no regions is, so that such a board stops no service that reads the catalog.
    """

    # As answered, a definition carries every field: the document says so (required), where
    # a field's default would make it optional, as it is in a PUT's body.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    board_id: BoardId


MAIN_BOARD = Board(board_id=MAIN_BOARD_ID)


BOARD_CACHE_SIZE = 10_000
"""The most board definitions a :class:`BoardCatalog` remembers."""

DEFINITION_TTL = 5.0
"""Seconds a :class:`BoardCatalog` keeps a definition it read: a changed definition reaches every
process within that time."""


class BoardCatalog:
    """Reads board definitions from Redis, caching each one found for a few seconds.

    The cache is bounded in time and size (least recently used ids leave first). A missing id is
    not cached: a board created by another process is seen at its first request, not a few
    seconds later, and a flood of made-up ids (read before a request's credential is known)
    costs one ``HGET`` each and no memory.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        ttl: float = DEFINITION_TTL,
        maxsize: int = BOARD_CACHE_SIZE,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._cache: TTLCache[str, Board] = TTLCache(maxsize=maxsize, ttl=ttl)
        # What all() parsed, by stored text.
        self._parsed: dict[str, Board] = {}

    @property
    def cached(self) -> int:
        """How many definitions the cache holds now."""
        self._cache.expire()
        return len(self._cache)

    @property
    def maxsize(self) -> int:
        return int(self._cache.maxsize)

    async def ensure_defaults(self) -> None:
        """Create board ``main`` if no definition of it is stored yet."""
        await self._redis.hsetnx(self._keys.boards, MAIN_BOARD_ID, MAIN_BOARD.model_dump_json())

    async def put(self, board: Board) -> None:
        """Store ``board`` in Redis (after it is stored in MySQL) and forget any cached copy.

        Other processes see it once their own cached copy ages out, within ``ttl`` seconds.
        """
        await self._redis.hset(self._keys.boards, board.board_id, board.model_dump_json())
        self._cache.pop(board.board_id, None)

    async def remove(self, board_id: str) -> None:
        """Take a deleted board's definition out of Redis (after MySQL) and forget any cached
        copy; other processes stop seeing it within ``ttl`` seconds."""
        await self._redis.hdel(self._keys.boards, board_id)
        self._cache.pop(board_id, None)

    async def restore(self, boards: list[Board]) -> None:
        """Write ``boards``, as loaded from MySQL, over whatever Redis holds for them.

        Overwriting rather than only filling gaps: another process may have put the default
        ``main`` there first (:meth:`ensure_defaults`), and MySQL is the source of truth. Call
        it under :func:`shared.db_boards.definitions_lock`, which every definition writer takes,
        so that a ``PUT`` racing the restore cannot be overwritten with the older definition.
        Boards that Redis holds and MySQL does not are left alone.
        """
        if boards:
            mapping: dict[Any, str] = {board.board_id: board.model_dump_json() for board in boards}
            await self._redis.hset(self._keys.boards, mapping=mapping)
        self._cache.clear()

    def peek(self, board_id: str) -> Board | None:
        """The definition of ``board_id`` if the local cache holds it (as :meth:`get` would
        answer without asking Redis), else None."""
        try:
            return self._cache[board_id]
        except KeyError:
            return None

    async def get(self, board_id: str, *, fresh: bool = False) -> Board | None:
        """The definition of ``board_id``, from the local cache unless ``fresh``."""
        if not fresh:
            try:
                return self._cache[board_id]
            except KeyError:
                pass
        raw = await self._redis.hget(self._keys.boards, board_id)
        if raw is None:
            return None
        board = Board.model_validate_json(raw)
        self._cache[board_id] = board
        return board

    async def defined(self, board_id: str) -> bool:
        """Whether a definition of ``board_id`` is stored now (Redis, not the cache)."""
        return bool(await self._redis.hexists(self._keys.boards, board_id))

    async def all(self) -> list[Board]:
        """Every stored definition, by board id. Each is parsed once while its stored text
        stays the same: the tickers that go over every board ask for all of them each tick."""
        raw = await self._redis.hgetall(self._keys.boards)
        known, self._parsed = self._parsed, {}
        for value in raw.values():
            text = str(value)  # the client decodes replies
            board = known.get(text)
            self._parsed[text] = board if board is not None else Board.model_validate_json(text)
        return sorted(self._parsed.values(), key=lambda b: b.board_id)
