"""Activity and stats of a board (docs/api.md section 8): the feed of the newest accepted events and
a period's distinct players and accepted events, all kept by the aggregator from the event
stream (shared/lua/derive.lua): each answer's ``as_of`` is when it last applied a batch of the
board, so that a client knows how far behind the read may trail the writes."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import structlog
from fastapi import APIRouter, FastAPI, Query
from pydantic import BaseModel, Field

from services.api.errors import Invalid, problems
from services.api.reads import views
from services.api.routes.params import IN_DIGITS, PeriodIdQuery, PeriodQuery
from services.api.state import PUBLIC_READ, BoardDep, Reader, State
from services.api.strict_json import StrictJsonRoute
from shared.db import EventRecord
from shared.keys import DERIVED_FIELD
from shared.periods import Period

log = structlog.get_logger(__name__)

# Mounted under /v1/boards by the reads router.
router = APIRouter(prefix="/v1/boards", tags=["activity"], route_class=StrictJsonRoute)

FEED_LIMIT_DEFAULT = 20


AS_OF = (
    "When the aggregator last applied a batch of the board's events to this view (RFC 3339); "
    "events accepted since may not show yet. null: it has applied none."
)


class FeedOut(BaseModel):
    events: list[EventRecord] = Field(description="Newest first")
    as_of: str | None = Field(description=AS_OF)


class StatsOut(BaseModel):
    board_id: str
    period: Period
    period_id: str
    players: int = Field(description="Distinct users who scored (HyperLogLog, within about 1%)")
    events: int = Field(description="Accepted events, exact, as of as_of")
    as_of: str | None = Field(description=AS_OF)


FEED_PATH = "/v1/boards/{board_id}/feed"


def document_feed_length(app: FastAPI, length: int) -> None:
    """Make ``app``'s OpenAPI document give the feed's ``limit`` its maximum, the deployment's
    feed length (``LADDER_FEED_LENGTH``), and its default, 20 or that length if shorter, which a
    route's ``Query``, fixed when the module loads, cannot follow."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            operation = build()["paths"][FEED_PATH]["get"]
            for parameter in operation["parameters"]:
                if parameter["name"] == "limit":
                    parameter["schema"]["default"] = min(FEED_LIMIT_DEFAULT, length)
                    for option in parameter["schema"]["anyOf"]:
                        if option.get("type") == "integer":
                            option["maximum"] = length
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


@router.get(
    "/{board_id}/feed",
    response_model=FeedOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
)
async def feed(
    board: BoardDep,
    state: State,
    _: Reader,
    limit: Annotated[
        int | None,
        # The bound is the configured feed length (checked below, 422 past it), not a constant:
        # a feed kept longer than 1000 events is read whole. The OpenAPI document says it
        # (document_feed_length()).
        Query(
            ge=1,
            description="1 to the feed length, LADDER_FEED_LENGTH (default 1000), 422 past it; "
            "default 20 or the feed length if shorter",
        ),
        IN_DIGITS,
    ] = None,
) -> dict[str, Any]:
    """The newest accepted events of the board, newest first. The feed keeps the last
    ``LADDER_FEED_LENGTH`` events and trims itself; the events of users hidden on the board are
    left out of the page (which may then hold fewer than ``limit``)."""
    length = state.settings.feed_length
    if limit is None:
        limit = min(FEED_LIMIT_DEFAULT, length)
    elif limit > length:
        raise Invalid(f"limit must be at most the feed length, {length}.", loc=("query", "limit"))
    bid = board.board_id
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.lrange(state.keys.feed(bid), 0, limit - 1)
        pipe.hget(state.keys.as_of(bid), DERIVED_FIELD)
        pipe.smembers(state.keys.hidden(bid))
        raw, as_of, hidden = await pipe.execute()
    events = []
    for item in raw:
        try:
            event = _feed_event(orjson.loads(item))
            # A hidden user's events are not shown while it is hidden (docs/api.md section 8b):
            # the page may then hold fewer than ``limit``.
            if event["user_id"] not in hidden:
                events.append(event)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("unreadable feed entry", board_id=board.board_id)
    return {"events": events, "as_of": as_of}


def _feed_event(entry: dict[str, Any]) -> dict[str, Any]:
    """A feed entry (the event's record as the write was given it) shaped as the events read
    shows an event (``EventRecord``). The record has ``subscore`` and ``metadata`` only where
    the event had them, so that records of boards without them stay as they were; the answer
    always has both, null when absent, as the events read does."""
    return {
        "event_id": entry["event_id"],
        "user_id": entry["user_id"],
        "region": entry["region"],
        "team_id": entry["team_id"],
        "value": entry["value"],
        "subscore": entry.get("subscore"),
        "metadata": entry.get("metadata"),
        "occurred_at": entry["occurred_at"],
        "accepted_at": entry["accepted_at"],
    }


@router.get(
    "/{board_id}/stats",
    response_model=StatsOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
)
async def stats(
    board: BoardDep,
    state: State,
    _: Reader,
    period: PeriodQuery = "alltime",
    period_id: PeriodIdQuery = None,
) -> dict[str, Any]:
    """How many distinct players scored in a period (approximate) and how many events were
    accepted in it (exact)."""
    window = views.resolve_window(
        board, period, period_id, ahead=state.settings.future_tolerance_seconds
    )
    keys, bid = state.keys, board.board_id
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.pfcount(keys.players(bid, period, window.period_id))
        pipe.get(keys.event_count(bid, period, window.period_id))
        pipe.hget(keys.as_of(bid), DERIVED_FIELD)
        players, events, as_of = await pipe.execute()
    return {
        "board_id": bid,
        "period": period,
        "period_id": window.period_id,
        "players": int(players),
        "events": int(events or 0),
        "as_of": as_of,
    }
