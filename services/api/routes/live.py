"""The live views of play (docs/api.md section 8a): hot streaks and team MVPs.

The hot view is the one the aggregator computed on its last tick (``as_of`` says when; an empty
view is not computed again until its board has an event, and is as of the aggregator's last
pass; a user hidden since is left out of it: services/api/reads/live.py); the MVP
view is computed at the read from the teams board and the aggregator's member contributions, so
that any retained period can be read. The rules of both are in :mod:`shared.live_maths`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query
from fastapi.routing import APIRouter
from pydantic import BaseModel, Field

from services.api.errors import Invalid, problems
from services.api.reads import views
from services.api.reads.live import current_hot
from services.api.routes.params import IN_DIGITS, PeriodIdQuery, PeriodQuery
from services.api.state import PUBLIC_READ, BoardDep, Reader, State
from services.api.strict_json import StrictJsonRoute
from shared.live_maths import mvp_view
from shared.periods import Period

router = APIRouter(prefix="/v1/boards", tags=["live views"], route_class=StrictJsonRoute)

HOT_PUSH = (
    "Pushed over the WebSocket to subscribers of `leaderboard:{board_id}:hot:{window}` as "
    '`{"type": "leaderboard", "view": "hot", "scope": "hot", "board_id", "window", "as_of", '
    '"entries"}` whenever its entries change; a subscriber is sent the current view at once.'
)
MVP_PUSH = (
    "The current period's view is pushed over the WebSocket to subscribers of "
    '`leaderboard:{board_id}:mvps:{period}` as `{"type": "leaderboard", "view": "mvps", '
    '"scope": "mvps", "board_id", "period", "period_id", "as_of", "entries"}` whenever its '
    "entries or its period change (not for a later `as_of` alone); a subscriber is sent the "
    "current view at once."
)


class HotEntry(BaseModel):
    rank: int
    user_id: str
    score: float = Field(description="The user's average value per event in the window")


class HotOut(BaseModel):
    board_id: str
    window: Literal[10, 60] = Field(description="Seconds of event time")
    as_of: str | None = Field(
        description="When the aggregator computed the view (RFC 3339); for an empty view, the "
        "later of that and the last time an aggregator found the board still without an event "
        "in its windows; null if no aggregator did either in the last two minutes (the view is "
        "then empty)"
    )
    entries: list[HotEntry] = Field(description="At most 10, the highest average first")


class MvpEntry(BaseModel):
    rank: int
    user_id: str
    team_id: str = Field(description="The team the user's latest event in the period named")
    user_score: int = Field(description="What the user scored for that team in the period")
    team_score: int = Field(description="The team's total in the period (the teams scope)")
    share: float = Field(description="user_score / team_score")


class MvpOut(BaseModel):
    board_id: str
    period: Period
    period_id: str
    as_of: str | None = Field(
        description="When the aggregator last applied a batch of the board's events (RFC 3339; "
        "null: none yet): the teams' totals and members' shares are summed from them, and an "
        "event accepted since may not count yet"
    )
    entries: list[MvpEntry] = Field(description="At most 10, the largest share first")


@router.get(
    "/{board_id}/hot",
    response_model=HotOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
    description=(
        "The 10 users with the highest average value per event over the last `window` seconds "
        "of event time: events whose `occurred_at` is less than `window` seconds behind the "
        "server clock (one stamped up to 5 s ahead counts at once). An event accepted more "
        "than 5 s after its `occurred_at` counts toward its periods but not here. Ties: more "
        "events, then the smaller user id. The view is the one the aggregator computed on its "
        "last tick (every `LADDER_MERGE_INTERVAL`), less any user hidden on the board since, the "
        "others' ranks closed up (a top of 10 lists 9 until the next tick). " + HOT_PUSH
    ),
)
async def hot(
    board: BoardDep,
    state: State,
    _: Reader,
    # The enum is the document's; the check below keeps the 422's own message.
    window: Annotated[
        int,
        Query(description="10 or 60 (seconds)", json_schema_extra={"enum": [10, 60]}),
        IN_DIGITS,
    ] = 60,
) -> dict[str, Any]:
    if window not in (10, 60):
        raise Invalid("window must be 10 or 60 (seconds).", loc=("query", "window"))
    view = await current_hot(state.redis, state.keys, board.board_id, window) or {}
    return {
        "board_id": board.board_id,
        "window": window,
        "as_of": view.get("as_of"),
        "entries": view.get("entries", []),
    }


@router.get(
    "/{board_id}/mvps",
    response_model=MvpOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
    description=(
        "The 10 users with the largest share of their team's total in a period (`incr` boards; "
        "on others 422). A user's team in a period is the one its latest accepted event in that "
        "period named, and `user_score` is what it scored for that team: after a change of team "
        "the user ranks with the new team, counting only what it scored for it, while what it "
        "scored before stays in the old team's total. Teams with a total of 0 or less and "
        "members with a contribution of 0 or less are left out. Ties: the larger `user_score`, "
        "then the smaller user id. " + MVP_PUSH
    ),
)
async def mvps(
    board: BoardDep,
    state: State,
    _: Reader,
    period: PeriodQuery = "alltime",
    period_id: PeriodIdQuery = None,
) -> dict[str, Any]:
    if board.operator != "incr":
        raise Invalid(
            f"MVPs are shares of team totals, kept only on incr boards; board "
            f"{board.board_id!r} is {board.operator}.",
            loc=("path", "board_id"),
        )
    window = views.resolve_window(
        board, period, period_id, ahead=state.settings.future_tolerance_seconds
    )
    as_of, entries = await mvp_view(state.redis, state.keys, board, period, window.period_id)
    return {
        "board_id": board.board_id,
        "period": period,
        "period_id": window.period_id,
        "as_of": as_of,
        "entries": entries,
    }
