"""Leaderboard, standing and history reads (API.md sections 3, 5 and 7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel

from services.api import views
from services.api.errors import Invalid
from services.api.state import BoardDep, Caller, Reader, State
from shared.boards import Board
from shared.db import BadCursor, EventRecord, user_events
from shared.events import USER_ID_PATTERN, rfc3339
from shared.periods import Period

router = APIRouter(prefix="/v1/boards", tags=["reads"])

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN)]
ScopeQuery = Annotated[str, Query(max_length=80, description="global or region:{region}")]
PeriodQuery = Annotated[Period, Query()]
PeriodIdQuery = Annotated[
    str | None, Query(max_length=16, description="Defaults to the current period")
]


class Entry(BaseModel):
    rank: int
    user_id: str
    score: int
    display_name: str | None


class LeaderboardOut(BaseModel):
    board_id: str
    scope: str
    period: Period
    period_id: str
    total: int
    as_of: str | None
    entries: list[Entry]
    next_cursor: str | None


class StandingOut(BaseModel):
    user_id: str
    rank: int
    score: int
    total: int
    percentile: float
    around: list[Entry]


class EventsOut(BaseModel):
    events: list[EventRecord]
    next_cursor: str | None


class BoardsOut(BaseModel):
    boards: list[Board]


@router.get("", response_model=BoardsOut)
async def list_boards(state: State, _: Reader) -> dict[str, Any]:
    """Every board definition."""
    return {"boards": await state.catalog.all()}


@router.get("/{board_id}", response_model=Board)
async def get_board(board: BoardDep, _: Reader) -> Board:
    """One board definition, with every field."""
    return board


@router.get("/{board_id}/leaderboard", response_model=LeaderboardOut)
async def leaderboard(
    board: BoardDep,
    state: State,
    _: Reader,
    scope: ScopeQuery = "global",
    period: PeriodQuery = "alltime",
    period_id: PeriodIdQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> dict[str, Any]:
    """A page of a board, best first. The global scope is the aggregator's merge of the
    regions; ``as_of`` says when it was merged (for a region, it is the time of the read)."""
    view = views.resolve_view(state.keys, board, scope, period, period_id)
    body = await views.page(state.redis, state.keys, view, limit, cursor)
    if scope == "global":
        as_of = await state.redis.hget(
            state.keys.as_of(board.board_id), f"{period}:{view.period_id}"
        )
    else:
        as_of = rfc3339(datetime.now(UTC))
    return {
        "board_id": board.board_id,
        "scope": scope,
        "period": period,
        "period_id": view.period_id,
        "as_of": as_of,
        **body,
    }


@router.get("/{board_id}/users/{user_id}", response_model=StandingOut)
async def standing(
    board: BoardDep,
    user_id: UserIdPath,
    state: State,
    _: Reader,
    scope: ScopeQuery = "global",
    period: PeriodQuery = "alltime",
    period_id: PeriodIdQuery = None,
    around: Annotated[int, Query(ge=0, le=50)] = 0,
) -> dict[str, Any]:
    """A user's rank and score in one view, with ``around`` entries either side."""
    view = views.resolve_view(state.keys, board, scope, period, period_id)
    return await views.standing(state.redis, state.keys, view, user_id, around)


@router.get("/{board_id}/users/{user_id}/events", response_model=EventsOut)
async def events(
    board: BoardDep,
    user_id: UserIdPath,
    state: State,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> dict[str, Any]:
    """The user's accepted events, newest first, from the history database.

    A server key reads anyone's; a player token its own."""
    caller.require_user(user_id)
    try:
        rows, next_cursor = await user_events(state.engine, board.board_id, user_id, limit, cursor)
    except BadCursor as exc:
        raise Invalid(str(exc), loc=("query", "cursor")) from exc
    return {"events": rows, "next_cursor": next_cursor}
