"""Board definitions (docs/api.md section 3): listed and read by anyone who may read, written by an
admin key.

A ``PUT`` writes MySQL, the source of truth, then the Redis hash every service reads, both under
the definitions lock (:func:`shared.db_boards.definitions_lock`), so concurrent writers and the
start-up restore reach Redis in the order they reached MySQL.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, BackgroundTasks, Depends, Response
from pydantic import BaseModel, ConfigDict, model_validator

from services.api.auth import Principal
from services.api.errors import Conflict, Invalid, Unavailable, location, problems
from services.api.state import (
    PUBLIC_READ,
    ApiState,
    BoardDep,
    BoardIdPath,
    Caller,
    Reader,
    State,
)
from services.api.strict_json import StrictJsonRoute
from shared.boards import (
    DEFINITION_TTL,
    Board,
    BoardId,
    StoredSpec,
    refused_new,
)
from shared.db_boards import LockTimeout, definitions_lock, has_events, load_board, save_board
from shared.erasure import board_deletion_of
from shared.keys import Keys
from shared.periods import retention_error, window_at, windows_before
from shared.season_keys import raise_expiry

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/v1/boards", tags=["boards"], route_class=StrictJsonRoute)

# What the stored scores were ranked and bucketed by: none may change once a board has scores.
RANKING_FIELDS = ("operator", "order", "subscore_order", "timezone")


def get_admin(caller: Caller) -> Principal:
    caller.require_admin()
    return caller


# A dependency, so that a caller without an admin key is refused before its body is looked at.
Admin = Annotated[Principal, Depends(get_admin)]


class BoardsOut(BaseModel):
    boards: list[Board]


def _document_board_in(schema: dict[str, Any]) -> None:
    """What the validators of :class:`BoardSpec` refuse, said in JSON Schema where it can be.

    ``board_id`` is optional, and only the path's may be sent: a definition read with ``GET``
    can be sent back as it is.
    """
    fields = schema["properties"]
    fields["board_id"]["description"] = (
        "Optional: the board of the path (any other is a 422), so that a definition read with "
        "GET can be sent back as it is"
    )
    fields["periods"] |= {"minItems": 1, "uniqueItems": True}
    fields["notify_top"]["uniqueItems"] = True
    # regions: null, or at least one region, none twice.
    for option in fields["regions"]["anyOf"]:
        if option.get("type") == "array":
            option |= {"minItems": 1, "uniqueItems": True}
    # pydantic states the names' pattern but lets any other name through with any value.
    fields["badges"]["additionalProperties"] = False


class BoardIn(StoredSpec):
    """A definition as a ``PUT`` takes it: every field optional, defaulting to board ``main``'s.
    The timezone is an IANA name, and ``min_value`` may not exceed ``max_value``.

    A ``GET``'s answer may be sent back as it is: its ``board_id`` must then name the board of
    the path.
    """

    model_config = ConfigDict(json_schema_extra=_document_board_in)

    board_id: BoardId | None = None

    # A timezone or schedule that only a board stored with it may keep is judged against the
    # stored definition, under the definitions lock (shared.boards.refused_new).
    @model_validator(mode="after")
    def _players_need_regions(self) -> BoardIn:
        # Here, not in BoardSpec: a definition stored before regions existed must stay readable
        # (it refuses players until its regions are declared: Board.takes_player_writes).
        if self.player_writes and self.regions is None:
            raise ValueError(
                "a board with player_writes must declare its regions: a player token could "
                "otherwise name any region it likes"
            )
        return self


@router.get(
    "", response_model=BoardsOut, responses=problems(401, 422, 503), openapi_extra=PUBLIC_READ
)
async def list_boards(state: State, _: Reader) -> dict[str, Any]:
    """Every board definition."""
    return {"boards": await state.catalog.all()}


@router.get(
    "/{board_id}",
    response_model=Board,
    responses=problems(401, 404, 422, 503),
    openapi_extra=PUBLIC_READ,
)
async def get_board(board: BoardDep, _: Reader) -> Board:
    """One board definition, with every field."""
    return board


@router.put(
    "/{board_id}",
    response_model=Board,
    responses={
        201: {
            "model": Board,
            "description": "Created",
            "headers": location("The board's path, /v1/boards/{board_id}"),
        },
        **problems(
            400,
            401,
            403,
            404,
            409,
            413,
            422,
            503,
            said={409: "The board has scores and the change would re-rank them"},
        ),
    },
)
async def put_board(
    board_id: BoardIdPath,
    spec: BoardIn,
    response: Response,
    after: BackgroundTasks,
    state: State,
    caller: Admin,
) -> Board:
    """Create (201) or replace (200) a board's definition; a field left out takes board
    ``main``'s default. Changing ``operator``, ``order``, ``subscore_order`` or ``timezone`` of
    a board that has scores answers 409. A board with ``player_writes`` must declare its
    ``regions`` (422). A retention that reaches outside years 1 to 9999, or lets a period expire
    before its close (the allowed lateness and a merge interval after its end, and a minute
    more), is 422. A changed schedule keeps the keys its seasons share with the old one's (those
    starting at the same minute) as long as it keeps its own seasons."""
    if spec.board_id is not None and spec.board_id != board_id:
        raise Invalid(
            "board_id in the body must be the board of the path.", loc=("body", "board_id")
        )
    board = Board.model_validate({**spec.model_dump(exclude={"board_id"}), "board_id": board_id})
    await _check_retention(board, state.settings.close_delay + CLOSE_MARGIN)
    try:
        async with definitions_lock(state.engine) as conn:
            # MySQL first; a board that only Redis holds (made before definitions were kept
            # in MySQL) counts as existing all the same.
            deletion = await board_deletion_of(conn, board_id)
            if deletion is not None and deletion.done_at is None:
                raise Conflict(
                    f"Board {board_id!r} is being deleted; its name is free once the deletion "
                    f"is done (GET /v1/board-deletions/{board_id})."
                )
            previous = await load_board(conn, board_id) or await state.catalog.get(
                board_id, fresh=True
            )
            if refused := refused_new(board, previous):
                field, reason = refused
                raise Invalid(f"{reason}.", loc=("body", field))
            if previous is not None:
                await _refuse_reranking(state, previous, board)
            await save_board(conn, board)
            await _start_closes(state, previous, board)
            await state.catalog.put(board)
    except LockTimeout as exc:
        raise Unavailable("Board definitions are being changed; retry shortly.", 2) from exc
    _log_definition(previous, board, caller)
    if previous is not None and previous.schedule != board.schedule:
        # A new season that starts at the same minute as one of the old schedule writes into
        # that season's keys: they must be kept as long as the new one (shared/season_keys.py).
        await _raise_season_expiry(state, board)
        after.add_task(_raise_season_expiry_again, state, board)
    if previous is None:
        response.status_code = 201
        response.headers["Location"] = f"/v1/boards/{board_id}"
    return board


def _log_definition(previous: Board | None, board: Board, caller: Principal) -> None:
    """The admin trail's line of a definition stored (docs/operations.md, "The admin trail"),
    written as soon as it is: what follows may fail, the definition being in force."""
    if previous is None:
        log.info("board created", board_id=board.board_id, by=caller.who)
        return
    before, after = previous.model_dump(), board.model_dump()
    changed = sorted(name for name in after if before.get(name) != after[name])
    log.info("board replaced", board_id=board.board_id, changed=changed, by=caller.who)


# How long a period's keys must outlive its close, beyond the close's own delay.
CLOSE_MARGIN = 60.0

# Past the definitions' cache lifetime, before the second raise of a changed schedule's seasons'
# keys: for a request that read the old definition just before, and writes just after.
RAISE_AGAIN_MARGIN = 1.0


async def _start_closes(state: ApiState, previous: Board | None, board: Board) -> None:
    """Where the period closes (docs/api.md section 8b) of the kinds ``board`` starts keeping
    begin: every kind of a new board, a kind added, and the seasons of a changed schedule close
    from the allowed lateness before now, the earliest time an event may fall in from now on.
    A first close looked at the latest period ended, which the board never ran (yesterday, for a
    board made today; a week of the old schedule read as minute seasons), and a new schedule's
    seasons closed, within their retention, back to the latest claim of the old one. Set before
    the definition reaches the catalog, where the aggregator reads it; every claimed end is older
    (a close comes more than the lateness after a period's end), so the watermark only moves on."""
    kinds = {p for p in board.periods if p != "alltime"}
    if previous is not None:
        kinds -= set(previous.periods)
        if board.schedule is not None and board.schedule != previous.schedule:
            kinds.add("season")
    since = int(datetime.now(UTC).timestamp() - state.settings.allowed_lateness)
    if kinds:
        async with state.redis.pipeline(transaction=False) as pipe:
            for kind in sorted(kinds):
                pipe.set(state.keys.period_watermark(board.board_id, kind), since)
            await pipe.execute()


async def _raise_season_expiry(state: ApiState, board: Board) -> None:
    """Raise the expiry of the keys of ``board``'s seasons now written (shared/season_keys.py)."""
    ahead = state.settings.future_tolerance_seconds
    await raise_expiry(state.redis, state.keys, board, datetime.now(UTC), ahead)


async def _raise_season_expiry_again(state: ApiState, board: Board) -> None:
    """:func:`_raise_season_expiry` once more, after the ``PUT`` has answered, when no process
    holds the old definition any more (:data:`shared.boards.DEFINITION_TTL`): a key of a shared
    season that one made meanwhile got the old season's expiry."""
    await asyncio.sleep(DEFINITION_TTL + RAISE_AGAIN_MARGIN)
    try:
        await _raise_season_expiry(state, board)
    except Exception:  # the answer is sent: logged, as nobody else can be told
        log.exception(
            "season keys not raised again after a change of schedule", board_id=board.board_id
        )


async def _check_retention(board: Board, outlast: float) -> None:
    """422 for a retention that leaves the calendar or lets a period expire before its close. A
    thread's work: 10,000 seasons of a minute are two walks of 10,000 firings."""
    now = datetime.now(UTC)
    for period in board.periods:
        retention = board.retention.of(period)
        if retention is None:
            continue
        error = await asyncio.to_thread(
            retention_error, period, board.timezone, retention, board.schedule, now, outlast
        )
        if error is not None:
            raise Invalid(f"retention.{period}: {error}.", loc=("body", "retention", period))


async def _refuse_reranking(state: ApiState, previous: Board, board: Board) -> None:
    changed = [f for f in RANKING_FIELDS if getattr(previous, f) != getattr(board, f)]
    if changed and await has_scores(state, previous):
        detail = ", ".join(
            f"{f} {getattr(previous, f)!r} -> {getattr(board, f)!r}" for f in changed
        )
        raise Conflict(
            f"Board {board.board_id!r} has scores, ranked by its operator, order, subscore "
            f"order and timezone; they cannot change ({detail})."
        )


async def has_scores(state: ApiState, board: Board) -> bool:
    """Whether any score of ``board`` is kept, in the cache or in the history database.

    The cache half asks whether the write noted a newest event of the board, or a regions set
    exists for any period the board still keeps (one ``EXISTS`` over the keys of one hash tag,
    where a ``SCAN`` would walk the whole keyspace): it covers the events the history database
    has not stored yet (the newest event those the aggregator has not derived into the regions
    sets yet). The database half covers everything older, and a cache that was emptied.

    The periods' names are a thread's work: 10,000 seasons of a minute kept are a walk of 10,000
    firings, which would hold every other request of the process for a second or more.
    """
    # The newest period an accepted event may fall in: occurred_at may lie a little ahead.
    latest = datetime.now(UTC) + timedelta(seconds=state.settings.future_tolerance_seconds)
    names = await asyncio.to_thread(_regions_sets, state.keys, board, latest)
    if await state.redis.exists(state.keys.newest_event(board.board_id), *names):
        return True
    return await has_events(state.engine, board.board_id)


def _regions_sets(keys: Keys, board: Board, latest: datetime) -> list[str]:
    """The regions sets of every period of ``board`` that may still be kept at ``latest``."""
    names: list[str] = []
    for period in board.periods:
        window = window_at(period, latest, board.timezone, board.schedule)
        names.append(keys.regions(board.board_id, period, window.period_id))
        if window.end is None:
            continue
        # One more than retention: the period just begun may not be the current one yet.
        retention = (board.retention.of(period) or 0) + 1
        for before in windows_before(window, board.timezone, retention, board.schedule):
            names.append(keys.regions(board.board_id, period, before.period_id))
    return names
