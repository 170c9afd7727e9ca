"""Boards deleted together (docs/api.md section 8b): each one's keys go, a board whose id starts
like a deleted one's keeps every key, and the deletions a worker round takes find their keys
with one ``SCAN`` of the keyspace rather than one each. A board made again under a deleted
one's name: its purge leaves the earlier board's kept history, and the events of the boards
before it, late in a queue, neither touch its counters nor bring their own keys back."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from services.api.eraser import Eraser
from services.history.handlers import HistoryHandler
from services.history.main import batch_handler
from shared import erasure
from shared.boards import BoardCatalog
from shared.db import open_engine, score_events, snapshots
from shared.db_boards import save_snapshots
from shared.erasure import BoardDeletion, Tombstones, skipping, to_ms, user_hash
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import post, score
from tests.helpers import (
    ADMIN,
    SERVER,
    T0,
    accepted_event,
    api_client,
    derive_outbox,
    eventually,
    snapshot,
)

GONE = ["cup", "cup-2", "league"]
KEPT = "cup2"


@pytest.fixture
def quiet(
    quiet: LadderSettings, mysql_database: str, monkeypatch: pytest.MonkeyPatch
) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database, and deletions whose
    cut-off lies 1.5 s after the request rather than 6: the cut-off outlasts other API
    processes' cached definitions, and here one process runs, which forgets a deleted board's
    definition at once."""
    monkeypatch.setattr(erasure, "BOARD_SETTLE_SECONDS", 1.5)
    return quiet


async def keys_of(redis: Redis, keys: Keys, board_id: str) -> list[str]:
    """The board's keys but its rate buckets, which expire within seconds of their last take."""
    found = [k async for k in redis.scan_iter(match=keys.board_match(board_id))]
    return [k for k in found if ":rate:" not in k]


