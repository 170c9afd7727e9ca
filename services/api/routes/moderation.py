"""Moderation (docs/api.md section 8b): hide a user on a board, and show it again (a shadow ban).

``PUT /v1/boards/{board_id}/users/{user_id}/hidden`` and ``DELETE`` the same, with an admin key,
answer 204, whether or not the user has scores there, and again and again (idempotent). MySQL's
``hidden_users`` is written first (the truth a ``make rebuild`` keeps), then the board's Redis set,
then the user's members are moved out of (or back into) every view that exists
(:mod:`shared.hidden`). Should the Redis steps fail, or a rebuild of the board be under way, the
call answers 503 and a retry completes them: every step is idempotent. Hides and shows of one
user on one board run one after the other (a MySQL named lock), so that the last answered is
what every store holds.
"""

from __future__ import annotations

from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, Path, Response
from sqlalchemy.ext.asyncio import AsyncConnection

from services.api.auth import Principal
from services.api.errors import Unavailable, problems
from services.api.state import ApiState, BoardDep, Caller, State
from services.api.strict_json import StrictJsonRoute
from shared import hidden
from shared.events import USER_ID_PATTERN

router = APIRouter(prefix="/v1/boards", tags=["moderation"], route_class=StrictJsonRoute)
log = structlog.get_logger(__name__)

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])]


def get_admin(caller: Caller) -> Principal:
    caller.require_admin()
    return caller


# Declared before the board: a caller without an admin key is refused (401, 403) before the
# board's 404, and that before a malformed user id's 422.
Admin = Annotated[Principal, Depends(get_admin)]

OUTCOMES = problems(401, 403, 404, 422, 503)


async def _set(state: ApiState, board_id: str, user_id: str, *, hide: bool) -> None:
    # One hide or show of a user on a board at a time (shared.hidden.changing): the last one
    # answered is what MySQL, the set and the views all hold.
    try:
        async with hidden.changing(state.engine, board_id, user_id) as conn:
            await _change(state, conn, board_id, user_id, hide=hide)
    except hidden.LockTimeout as exc:
        raise Unavailable("The user is being hidden or shown; retry shortly.", 2) from exc


async def _change(
    state: ApiState, conn: AsyncConnection, board_id: str, user_id: str, *, hide: bool
) -> None:
    # A rebuild under way puts its staged views, replayed from MySQL, in place of the live ones
    # when it finishes, and a move made now would not reach them: refused (503, nothing
    # changed) and retried once it is done. Checked again once the row is stored: a rebuild
    # begun in between may have read MySQL before it, so the row is put back as it was; one
    # begun after the second check reads the row stored.
    rebuilding = state.keys.rebuilding(board_id)
    busy = Unavailable("A rebuild of the board is under way; retry once it is done.", 5)
    if await state.redis.exists(rebuilding):
        raise busy
    # A user being erased: a hide now would be the erased user's, and one stored after the
    # erasure's last pass dropped its hides would outlive it (the erased id named in MySQL, a
    # fresh user of the id hidden). Refused as its score writes are, until the erasure is done.
    if await state.erasing.erasing([user_id]):
        raise Unavailable(
            f"User {user_id!r} is being erased; retry once the erasure is done.", retry_after=2
        )
    # On the lock's connection (shared.hidden.changing says why).
    changed = await hidden.store(conn, board_id, user_id, hidden=hide)
    if await state.redis.exists(rebuilding):
        if changed:
            await hidden.store(conn, board_id, user_id, hidden=not hide)
        raise busy
    key = state.keys.hidden(board_id)
    await (state.redis.sadd(key, user_id) if hide else state.redis.srem(key, user_id))
    await hidden.move(state.redis, state.keys, board_id, user_id, show=not hide)


@router.put(
    "/{board_id}/users/{user_id}/hidden",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "The user is hidden on the board (now, or already)"},
        **OUTCOMES,
    },
)
async def hide_user(caller: Admin, board: BoardDep, user_id: UserIdPath, state: State) -> Response:
    """Hide a user from every view of the board without losing its scores: its writes are still
    accepted, its own standing read (its player token) still answers, and everyone else's ranks
    close up."""
    await _set(state, board.board_id, user_id, hide=True)
    log.info("user hidden", board_id=board.board_id, user_id=user_id, by=caller.who)
    return Response(status_code=204)


@router.delete(
    "/{board_id}/users/{user_id}/hidden",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "The user is shown on the board (now, or already)"},
        **OUTCOMES,
    },
)
async def show_user(caller: Admin, board: BoardDep, user_id: UserIdPath, state: State) -> Response:
    """Show a hidden user again: its entries are back in every region and global view at once,
    from the records kept while it was hidden (a score it wrote meanwhile reaches the global view
    as any does, within a merge interval)."""
    await _set(state, board.board_id, user_id, hide=False)
    log.info("user shown", board_id=board.board_id, user_id=user_id, by=caller.who)
    return Response(status_code=204)
