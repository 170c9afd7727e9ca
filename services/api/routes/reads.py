"""Leaderboard, standing, ranks and history reads (docs/api.md sections 3, 5 and 7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from services.api.answers import json_answer
from services.api.auth import Principal, authenticate, authorization, bearer
from services.api.errors import Invalid, problems
from services.api.reads import pages, ranks, standings, views
from services.api.reads.styles import RankStyle
from services.api.routes.params import (
    IN_DIGITS,
    DirectRoute,
    PageQuery,
    PeriodIdItem,
    RankStyleQuery,
    StandingQuery,
    UserIdPath,
    parameters_of,
    path_errors,
    query_of,
)
from services.api.state import (
    BEARER,
    PUBLIC_READ,
    ApiState,
    BoardDep,
    Caller,
    Reader,
    State,
    get_board,
    opened,
    reader_of,
)
from services.api.strict_json import StrictJsonRoute
from shared.boards import Board
from shared.db import BadCursor, EventRecord, user_events
from shared.events import rfc3339
from shared.keys import DERIVED_FIELD
from shared.periods import PERIODS, Period

router = APIRouter(prefix="/v1/boards", tags=["reads"], route_class=StrictJsonRoute)


_METADATA = (
    "The JSON object kept with the entry's score: of the write that set the best on best "
    "boards, of the latest event (by occurred_at) on set and incr boards; null when none"
)
_SUBSCORE = "Only on boards with a subscore_order: the subscore that ranks equal scores"


class Entry(BaseModel):
    """A user's entry."""

    rank: int
    user_id: str
    score: int
    display_name: str | None
    metadata: dict[str, Any] | None = Field(description=_METADATA)
    subscore: int | None = Field(default=None, description=_SUBSCORE)


class TeamEntry(BaseModel):
    """A team's entry (the teams scope): no user, no display name, no metadata."""

    rank: int
    team_id: str
    score: int = Field(description="The sum of the team's members' scores")
    metadata: None = Field(default=None, description="Always null: a team keeps none")


class LeaderboardOut(BaseModel):
    board_id: str
    scope: str
    period: Period
    period_id: str
    period_ends_at: str | None = Field(
        description="When the period's window ends (RFC 3339, UTC; exclusive): the next "
        "period's start. Null for alltime. Added in this version (docs/api.md section 5)"
    )
    total: int = Field(description="Entries in the scope (friends: the group members who scored)")
    as_of: str | None
    entries: list[Entry | TeamEntry]
    next_cursor: str | None


class StandingOut(BaseModel):
    user_id: str
    rank: int
    score: int
    total: int
    percentile: float = Field(
        description="The share of the scope at or below the user's position, in percent"
    )
    metadata: dict[str, Any] | None = Field(description=_METADATA)
    subscore: int | None = Field(default=None, description=_SUBSCORE)
    around: list[Entry]
    as_of: str | None = Field(
        description="As in the leaderboard read of the same scope: for the global and friends "
        "scopes when the view was last merged (null: never), for a region the time of the read"
    )


class ScopeRank(BaseModel):
    team_id: str | None = Field(default=None, description="Only in the teams scope: the team")
    rank: int
    score: int = Field(description="The user's score; in the teams scope, its team's")
    total: int


class PeriodRanks(BaseModel):
    period_id: str
    scopes: dict[str, ScopeRank] = Field(
        description="global, region:{region}, teams and friends: each where the user (or its "
        "team) has a score in the period; friends only for the player itself or a server key, "
        "and only if it has friends"
    )


class RanksOut(BaseModel):
    board_id: str
    user_id: str
    rank_style: RankStyle
    periods: dict[Period, PeriodRanks]
    as_of: str | None = Field(
        description="When the aggregator last applied a batch of the board's events (RFC 3339; "
        "null: none yet). The user's regions and team are learnt from it: a region or team of "
        "an event accepted since may not show yet"
    )


class EventsOut(BaseModel):
    events: list[EventRecord]
    next_cursor: str | None


Q = TypeVar("Q", bound=BaseModel)
FRIENDS = "friends:"
# What the document says of the reads that check their credential themselves: the bearer
# scheme, as a Reader dependency would declare it, then PUBLIC_READ's empty requirement.
_READ_SECURITY = [{BEARER.scheme_name: []}, *PUBLIC_READ["security"]]


