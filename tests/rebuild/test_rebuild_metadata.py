"""``make rebuild`` on boards with subscores and metadata (the contract's v1.1): the event log
keeps each event's subscore and metadata text, so that a replay makes exactly the live write's
``submit()`` call, and a rebuild gives back every view's sorted set and its hash of records
(tie key with the subscore part, signed score, metadata) byte for byte."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import HistoryHandler
from services.rebuild.event_log import After, page
from services.rebuild.rebuilder import Rebuilder
from services.rebuild.staging import replay_call
from shared.boards import Board, BoardCatalog
from shared.db import score_events
from shared.db_boards import save_board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.ranking import MAX_SCORE, parse_record, record, written_of
from shared.settings import LadderSettings
from shared.submit import SubmitEvent, submit_call
from tests.rebuild.test_rebuild import projection, relay, write

RACE = Board(
    board_id="race",
    operator="best",
    order="asc",
    subscore_order="desc",
    periods=("daily", "alltime"),
)
STAGE = Board(
    board_id="stage",
    operator="set",
    order="desc",
    subscore_order="asc",
    periods=("weekly", "alltime"),
)
LEVEL = Board(board_id="level", operator="set", periods=("monthly", "alltime"))
BOARDS = [RACE, STAGE, LEVEL]

# Objects of every JSON type, key orders that are not sorted, escapes and characters outside the
# BMP; None sends no metadata at all.
METADATA: list[dict[str, Any] | None] = [
    None,
    {},
    {"car": "red", "laps": [61.5, 60.25, 59.875]},
    {"z": 1, "a": {"nested": [True, False, None]}, "m": "50% 'q' \\ \"d\" | ü 😀"},
    {"big": MAX_SCORE, "small": -MAX_SCORE, "f": 1e-7},
    {"pipe|in|key": "|"},
]


def wide_scores(board: Board, count: int, seed: int) -> list[dict[str, Any]]:
    """Score bodies of a few users in a few regions with many exact ties (of value, subscore
    and time) and metadata that changes from event to event."""
    rng = random.Random(seed)
    base = datetime.now(UTC) - timedelta(seconds=30)
    bodies = []
    for i in range(count):
        body: dict[str, Any] = {
            "event_id": f"{board.board_id}-{i}",
            "user_id": f"u{rng.randrange(10)}",
            "region": rng.choice(("eu", "na")),
            "value": rng.randint(1, 6),
            "display_name": rng.choice(("Ana", "Bo", None)),
            "occurred_at": (base + timedelta(milliseconds=rng.randrange(0, 40) * 250)).isoformat(),
        }
        if board.subscore_order is not None:
            body["subscore"] = rng.choice((-MAX_SCORE, -1, 0, 0, 3, 3, MAX_SCORE))
        # Not {}: whether an empty object is kept or taken for none is the write path's to say.
        metadata = rng.choice([m for m in METADATA if m != {}])
        if metadata is not None:
            body["metadata"] = metadata
        bodies.append(body)
    return bodies


def set_again(board: Board) -> list[dict[str, Any]]:
    """On a set board, user w's score set, set again to the same (its record keeps that later
    write's time beside the reach time), then a late set that happened between the two and
    changes nothing; none on another board."""
    if board.operator != "set":
        return []
    base = datetime.now(UTC) - timedelta(seconds=30)
    more = {"subscore": 3} if board.subscore_order is not None else {}
    return [
        {
            "event_id": f"{board.board_id}-w{i}",
            "user_id": "w",
            "region": "eu",
            "value": value,
            "occurred_at": (base + timedelta(milliseconds=ms)).isoformat(),
            "metadata": {"step": i},
            **more,
        }
        for i, (value, ms) in enumerate([(4, 0), (4, 2000), (3, 1000)])
    ]


# --- a replay makes the live write's call (the event log's side alone) -------------------------


def accepted_from(call_args: list[str | int]) -> ScoreAccepted:
    """The event the consumers receive for a ``submit()`` call: its outbox record, which the
    write function closes after the periods' results (shared/lua/write.lua)."""
    return ScoreAccepted.model_validate_json(f'{call_args[6]},"periods":{{}}}}')


def sent_event(board: Board, i: int, metadata: dict[str, Any] | None) -> SubmitEvent:
    """The ``i``-th event of a board as the API's write path builds it: on a board with a
    subscore_order with a subscore, its metadata as orjson's compact text."""
    at = datetime(2026, 11, 29, 17, 0, 0, 123_456, tzinfo=UTC) + timedelta(milliseconds=i)
    return SubmitEvent(
        event_id=f"{board.board_id}-{i}",
        user_id=f"u{i}",
        region="eu",
        team_id="red" if i % 2 else None,
        display_name=None,
        value=5 + i,
        occurred_at=at,
        accepted_at=at + timedelta(seconds=1),
        subscore=(i - 3) * 1000 if board.subscore_order else None,
        metadata=None if metadata is None else orjson.dumps(metadata).decode(),
    )


