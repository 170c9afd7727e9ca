"""A user's badges on a board (docs/api.md section 3), as the notifier awarded them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel

from services.api.errors import problems
from services.api.state import PUBLIC_READ, BoardDep, Reader, State
from services.api.strict_json import StrictJsonRoute
from shared.events import USER_ID_PATTERN

router = APIRouter(prefix="/v1/boards", tags=["badges"], route_class=StrictJsonRoute)


class BadgeOut(BaseModel):
    badge: str
    awarded_at: str


class BadgesOut(BaseModel):
    badges: list[BadgeOut]


@router.get(
    "/{board_id}/users/{user_id}/badges",
    response_model=BadgesOut,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
)
async def badges(
    board: BoardDep,
    user_id: Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])],
    state: State,
    _: Reader,
) -> dict[str, Any]:
    """The badges the user holds on the board, earliest first (then by name); an empty list
    for a user with none. ``awarded_at`` is when Ladder accepted the event that earned it."""
    # The client decodes replies: badge -> awarded_at (RFC 3339), both str.
    held: dict[Any, Any] = await state.redis.hgetall(state.keys.badges(board.board_id, user_id))
    ordered = sorted(held.items(), key=lambda item: (datetime.fromisoformat(item[1]), item[0]))
    return {"badges": [{"badge": name, "awarded_at": at} for name, at in ordered]}