async def _read_of(
    request: Request, model: type[Q], *path: str
) -> tuple[ApiState, Board, Principal, Q]:
    """The state, board, reader and query of a read, checked in the order of the other routes:
    the credential (401, and for a friends scope 403), the board (404), then every path and
    query error in one 422."""
    state: ApiState = request.scope["state"]["ladder"]
    caller = authenticate(bearer(authorization(request.scope)), state.settings)
    reader = reader_of(caller, state)
    opened(state)
    # A friends scope is its player's (401, 403), told without the board or the query's other
    # parameters: judged before them. (The query string is parsed here only if it may name one:
    # it says "friends", or has an escape that may spell it.)
    raw = request.scope["query_string"]
    if b"friends" in raw or b"%" in raw:
        scope = request.query_params.get("scope")
        if scope is not None and scope.startswith(FRIENDS):
            views.check_friends_reader(reader, scope.removeprefix(FRIENDS))
    errors = path_errors(request, "board_id")
    board = None
    if not errors:
        board_id = request.path_params["board_id"]
        board = state.catalog.peek(board_id)
        if board is None:
            board = await get_board(board_id, state)
    query = query_of(model, request, errors + path_errors(request, *path))
    assert board is not None  # a bad board id is among the errors query_of raised
    return state, board, reader, query


def _as_of_field(state: ApiState, view: views.View) -> str:
    """The field of the board's as_of hash that says how far ``view`` may trail: the merge's of
    its period for the global view (which a friends scope is ranked on), the derive step's for
    the teams view; '' for a region's, which the write keeps (its as_of is the read's time)."""
    bid, period, period_id = view.board.board_id, view.period, view.period_id
    if view.key == state.keys.global_view(bid, period, period_id):
        return f"{period}:{period_id}"
    if view.key == state.keys.teams_view(bid, period, period_id):
        return DERIVED_FIELD
    return ""


async def leaderboard(request: Request) -> Response:
    """A page of a board, best first.

    The global scope is the aggregator's merge of the regions, and a friends scope (the player
    and its friends) is ranked on it: ``as_of`` says when it was merged. The teams scope is the
    aggregator's too, summed from the event stream: ``as_of`` says when it last applied a batch
    of the board. For a region, written as each score is, it is the time of the read. Team
    entries carry ``team_id`` and no ``display_name``."""
    state, board, reader, q = await _read_of(request, PageQuery)
    view = await _view_of(state, board, reader, q)
    as_of_field = _as_of_field(state, view)
    body = await pages.page(
        state.redis, state.keys, view, q.limit, q.cursor, q.rank_style, as_of_field
    )
    as_of = body["as_of"] if as_of_field else rfc3339(datetime.now(UTC))
    return json_answer(
        {
            "board_id": board.board_id,
            "scope": q.scope,
            "period": q.period,
            "period_id": view.period_id,
            # Computed from the window, not read: the answer stays one Redis call.
            "period_ends_at": rfc3339(view.ends_at) if view.ends_at is not None else None,
            "as_of": as_of,
            "total": body["total"],
            "entries": body["entries"],
            "next_cursor": body["next_cursor"],
        }
    )


router.add_api_route(
    "/{board_id}/leaderboard",
    leaderboard,
    methods=["GET"],
    response_model=LeaderboardOut,
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra={
        "parameters": parameters_of(("board_id",), PageQuery),
        "security": _READ_SECURITY,
    },
    route_class_override=DirectRoute,
)


async def _view_of(
    state: ApiState, board: Board, reader: Principal, q: PageQuery | StandingQuery
) -> views.View:
    """The view a page or a standing reads, as its query names it."""
    ahead = state.settings.future_tolerance_seconds
    view = views.resolve_view(
        state.keys, board, q.scope, q.period, q.period_id, reader=reader, ahead=ahead
    )
    region = views.undeclared_region(board, q.scope)
    if region is not None and not await state.redis.exists(view.key):
        raise views.refuse_undeclared(board, region)
    return view


