"""Friends (docs/api.md section 6): mutual, idempotent friendships, and players' requests.

A server or admin key makes a friendship at once (the game server knows); a player token's
``PUT`` is a request, which becomes a friendship when the other side asks too, so that no one can
put itself on another's list alone. Either acts only for its own ``user_id``, a key for any.

MySQL is the source of truth (:mod:`shared.friendships`); a friendship is written there first,
then to the two Redis sets ``Keys.friends`` that the friends list and the friends scope read.
Should the second write fail or race, the API's reconcile (start-up, then every
``LADDER_FRIENDS_RECONCILE_SECONDS``) makes the sets what MySQL holds. Requests live in MySQL only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.api.auth import Principal
from services.api.errors import Conflict, Invalid, Unavailable, problems
from services.api.state import Caller, State
from services.api.strict_json import StrictJsonRoute
from shared import friendships
from shared.events import USER_ID_PATTERN

router = APIRouter(prefix="/v1/users", tags=["friends"], route_class=StrictJsonRoute)

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])]
# Any user may have friends; only a path that is no route (an id with a slash) answers 404.
NO_ROUTE = "No such route: a path segment that is not an id"
# The path of the requests list: never a friend_id (405 there, Allow: GET).
REQUESTS = "requests"
FULL = (
    f"A user has {friendships.MAX_FRIENDS} friends (either side), or the player has"
    f" {friendships.MAX_OUTGOING} requests pending"
)
OUTCOMES: dict[int | str, dict[str, Any]] = {
    202: {"description": "A player's request, pending until the other side asks too (no body)"},
    204: {"description": "The two are friends of each other (now, or already)"},
}


class FriendsOut(BaseModel):
    friends: list[str]


class RequestsOut(BaseModel):
    incoming: list[str]
    outgoing: list[str]


ONLY_READ = "friend_id 'requests': the requests list, which is only read (Allow: GET)"


def _not_the_requests_list(friend_id: str) -> None:
    """``.../friends/requests`` is the requests list, which is only read: a ``PUT`` or
    ``DELETE`` there is a 405, as for any method a path does not have."""
    if friend_id == REQUESTS:
        raise StarletteHTTPException(405, headers={"Allow": "GET"})


async def get_owner(request: Request, caller: Caller) -> Principal:
    """The caller, if it may act for the path's user: a key, or that user's own token. A
    dependency declared first, with the path's ids as sent, so that its 401 and 403 come before a
    malformed id's 422 (docs/api.md section 1, "The credential first"): a malformed id is no
    player's own. ``requests`` as a friend is the read-only list's path first (405)."""
    friend_id = request.path_params.get("friend_id")
    if friend_id is not None:
        _not_the_requests_list(friend_id)
    caller.require_user(request.path_params["user_id"])
    return caller


Owner = Annotated[Principal, Depends(get_owner)]


@contextlib.contextmanager
def _answered() -> Iterator[None]:
    """A change's refusals as problems: a full list is 409, a lock not had in time 503."""
    try:
        yield
    except (friendships.FriendsFull, friendships.RequestsFull) as exc:
        raise Conflict(str(exc)) from exc
    except friendships.LockTimeout as exc:
        raise Unavailable("These users' friends are being changed; retry shortly.", 2) from exc


@router.put(
    "/{user_id}/friends/{friend_id}",
    status_code=204,
    response_class=Response,
    responses={
        **OUTCOMES,
        **problems(
            401, 403, 404, 405, 409, 422, 503, said={404: NO_ROUTE, 409: FULL, 405: ONLY_READ}
        ),
    },
)
async def befriend(
    caller: Owner, user_id: UserIdPath, friend_id: UserIdPath, state: State
) -> Response:
    """A server key: make the two friends of each other at once (204, also if they already
    are). A player token: ask ``friend_id`` (202, also if asked before), or, if ``friend_id``
    has asked ``user_id`` already, make the friendship (204)."""
    if friend_id == user_id:
        raise Invalid("A user cannot be its own friend.", loc=("path", "friend_id"))
    # A user being erased: a friendship or request made now would be the erased user's, and one
    # stored after the erasure's last pass dropped its friends would outlive it. Refused, as
    # its score writes are, until the erasure is done (docs/api.md section 8b).
    if erased := sorted(await state.erasing.erasing([user_id, friend_id])):
        raise Unavailable(f"User {erased[0]!r} is being erased; retry once the erasure is done.", 2)
    with _answered():
        if caller.is_server:
            await friendships.befriend(state.engine, user_id, friend_id)
            outcome = friendships.Outcome.FRIENDS
        else:
            outcome = await friendships.ask(state.engine, user_id, friend_id)
    if outcome is friendships.Outcome.PENDING:
        return Response(status_code=202)
    # After MySQL has it. Two keys of two users, so two single-key commands: no hash tag joins them.
    keys = state.keys
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.sadd(keys.friends(user_id), friend_id)
        pipe.sadd(keys.friends(friend_id), user_id)
        await pipe.execute()
    return Response(status_code=204)


@router.delete(
    "/{user_id}/friends/{friend_id}",
    status_code=204,
    response_class=Response,
    responses=problems(401, 403, 404, 405, 422, 503, said={404: NO_ROUTE, 405: ONLY_READ}),
)
async def unfriend(_: Owner, user_id: UserIdPath, friend_id: UserIdPath, state: State) -> None:
    """End the friendship both ways, and drop any request pending between the two, either way
    (withdraw one's own, decline the other's): 204, also if there was nothing."""
    with _answered():
        await friendships.unfriend(state.engine, user_id, friend_id)
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.srem(state.keys.friends(user_id), friend_id)
        pipe.srem(state.keys.friends(friend_id), user_id)
        await pipe.execute()


@router.get(
    f"/{{user_id}}/friends/{REQUESTS}",
    response_model=RequestsOut,
    responses=problems(401, 403, 404, 422, 503, said={404: NO_ROUTE}),
)
async def requests(_: Owner, user_id: UserIdPath, state: State) -> dict[str, Any]:
    """The friend requests pending to the user (``incoming``) and its own (``outgoing``), each
    sorted: read from MySQL."""
    incoming, outgoing = await friendships.load_requests(state.engine, user_id)
    return {"incoming": incoming, "outgoing": outgoing}


@router.get(
    "/{user_id}/friends",
    response_model=FriendsOut,
    responses=problems(401, 403, 404, 422, 503, said={404: NO_ROUTE}),
)
async def friends(_: Owner, user_id: UserIdPath, state: State) -> dict[str, Any]:
    """The user's friends, sorted: what the friends scope ranks the user among."""
    members: set[Any] = await state.redis.smembers(state.keys.friends(user_id))
    return {"friends": sorted(members)}
