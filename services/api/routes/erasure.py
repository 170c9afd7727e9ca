"""Erase a user, delete a board (docs/api.md section 8b): admin only, each a durable job.

``DELETE /v1/users/{user_id}`` records a tombstone in MySQL (and its Redis projection) and
answers 202; ``DELETE /v1/boards/{board_id}`` records the deletion, takes the definition out of
MySQL and Redis at once (the board answers 404 from then on, within an API process's catalog
cache of a few seconds) and answers 202. The erasure worker (services/api/eraser.py) does the
rest (a user's in a time that grows with the snapshots stored, which each pass reads through);
``GET /v1/erasures/{user_id}`` and ``GET /v1/board-deletions/{board_id}`` say whether it is done
(paths of their own: nothing under a deleted board's or erased user's path answers as if it
were still there).
"""

from __future__ import annotations

from typing import Annotated, Literal

import structlog
from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import BaseModel, Field
from sqlalchemy import delete

from services.api.errors import Conflict, NotFound, Unavailable, location, problems
from services.api.routes.definitions import Admin
from services.api.routes.params import TRUE_OR_FALSE
from services.api.state import BoardIdPath, State
from services.api.strict_json import StrictJsonRoute
from shared.boards import MAIN_BOARD_ID
from shared.db import boards
from shared.db_boards import LockTimeout, definitions_lock, load_board
from shared.erasure import (
    board_deletion_of,
    erasure_of,
    record_board_deletion,
    request_erasure,
    to_ms,
)
from shared.events import USER_ID_PATTERN, rfc3339

router = APIRouter(tags=["moderation"], route_class=StrictJsonRoute)
log = structlog.get_logger(__name__)

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])]


class ErasureOut(BaseModel):
    user_id: str
    status: Literal["pending", "done"]
    cutoff: str = Field(
        description="Events of the user accepted up to here are erased; a later one is a fresh "
        "user's"
    )


class DeletionOut(BaseModel):
    board_id: str
    status: Literal["pending", "done"]
    purge: bool
    cutoff: str = Field(
        description="The board's events accepted up to here are the deleted board's: a fresh "
        "board of the same name starts after it"
    )


@router.delete(
    "/v1/users/{user_id}",
    status_code=202,
    response_model=ErasureOut,
    responses={
        202: {
            "description": "Recorded",
            "headers": location("The erasure's status, /v1/erasures/{user_id}"),
        },
        **problems(401, 403, 422, 503),
    },
)
async def erase_user(
    user_id: UserIdPath, response: Response, state: State, caller: Admin
) -> ErasureOut:
    """Erase the user from every board, period, scope, friend list, the feed, badges and the
    history database: 202 once recorded, done in two passes (``GET`` its ``Location``), the
    second after the cut-off. Each pass reads every stored snapshot for the user's entries, so
    the time grows with them: seconds with a few thousand, 23 to 26 s with 80,000 of 9 KB.
    Asked again, the erasure runs again (a later cut-off)."""
    erasure = await request_erasure(
        state.engine, state.redis, state.keys, user_id, state.settings.effective_jwt_secret
    )
    # Named by its hash, as the erasure's own "user erased" line does: the log keeps no id of it.
    log.info("erasure requested", user_hash=erasure.user_hash, by=caller.who)
    response.headers["Location"] = f"/v1/erasures/{user_id}"
    return ErasureOut(user_id=user_id, status="pending", cutoff=rfc3339(erasure.cutoff))


@router.get(
    "/v1/erasures/{user_id}",
    response_model=ErasureOut,
    responses=problems(401, 403, 404, 422, 503, said={404: "The user was never erased"}),
)
async def erasure_status(user_id: UserIdPath, state: State, _: Admin) -> ErasureOut:
    """Whether the user's erasure is done."""
    erasure = await erasure_of(state.engine, user_id, state.settings.effective_jwt_secret)
    if erasure is None:
        raise NotFound(f"User {user_id!r} was never erased.")
    status: Literal["pending", "done"] = "pending" if erasure.done_at is None else "done"
    return ErasureOut(user_id=user_id, status=status, cutoff=rfc3339(erasure.cutoff))


async def board_to_delete(board_id: BoardIdPath, state: State, _: Admin) -> str:
    """The path's board, judged before the query (docs/api.md section 1: the board's 404 comes
    before a query's 422): 409 for board ``main``, 404 for a board that does not exist. Judged
    again under the definitions lock, where the deletion is recorded."""
    if board_id == MAIN_BOARD_ID:
        raise Conflict("Board main exists out of the box and is not deleted.")
    found = await state.catalog.get(board_id, fresh=True)
    if found is None and await load_board(state.engine, board_id) is None:
        raise NotFound(f"There is no board {board_id!r}.")
    return board_id


@router.delete(
    "/v1/boards/{board_id}",
    status_code=202,
    response_model=DeletionOut,
    responses={
        202: {
            "description": "Recorded",
            "headers": location("The deletion's status, /v1/board-deletions/{board_id}"),
        },
        **problems(
            401, 403, 404, 409, 422, 503, said={409: "Board main, which exists out of the box"}
        ),
    },
)
async def delete_board(
    board_id: Annotated[str, Depends(board_to_delete)],
    response: Response,
    state: State,
    caller: Admin,
    purge: Annotated[
        bool, Query(description="Delete its history too: true or false"), TRUE_OR_FALSE
    ] = False,
) -> DeletionOut:
    """Delete the board: its definition at once, its cached keys within seconds, its history
    only with ``purge=true``. Its name then takes a fresh board, none of the old scores showing.
    Board ``main`` is not deleted (409)."""
    try:
        async with definitions_lock(state.engine) as conn:
            found = await load_board(conn, board_id) or await state.catalog.get(
                board_id, fresh=True
            )
            if found is None:
                raise NotFound(f"There is no board {board_id!r}.")
            deletion = await record_board_deletion(conn, board_id, purge)
            await conn.execute(delete(boards).where(boards.c.board_id == board_id))
            await conn.commit()
            # After MySQL, under the lock: consumers drop the old board's events from now on.
            await state.redis.hset(state.keys.deleted_boards, board_id, to_ms(deletion.cutoff))
            await state.catalog.remove(board_id)
    except LockTimeout as exc:
        raise Unavailable("Board definitions are being changed; retry shortly.", 2) from exc
    log.info("board deletion requested", board_id=board_id, purge=purge, by=caller.who)
    response.headers["Location"] = f"/v1/board-deletions/{board_id}"
    return DeletionOut(
        board_id=board_id, status="pending", purge=purge, cutoff=rfc3339(deletion.cutoff)
    )


@router.get(
    "/v1/board-deletions/{board_id}",
    response_model=DeletionOut,
    responses=problems(401, 403, 404, 422, 503, said={404: "The board was never deleted"}),
)
async def deletion_status(board_id: BoardIdPath, state: State, _: Admin) -> DeletionOut:
    """Whether the board's last deletion is done."""
    deletion = await board_deletion_of(state.engine, board_id)
    if deletion is None:
        raise NotFound(f"Board {board_id!r} was never deleted.")
    status: Literal["pending", "done"] = "pending" if deletion.done_at is None else "done"
    return DeletionOut(
        board_id=board_id, status=status, purge=deletion.purge, cutoff=rfc3339(deletion.cutoff)
    )