async def standing(request: Request) -> Response:
    """A user's rank and score in one view, with ``around`` entries either side. The teams
    scope has no users (422); a friends scope ranks the user among that player's friends."""
    state, board, reader, q = await _read_of(request, StandingQuery, "user_id")
    view = await _view_of(state, board, reader, q)
    user_id = request.path_params["user_id"]
    as_of_field = _as_of_field(state, view)
    body = await standings.standing(
        state.redis,
        state.keys,
        view,
        user_id,
        q.around,
        q.rank_style,
        own=reader.kind == "player" and reader.user_id == user_id,
        as_of_field=as_of_field,
    )
    if not as_of_field:
        body["as_of"] = rfc3339(datetime.now(UTC))
    return json_answer(body)


router.add_api_route(
    "/{board_id}/users/{user_id}",
    standing,
    methods=["GET"],
    response_model=StandingOut,
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra={
        "parameters": parameters_of(("user_id", "board_id"), StandingQuery),
        "security": _READ_SECURITY,
    },
    route_class_override=DirectRoute,
)

DIRECT_READS = [route for route in router.routes if isinstance(route, DirectRoute)]
"""The page and the standing: served by :class:`~services.api.routes.params.DirectPaths`
without the routers' walk (services/api/app.py)."""


@router.get(
    "/{board_id}/users/{user_id}/ranks",
    response_model=RanksOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
)
async def user_ranks(
    board: BoardDep,
    user_id: UserIdPath,
    state: State,
    reader: Reader,
    period_id: Annotated[
        list[PeriodIdItem] | None,
        Query(
            max_length=len(PERIODS),
            description="Past periods to read instead of the current ones, at most one of each "
            "kind (the id names its kind: 2026-11-29, 2026-W48, 2026-11, all, and a season's "
            "2026-12-04T18:00)",
        ),
    ] = None,
    rank_style: RankStyleQuery = "ordinal",
) -> Response:
    """A player's profile screen in one call: for every period of the board, the user's score
    and rank in each region it scored in, in ``global``, its team's in ``teams`` (incr boards)
    and its place among its friends (``friends``: shown to the player itself and to server
    keys). 404 if the user never scored on the board."""
    chosen: dict[Period, str] = {}
    for pid in period_id or []:
        kind = views.period_of_id(board, pid)
        if chosen.setdefault(kind, pid) != pid:
            raise Invalid(f"Two {kind} period ids given.", loc=("query", "period_id"))
    ahead = state.settings.future_tolerance_seconds
    windows = [views.resolve_window(board, p, chosen.get(p), ahead=ahead) for p in board.periods]
    body = await ranks.user_ranks(
        state.redis,
        state.keys,
        board,
        user_id,
        windows,
        rank_style,
        with_friends=reader.may_act_for(user_id),
        own=reader.kind == "player" and reader.user_id == user_id,
    )
    # Written as built: a scope carries team_id only in the teams scope, and as_of is there
    # even when null (the response model is the document's).
    return json_answer(
        {"board_id": board.board_id, "user_id": user_id, "rank_style": rank_style, **body}
    )


async def get_user_caller(request: Request, caller: Caller) -> Principal:
    # The path's user as it is: a malformed id is no player's own (403), and the 422 for it
    # comes after the credential's refusal.
    caller.require_user(request.path_params["user_id"])
    return caller


UserCaller = Annotated[Principal, Depends(get_user_caller)]
"""A server key or the path user's own token: declared first, its 401 and 403 come before the
board's 404."""


@router.get(
    "/{board_id}/users/{user_id}/events",
    response_model=EventsOut,
    responses=problems(401, 403, 404, 422, 503),
)
async def events(
    _: UserCaller,
    board: BoardDep,
    user_id: UserIdPath,
    state: State,
    limit: Annotated[int, Query(ge=1, le=500), IN_DIGITS] = 50,
    cursor: Annotated[
        str | None,
        Query(
            max_length=512,
            description="The next_cursor of the page before, of the same board and user "
            "(another's is a 422)",
        ),
    ] = None,
) -> dict[str, Any]:
    """The user's accepted events, newest first, from the history database.

    A server key reads anyone's; a player token its own (401 and 403 come before the board's
    404)."""
    try:
        rows, next_cursor = await user_events(state.engine, board.board_id, user_id, limit, cursor)
    except BadCursor as exc:
        raise Invalid(str(exc), loc=("query", "cursor")) from exc
    return {"events": rows, "next_cursor": next_cursor}


# The activity reads (feed, stats) share this router's prefix and come with it.