async def test_a_replay_of_a_stored_event_makes_the_live_writes_call(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Each event's ``submit()`` call as the API makes it, its record stored as history stores
    it, then read as the rebuild reads it: the replay's keys and arguments are the live ones,
    the subscore's tie key and the metadata text (byte for byte) included."""
    events = [
        (board, sent_event(board, i, metadata))
        for board in BOARDS
        for i, metadata in enumerate(METADATA)
    ]
    live = {
        event.event_id: submit_call(
            keys,
            board,
            event,
            body_hash="",
            idempotency_ttl=settings.idempotency_ttl_seconds,
            outbox_max=1,
            feed_length=settings.feed_length,
        )
        for board, event in events
    }
    await HistoryHandler(db)([accepted_from(args) for _, args in live.values()])

    replayed = {}
    async with db.connect() as conn:
        for board in BOARDS:
            for row in (await conn.execute(page(board.board_id, After()))).all():
                replayed[row.event_id] = replay_call(keys, settings, board, row)

    assert replayed == live
    # The metadata reached the call at all: the argument after MAX_SCORE.
    metadata_args = {args[16] for _, args in live.values()}
    assert metadata_args == {""} | {orjson.dumps(m).decode() for m in METADATA if m is not None}


# --- a rebuild through the write path (needs the write functions of the v1.1 layout) ----------


async def test_a_rebuild_gives_back_subscores_and_metadata_byte_for_byte(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Three boards written through the API's write path (``best`` with a descending subscore,
    ``set`` with an ascending one, ``set`` with metadata alone) and stored as history does; then
    views, hashes of records and a feed are spoiled and the boards rebuilt. Every key equals
    what the writes made: each view's sorted set and its hash of records byte for byte."""
    sent: dict[str, dict[str, Any]] = {}
    # Board main is in the history database from its migration: in Redis too, as at start-up.
    await BoardCatalog(redis, keys).ensure_defaults()
    for n, board in enumerate(BOARDS):
        await save_board(db, board)
        await BoardCatalog(redis, keys).put(board)
        for body in wide_scores(board, 60, seed=n) + set_again(board):
            sent[body["event_id"]] = body
            await write(redis, keys, settings, board, **body)
        await relay(redis, keys, db, board)
    before = await projection(redis, settings)

    # The event log holds what was sent, the metadata as the text the write was given.
    async with db.connect() as conn:
        rows = (await conn.execute(select(score_events))).all()
    assert {r.event_id: (r.subscore, r.metadata) for r in rows} == {
        event_id: (
            body.get("subscore"),
            orjson.dumps(body["metadata"]).decode() if "metadata" in body else None,
        )
        for event_id, body in sent.items()
    }
    # The projection compared below holds views with records that carry subscores and metadata.
    views = sorted(
        k
        for k, (kind, _) in before.items()
        if kind == "zset" and ":lb:" in k and not k.endswith(":distinct")
    )
    assert all(Keys.ties(view) in before for view in views)
    records = {k: before[Keys.ties(k)][1] for k in views}
    assert all(any(v.startswith(keys.tag(b.board_id)) for v in views) for b in BOARDS)
    assert any(parse_record(r)[2] for hashed in records.values() for r in hashed.values())
    assert any(r.startswith("s") for hashed in records.values() for r in hashed.values())
    # And set entries set again to their score after reaching it, which keep that write's time.
    assert any(written_of(r) for hashed in records.values() for r in hashed.values())

    for view in views[::2]:
        await redis.delete(view, Keys.ties(view))
    spoiled = views[1]
    some_id, some_record = next(iter(records[spoiled].items()))
    tie, score, _ = parse_record(some_record)
    await redis.hset(Keys.ties(spoiled), some_id, record(tie, score, '{"x":1}'))
    await redis.delete(keys.feed("race"))
    assert await projection(redis, settings) != before

    done = await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    after = await projection(redis, settings)

    assert [(r.board_id, r.events, r.refused) for r in done] == [
        ("level", 63, 0),
        ("main", 0, 0),
        ("race", 60, 0),
        ("stage", 63, 0),
    ]
    missing = sorted(before.keys() - after.keys())
    extra = sorted(after.keys() - before.keys())
    differ = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    assert (missing, extra, differ) == ([], [], [])
    for view in views:
        assert after[view] == before[view]
        assert after[Keys.ties(view)] == before[Keys.ties(view)]