async def test_boards_deleted_together_lose_their_keys_and_no_other_board_does(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        for board_id in [*GONE, KEPT]:
            answer = await client.put(f"/v1/boards/{board_id}", json={}, headers=ADMIN)
            assert answer.status_code == 201, answer.text
            await post(client, score(user_id="u-1", value=7), board=board_id)
        kept = sorted(await keys_of(redis, keys, KEPT))
        assert kept
        for board_id in GONE:
            answer = await client.delete(f"/v1/boards/{board_id}", headers=ADMIN)
            assert answer.status_code == 202, answer.text

        async def all_done() -> bool:
            for board_id in GONE:
                status = await client.get(f"/v1/board-deletions/{board_id}", headers=ADMIN)
                if status.json()["status"] != "done":
                    return False
            return True

        await eventually(all_done, within=20)
        for board_id in GONE:
            assert await keys_of(redis, keys, board_id) == []
        assert sorted(await keys_of(redis, keys, KEPT)) == kept
        page = await client.get(f"/v1/boards/{KEPT}/leaderboard", params={"scope": "region:eu"})
        assert [e["user_id"] for e in page.json()["entries"]] == ["u-1"]


class CountingScans:
    """The Redis client, counting the ``SCAN`` walks asked of it."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self.walks: list[str] = []

    def scan_iter(self, match: str, **kwargs: Any) -> AsyncIterator[Any]:
        self.walks.append(match)
        return self._redis.scan_iter(match=match, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)


async def test_a_round_s_deletions_walk_the_keyspace_once(redis: Redis, keys: Keys) -> None:
    for board_id in [*GONE, KEPT]:
        await redis.set(f"{keys.tag(board_id)}:newest", "e:u")
    counting = CountingScans(redis)
    eraser = Eraser(None, counting, keys, BoardCatalog(redis, keys), 5.0)  # type: ignore[arg-type]
    now = datetime.now(UTC)

    gone = await eraser.delete_boards([BoardDeletion(b, now, False, None) for b in GONE])

    assert gone == len(GONE)
    assert counting.walks == [keys.boards_match()]
    assert await redis.exists(f"{keys.tag(KEPT)}:newest")
    # A deletion alone walks its own board's keys.
    assert await eraser.delete_boards([BoardDeletion(KEPT, now, False, None)]) == 1
    assert counting.walks[-1] == keys.board_match(KEPT)


async def make(client: httpx.AsyncClient, board_id: str) -> None:
    answer = await client.put(f"/v1/boards/{board_id}", json={}, headers=ADMIN)
    assert answer.status_code == 201, answer.text


async def delete_board(client: httpx.AsyncClient, board_id: str, purge: bool = False) -> None:
    """Delete the board and wait until the deletion is done."""
    params = {"purge": "true"} if purge else {}
    answer = await client.delete(f"/v1/boards/{board_id}", params=params, headers=ADMIN)
    assert answer.status_code == 202, answer.text

    async def done() -> bool:
        status = await client.get(f"/v1/board-deletions/{board_id}", headers=ADMIN)
        return bool(status.json()["status"] == "done")

    await eventually(done, within=20)


async def written(
    client: httpx.AsyncClient, redis: Redis, keys: Keys, board_id: str, event_id: str
) -> ScoreAccepted:
    """Post ``event_id`` for u-1 on the board; the event as its outbox holds it (the tests'
    broker is unreachable, so it stays there)."""
    await post(client, score(user_id="u-1", event_id=event_id), board=board_id)
    entries: list[Any] = await redis.xrange(keys.outbox(board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    return next(e for e in events if e.event_id == event_id)


def snapshot_of(board_id: str, taken_at: datetime) -> Any:
    return {
        "board_id": board_id,
        "scope": "global",
        "period": "alltime",
        "period_id": "all",
        "taken_at": taken_at,
        "entries": [{"rank": 1, "user_id": "u-1", "score": 5}],
    }


async def test_a_purge_leaves_the_kept_history_of_an_earlier_board_of_the_name(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await make(client, "cup")
        first = await written(client, redis, keys, "cup", "first")
        await HistoryHandler(engine)([first])
        await save_snapshots(engine, [snapshot_of("cup", datetime.now(UTC))])
        await delete_board(client, "cup")

        await make(client, "cup")
        second = await written(client, redis, keys, "cup", "second")
        await HistoryHandler(engine)([second])
        await save_snapshots(engine, [snapshot_of("cup", datetime.now(UTC))])
        await delete_board(client, "cup", purge=True)

        async with engine.connect() as conn:
            events = await conn.execute(
                select(score_events.c.event_id).where(score_events.c.board_id == "cup")
            )
            assert list(events.scalars()) == ["first"]
            taken = await conn.execute(
                select(snapshots.c.taken_at).where(snapshots.c.board_id == "cup")
            )
            assert len(taken.all()) == 1, "the first board's snapshot stays, the second's goes"


async def test_a_purged_board_s_event_late_in_the_queue_leaves_the_fresh_board_s_stats(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The old board's ``e-1`` reaches the history consumer after the fresh board counted its
    own ``e-1`` of the same user: the fresh board's event stays counted."""
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await make(client, "cup")
        old = await written(client, redis, keys, "cup", "e-1")
        await delete_board(client, "cup", purge=True)
        await make(client, "cup")
        await written(client, redis, keys, "cup", "e-1")
        board = await BoardCatalog(redis, keys).get("cup", fresh=True)
        assert board is not None
        assert await derive_outbox(redis, keys, board, quiet.feed_length) == 1

        async def counted() -> int:
            stats = await client.get("/v1/boards/cup/stats", params={"period": "alltime"})
            assert stats.status_code == 200, stats.text
            return int(stats.json()["events"])

        assert await counted() == 1
        await batch_handler(engine, redis, keys, quiet)([old])
        assert await counted() == 1


async def test_only_an_erasure_s_events_are_handed_on_as_left_out(redis: Redis, keys: Keys) -> None:
    """The aggregator's filter (the Redis projections) hands its pair sync the events a user's
    erasure left out, none of a deleted board's, the erased user's there included."""
    cutoff = to_ms(T0) + 1000
    await redis.hset(keys.erased, user_hash("u-x", "secret"), cutoff)
    await redis.hset(keys.deleted_boards, "cup", cutoff)
    handled: list[str] = []
    dropped: list[str] = []

    async def handle(events: list[ScoreAccepted]) -> None:
        handled.extend(e.event_id for e in events)

    async def drop(events: list[ScoreAccepted]) -> None:
        dropped.extend(e.event_id for e in events)

    tombstones = Tombstones(redis, keys, "secret")
    await skipping("aggregator", tombstones, handle, on_dropped=drop)(
        [
            accepted_event("erased", user_id="u-x"),
            accepted_event("erased-on-cup", user_id="u-x", board_id="cup"),
            accepted_event("on-cup", board_id="cup"),
            accepted_event("kept"),
        ]
    )
    assert handled == ["kept"]
    assert dropped == ["erased"]


async def test_a_deleted_board_s_event_late_in_the_queue_brings_none_of_its_keys_back(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A history consumer more than the deletion's few seconds behind: the deleted board's
    event is stored (its history stays) and marks no view of it for a snapshot."""
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await make(client, "cup")
        late = await written(client, redis, keys, "cup", "e-1")
        await delete_board(client, "cup")
        assert await keys_of(redis, keys, "cup") == []

        await batch_handler(engine, redis, keys, quiet)([late])
        assert await keys_of(redis, keys, "cup") == []
        async with engine.connect() as conn:
            stored = await conn.execute(
                select(score_events.c.event_id).where(score_events.c.board_id == "cup")
            )
            assert list(stored.scalars()) == ["e-1"]


def gauge(text: str, name: str, board_id: str) -> float:
    """The sum of a metric's samples for one board in ``/metrics`` text."""
    found = re.findall(rf'^{name}\{{[^}}]*board_id="{board_id}"[^}}]*\}} (\S+)$', text, re.M)
    return sum(float(value) for value in found)


async def test_a_board_deleted_with_events_in_its_outbox_leaves_no_backlog_gauge(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The broker away, board ``cup``'s events wait in its outbox and the relay's backlog gauge
    says so; the board deleted, its outbox goes with it, and the gauge goes to 0 (the outbox
    holds nothing more), rather than keep its last value for as long as the process runs: an
    alert on a backlog that no longer exists."""
    async with api_client(quiet) as client:
        await make(client, "cup")
        for n in range(3):
            await post(client, score(event_id=f"e-{n}", user_id=f"u-{n}"), board="cup")

        async def backlog(expected: float) -> bool:
            text = (await client.get("/metrics")).text
            return gauge(text, "ladder_relay_backlog", "cup") == expected

        # The relay reads the outboxes' lengths at each attempt to reach the broker (5 s apart).
        await eventually(lambda: backlog(3), within=15)
        await delete_board(client, "cup")
        assert await redis.xlen(keys.outbox("cup")) == 0
        await eventually(lambda: backlog(0), within=15)


async def test_a_deletion_judges_the_board_before_its_query(
    quiet: LadderSettings, redis: Redis
) -> None:
    """The board of the path (404, and 409 for ``main``) before the query's 422 (docs/api.md
    section 1), and a refused deletion changes nothing."""
    async with api_client(quiet) as client:
        await make(client, "cup")
        before = await snapshot(redis, quiet.key_prefix)
        # Booleans as JSON writes them only: pydantic read yes, on, 1 and TRUE as true, and a
        # deletion with one of them purged the board's history.
        for bad in ("banana", "", "yes", "1", "TRUE", "on", "off", "0"):
            answer = await client.delete("/v1/boards/nope", params={"purge": bad}, headers=ADMIN)
            assert answer.status_code == 404, answer.text
            answer = await client.delete("/v1/boards/main", params={"purge": bad}, headers=ADMIN)
            assert answer.status_code == 409, answer.text
            answer = await client.delete("/v1/boards/cup", params={"purge": bad}, headers=ADMIN)
            assert answer.status_code == 422, answer.text
            assert answer.json()["errors"][0]["loc"] == ["query", "purge"]
        unknown = await client.delete("/v1/boards/nope", params={"purge": "x"}, headers=SERVER)
        assert unknown.status_code == 403, unknown.text
        assert await snapshot(redis, quiet.key_prefix) == before
        assert (await client.get("/v1/boards/cup")).status_code == 200
        assert (await client.get("/v1/board-deletions/cup", headers=ADMIN)).status_code == 404
