"""Snapshots (docs/api.md section 7): a board's top N as it stood at a moment, from the history
database, where the history service stores the views that changed every
``LADDER_SNAPSHOT_INTERVAL``."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from services.api.answers import json_answer
from services.api.errors import Invalid, NotFound, problems
from services.api.reads import views
from services.api.routes.params import PeriodQuery
from services.api.routes.reads import Entry, TeamEntry
from services.api.state import PUBLIC_READ, BoardDep, Reader, State
from services.api.strict_json import StrictJsonRoute
from shared.db_boards import snapshot_at
from shared.events import REGION_PATTERN, Rfc3339Time, rfc3339
from shared.periods import Period, PeriodIdError, PeriodOutOfCalendar, window_of

router = APIRouter(prefix="/v1/boards", tags=["history"], route_class=StrictJsonRoute)

_REGION = re.compile(REGION_PATTERN)
# What the checks below accept, for the document; they, not a Query pattern, refuse the rest, so
# that a refusal keeps its own message.
SCOPE_PATTERN = "^(global|teams|region:" + REGION_PATTERN.removeprefix("^").removesuffix("$") + ")$"


class SnapshotOut(BaseModel):
    board_id: str
    scope: str
    period: Period
    period_id: str
    taken_at: str
    entries: list[Entry | TeamEntry] = Field(description="The view's top N when it was taken")


@router.get(
    "/{board_id}/snapshots",
    response_model=SnapshotOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
)
async def snapshot(
    board: BoardDep,
    state: State,
    _: Reader,
    scope: Annotated[
        str,
        Query(
            max_length=80,
            json_schema_extra={"pattern": SCOPE_PATTERN},
            description="global, region:{region} or teams",
        ),
    ] = "global",
    period: PeriodQuery = "alltime",
    at: Annotated[
        Rfc3339Time | None, Query(description="RFC 3339 with an offset; defaults to now")
    ] = None,
    period_id: Annotated[
        str | None,
        Query(
            max_length=16,
            json_schema_extra={"pattern": views.PERIOD_ID_PATTERN},
            description="Only snapshots of this period id",
        ),
    ] = None,
) -> Response:
    """The newest stored top-N snapshot of a view taken at or before ``at``; 404 if none was
    taken by then. Without ``period_id`` it may be of any period id (the answer names it): at
    the start of a period, the latest snapshot is the final one of the period before."""
    if not (
        scope in ("global", "teams")
        or (scope.startswith("region:") and _REGION.fullmatch(scope.removeprefix("region:")))
    ):
        raise Invalid(
            "scope must be 'global', 'region:<region>' or 'teams'.", loc=("query", "scope")
        )
    if scope == "teams" and board.operator != "incr":
        raise Invalid(
            f"The teams scope sums members' scores and exists only on incr boards; board "
            f"{board.board_id!r} is {board.operator}.",
            loc=("query", "scope"),
        )
    if period not in board.periods:
        raise NotFound(f"Board {board.board_id!r} does not keep a {period} period.")
    if period_id is not None:
        try:
            window_of(period, period_id, board.timezone, board.schedule)
        except PeriodOutOfCalendar as exc:  # a period no snapshot can have been taken of
            raise NotFound(
                f"No snapshot of {period} {period_id!r}: it begins or ends outside years 1 to 9999."
            ) from exc
        except PeriodIdError as exc:
            raise Invalid(str(exc), loc=("query", "period_id")) from exc
    try:
        moment = (at or datetime.now(UTC)).astimezone(UTC)
    except OverflowError as exc:  # 9999-12-31T23:00:00-05:00 is past the last UTC year
        raise Invalid("at is out of range.", loc=("query", "at")) from exc
    found = await snapshot_at(state.engine, board.board_id, scope, period, moment, period_id)
    if found is None:
        raise NotFound(
            f"No snapshot of {scope} {period} on board {board.board_id!r} was taken by "
            f"{rfc3339(moment)}."
        )
    # As stored: the entries were taken in the shape a leaderboard read answers (subscore on
    # boards with one, metadata), which the model would cut down to the fields it names.
    return json_answer(dict(found))
