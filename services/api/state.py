"""What the API's lifespan opens, and the request dependencies that hand it out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api.auth import Principal, authenticate, bearer
from services.api.errors import NotFound, Unauthorized, Unavailable
from services.api.push.lookups import BoardLookups
from shared.boards import BOARD_ID_PATTERN, Board, BoardCatalog
from shared.keys import Keys
from shared.settings import LadderSettings

if TYPE_CHECKING:
    from services.api.erasing import ErasingUsers
    from services.api.push.admission import SocketSlots
    from services.api.push.hub import Hub
    from services.api.relay.outbox import Relay
    from services.api.write.group import GroupCommit


@dataclass
class ApiState:
    settings: LadderSettings
    keys: Keys
    redis: Redis
    catalog: BoardCatalog
    engine: AsyncEngine
    relay: Relay
    hub: Hub
    writes: GroupCommit
    sockets: SocketSlots
    erasing: ErasingUsers
    shutting_down: asyncio.Event = field(default_factory=asyncio.Event)
    board_lookups: BoardLookups = field(default_factory=BoardLookups)
    # Set once Redis has answered at start, with the function library loaded and what it lost
    # restored (services/api/app.py); until then, requests that need Redis answer 503.
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    # Why Redis is not open yet, for /readyz: not tried yet, connecting, or its last try's error.
    waiting: str = "not connected yet"
    # What stopped the opening, if anything did: the server then stops (serving/uvicorn_server.py).
    failure: BaseException | None = None


STARTING = "The API is starting and its cache is not open yet; retry shortly."


def opened(state: ApiState) -> ApiState:
    """``state``, once Redis is open; a 503, as on a Redis outage, until then."""
    if not state.opened.is_set():
        raise Unavailable(STARTING)
    return state


# The dependencies are coroutines: FastAPI runs a plain function in a worker thread, and a
# thread hop per dependency per request cost more than the whole score write.
async def get_state(request: Request) -> ApiState:
    return opened(request.state.ladder)


State = Annotated[ApiState, Depends(get_state)]


# Declares the scheme in the OpenAPI document; the header itself is read by `bearer`, which
# also refuses other schemes with a 401 rather than ignoring them.
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="ladder",
    description="A server key, an admin key or a player JWT (HS256, with sub and exp). An "
    "operation whose security also lists the empty requirement (the public reads) is served "
    "without one, unless the deployment sets LADDER_PUBLIC_READS=false.",
)


async def get_principal(
    request: Request,
    state: State,
    _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
) -> Principal:
    return authenticate(bearer(request.headers.get("authorization")), state.settings)


Caller = Annotated[Principal, Depends(get_principal)]


def reader_of(caller: Principal, state: ApiState) -> Principal:
    """Public reads need no credential unless ``LADDER_PUBLIC_READS=false``."""
    if caller.kind == "anonymous" and not state.settings.public_reads:
        raise Unauthorized("Reads need a credential here (LADDER_PUBLIC_READS=false).")
    return caller


async def get_reader(caller: Caller, state: State) -> Principal:
    return reader_of(caller, state)


Reader = Annotated[Principal, Depends(get_reader)]

# The ``openapi_extra`` of a route that takes a Reader. FastAPI lists only the bearer scheme
# (its ``auto_error=False`` does not make the scheme optional in the document); the empty
# requirement says that the read is also served without a credential, as it is while
# LADDER_PUBLIC_READS is on (the default). FastAPI appends this list to its own.
PUBLIC_READ: dict[str, Any] = {"security": [{}]}


def document_private_reads(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document say what a deployment with ``LADDER_PUBLIC_READS=false``
    serves: no operation is open without a credential (the empty requirement is taken out)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for path in build()["paths"].values():
                for operation in path.values():
                    if isinstance(operation, dict) and "security" in operation:
                        operation["security"] = [s for s in operation["security"] if s]
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


BoardIdPath = Annotated[
    str, Path(pattern=BOARD_ID_PATTERN, description="Board id", examples=["main"])
]


async def get_board(board_id: str, state: ApiState) -> Board:
    """The definition of ``board_id``, or 404. Look it up only once the caller is known to be
    allowed to learn whether the board exists (:data:`BoardDep`)."""
    board = await state.catalog.get(board_id)
    if board is None:
        raise NotFound(f"There is no board {board_id!r}.")
    return board


async def get_server(caller: Caller) -> Principal:
    caller.require_server()
    return caller


Server = Annotated[Principal, Depends(get_server)]
"""A server or admin key (401, 403 otherwise): declared before a route's board, the refusal
comes before the board's 404 and the body's 422."""


async def board_of_path(board_id: BoardIdPath, state: State, _: Caller) -> Board:
    # The credential (a sub-dependency, so solved first) is checked before the board is looked
    # up: a bad one answers 401 whether or not the board exists. An anonymous caller, while
    # reads are not public, was turned away before the app (services.api.auth.CredentialFirst).
    return await get_board(board_id, state)


BoardDep = Annotated[Board, Depends(board_of_path)]
