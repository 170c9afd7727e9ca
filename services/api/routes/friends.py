"""Friends (docs/api.md section 6): mutual, idempotent friendships.

A server or admin key acts for any user; a player token only for its own ``user_id``. A
friendship is written to MySQL, the source of truth (a row each way), then to the two Redis sets
``Keys.friends`` that the friends scope reads; the API restores those sets from MySQL at start-up.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel

from services.api.errors import Conflict, Invalid, problems
from services.api.state import Caller, State
from shared.db_boards import delete_friendship, put_friendship
from shared.events import USER_ID_PATTERN

router = APIRouter(prefix="/v1/users", tags=["friends"])

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])]
# Any user may have friends; only a path that is no route (an id with a slash) answers 404.
NO_ROUTE = "No such route: a path segment that is not an id"
# Bounds a friends list, and so the friends scope's read, which fetches every friend's score.
MAX_FRIENDS = 1000


class FriendsOut(BaseModel):
    friends: list[str]


@router.put(
    "/{user_id}/friends/{friend_id}",
    status_code=204,
    response_class=Response,
    responses=problems(
        401, 403, 404, 409, 422, 503, said={404: NO_ROUTE, 409: f"A user has {MAX_FRIENDS} friends"}
    ),
)
async def befriend(
    user_id: UserIdPath, friend_id: UserIdPath, state: State, caller: Caller
) -> None:
    """Make the two users friends of each other (204, also if they already are)."""
    caller.require_user(user_id)
    if friend_id == user_id:
        raise Invalid("A user cannot be its own friend.", loc=("path", "friend_id"))
    keys = state.keys
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.scard(keys.friends(user_id))
        pipe.sismember(keys.friends(user_id), friend_id)
        pipe.scard(keys.friends(friend_id))
        mine, already, theirs = await pipe.execute()
    if not already and max(mine, theirs) >= MAX_FRIENDS:
        full = user_id if mine >= MAX_FRIENDS else friend_id
        raise Conflict(f"User {full!r} already has {MAX_FRIENDS} friends, the most there may be.")
    await put_friendship(state.engine, user_id, friend_id)
    # Two keys of two users, so two single-key commands: no hash tag joins them.
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.sadd(keys.friends(user_id), friend_id)
        pipe.sadd(keys.friends(friend_id), user_id)
        await pipe.execute()


@router.delete(
    "/{user_id}/friends/{friend_id}",
    status_code=204,
    response_class=Response,
    responses=problems(401, 403, 404, 422, 503, said={404: NO_ROUTE}),
)
async def unfriend(
    user_id: UserIdPath, friend_id: UserIdPath, state: State, caller: Caller
) -> None:
    """End the friendship both ways (204, also if there was none)."""
    caller.require_user(user_id)
    await delete_friendship(state.engine, user_id, friend_id)
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.srem(state.keys.friends(user_id), friend_id)
        pipe.srem(state.keys.friends(friend_id), user_id)
        await pipe.execute()


@router.get(
    "/{user_id}/friends",
    response_model=FriendsOut,
    responses=problems(401, 403, 404, 422, 503, said={404: NO_ROUTE}),
)
async def friends(user_id: UserIdPath, state: State, caller: Caller) -> dict[str, Any]:
    """The user's friends, sorted: what the friends scope ranks the user among."""
    caller.require_user(user_id)
    members: set[Any] = await state.redis.smembers(state.keys.friends(user_id))
    return {"friends": sorted(members)}
