"""``make rebuild`` (services/rebuild/) on the real Redis and MySQL, without services:
events are written as the API writes them and stored as history stores them, then Redis is
spoiled and rebuilt. The fault suite (tests/faults/test_rebuild.py) does it with the whole
system under load."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.aggregator.merge import Merger
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from services.history.handlers import HistoryHandler
from services.rebuild import rebuilder as rebuild_module
from services.rebuild.keyspace import existing
from services.rebuild.rebuilder import BoardRebuild, Rebuilder, RebuildFailed
from shared.boards import Board, BoardCatalog
from shared.db_boards import save_board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.ranking import id_of
from shared.settings import LadderSettings
from tests.helpers import derive, read_view, snapshot, stored_score

BOARDS = [
    Board(board_id="main"),
    Board(board_id="speed", operator="best", order="asc", periods=("daily", "alltime")),
    Board(board_id="level", operator="set", periods=("weekly", "alltime")),
]


async def write(
    redis: Redis, keys: Keys, settings: LadderSettings, board: Board, **body: Any
) -> None:
    """One score as the API accepts it (into the boards and the outbox)."""
    score = ScoreIn.model_validate(body)
    assert score.event_id is not None
    answer = await submit(redis, keys, settings, board, score, score.event_id)
    assert not answer["duplicate"]


def eu(event_id: str, user_id: str, value: int, occurred_at: str, **more: Any) -> dict[str, Any]:
    """A score body in region eu, for :func:`write`."""
    return {
        "event_id": event_id,
        "user_id": user_id,
        "region": "eu",
        "value": value,
        "occurred_at": occurred_at,
        **more,
    }


# The feed's length in the suite's settings (the rebuild replays with it).
FEED_LENGTH: int = LadderSettings.model_fields["feed_length"].default


async def relay(
    redis: Redis,
    keys: Keys,
    db: AsyncEngine,
    board: Board,
    *,
    skip: str = "",
    derived: bool = True,
) -> list[ScoreAccepted]:
    """What the relay, history and the aggregator's derive step do: the outbox into MySQL, in
    order, and (unless not ``derived``: the aggregator is behind) into the derived views, then
    out of the outbox. An event ``skip`` is taken out of the outbox and derived but not stored
    (it is on its way to history): returned."""
    entries = await redis.xrange(keys.outbox(board.board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    await HistoryHandler(db)([e for e in events if e.event_id != skip])
    if derived:
        await derive(redis, keys, board, events, FEED_LENGTH)
    if entries:
        await redis.xdel(keys.outbox(board.board_id), *[entry_id for entry_id, _ in entries])
    return [e for e in events if e.event_id == skip]


async def outbox_events(redis: Redis, keys: Keys, board: Board) -> list[ScoreAccepted]:
    entries = await redis.xrange(keys.outbox(board.board_id))
    return [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]


def random_scores(board: Board, count: int, seed: int) -> list[dict[str, Any]]:
    """Scores of a few users in a few regions and teams, with exact ties (one occurred_at for
    several events) and negative deltas."""
    rng = random.Random(seed)
    base = datetime.now(UTC) - timedelta(seconds=30)
    return [
        {
            "event_id": f"{board.board_id}-{i}",
            "user_id": f"u{rng.randrange(12)}",
            "region": rng.choice(("eu", "na", "as")),
            "value": rng.randint(-5, 50) if board.operator == "incr" else rng.randint(1, 40),
            "team_id": rng.choice(("red", "blue", None)),
            "display_name": rng.choice(("Ana", "Bo", None)),
            "occurred_at": (base + timedelta(milliseconds=rng.randrange(0, 40) * 250)).isoformat(),
        }
        for i in range(count)
    ]


async def projection(redis: Redis, settings: LadderSettings) -> dict[str, Any]:
    """What the rebuild makes: every key but the outbox, the idempotency answers and the
    aggregator's dirty marks."""
    state = await snapshot(redis, settings.key_prefix)
    return {
        key: value
        for key, value in state.items()
        if not any(f":{kind}" in key for kind in ("outbox", "idem:", "dirty"))
    }


async def test_a_rebuild_makes_every_key_again_byte_for_byte(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Three boards (``incr`` with teams, ``best`` ascending, ``set``) written as the API does
    and stored as history does; then Redis is spoiled (keys deleted, a stranger added, a score
    changed) and rebuilt: every key equals what the writes made, board definitions included. A
    second rebuild changes nothing."""
    for n, board in enumerate(BOARDS):
        await save_board(db, board)
        await BoardCatalog(redis, keys).put(board)
        for body in random_scores(board, 80, seed=n):
            await write(redis, keys, settings, board, **body)
        await relay(redis, keys, db, board)
    before = await projection(redis, settings)

    main = keys.region_view("main", "alltime", "all", "eu")
    await redis.delete(
        keys.boards,
        keys.feed("speed"),
        keys.names("main"),
        keys.teams_view("main", "alltime", "all"),
    )
    await redis.zadd(main, {"stranger": 12 * 2**30})
    await redis.zincrby(keys.region_view("level", "alltime", "all", "na"), 2**30, "u1")
    assert await projection(redis, settings) != before

    rebuilder = Rebuilder(db, redis, keys, settings, wait_seconds=5)
    first = await rebuilder.run()
    after = await projection(redis, settings)
    second = await rebuilder.run()
    again = await projection(redis, settings)

    missing = sorted(before.keys() - after.keys())
    extra = sorted(after.keys() - before.keys())
    differ = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    assert (missing, extra, differ) == ([], [], [])
    assert again == before
    # run() takes the boards from MySQL, by id.
    assert [(r.board_id, r.events) for r in first] == [(r.board_id, r.events) for r in second]
    assert [(r.board_id, r.events) for r in first] == [("level", 80), ("main", 80), ("speed", 80)]
    assert all(r.attempts == 1 and r.refused == 0 for r in first + second)
    # Every user of every regional view is marked for the aggregator's next merge.
    users = [id_of(m) for m in await redis.zrange(main, 0, -1)]
    assert users and {f"alltime|all|eu|{u}" for u in users} <= await redis.smembers(
        keys.dirty("main")
    )
    assert not [k async for k in redis.scan_iter(match="{" + settings.key_prefix + ":*rebuild*")]


async def test_an_event_not_yet_stored_is_waited_for(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An event applied before the rebuild began, relayed but not stored yet (it is on its way
    to history), is not in the snapshot: a live event counter is then ahead of the staged one,
    and the rebuild throws staging away and reads MySQL again, instead of losing the event."""
    monkeypatch.setattr(rebuild_module, "ATTEMPTS", 3)
    board = BOARDS[0]
    base = datetime.now(UTC).isoformat()
    await write(redis, keys, settings, board, **eu("e1", "u1", 5, base))
    await write(redis, keys, settings, board, **eu("e2", "u2", 7, base))
    on_its_way = await relay(redis, keys, db, board, skip="e1")
    before = await projection(redis, settings)

    # History stores e1 once the rebuild's first attempt has read MySQL, before it reads again:
    # the first read waits here until e1 is stored.
    read, stored, stage = asyncio.Event(), asyncio.Event(), Rebuilder._stage

    async def stage_then_wait(self: Rebuilder, *args: Any) -> tuple[int, int, set[str]]:
        staged = await stage(self, *args)
        if not read.is_set():
            read.set()
            await stored.wait()
        return staged

    monkeypatch.setattr(Rebuilder, "_stage", stage_then_wait)
    rebuilder = Rebuilder(db, redis, keys, settings, wait_seconds=5)
    task = asyncio.create_task(rebuilder.board(board))
    await asyncio.wait_for(read.wait(), 30)
    await HistoryHandler(db)(on_its_way)
    stored.set()
    done: BoardRebuild = await task
    assert done.attempts == 2
    # e1 was stored after e2; accepted within the same millisecond, the rebuilt feed may list
    # them the other way round, so the feed is compared as a set; every board and count as is.
    after = await projection(redis, settings)
    feed = keys.feed("main")
    assert sorted(after.pop(feed)[1]) == sorted(before.pop(feed)[1])
    assert after == before


async def test_writes_during_a_rebuild_count_once(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two events are written while an ``incr`` board is rebuilt: one before MySQL is read
    (MySQL holds it by then: the journal's copy is skipped) and one while it is read (MySQL's
    snapshot does not hold it: the journal's copy is applied). Each counts once."""
    board = BOARDS[0]
    base = datetime.now(UTC).isoformat()
    for i in range(30):
        await write(
            redis, keys, settings, board, **eu(f"e{i}", f"u{i % 4}", 10, base, team_id="red")
        )
    await relay(redis, keys, db, board)
    original_wait = Rebuilder._wait_stored
    original_replay = Rebuilder._replay

    async def wait_then_write(self: Rebuilder, board_id: str, event_ids: list[str]) -> None:
        await original_wait(self, board_id, event_ids)
        await write(redis, keys, settings, board, **eu("known", "u1", 100, base, team_id="red"))
        await relay(redis, keys, db, board)

    late: list[ScoreAccepted] = []

    async def replay_then_write(self: Rebuilder, *args: Any) -> int:
        refused = await original_replay(self, *args)
        if not await redis.exists(keys.idempotency("main", "late", "u2")):
            await write(redis, keys, settings, board, **eu("late", "u2", 1000, base, team_id="red"))
            late.extend(await outbox_events(redis, keys, board))
            # Stored, but not derived yet: the aggregator is behind.
            await relay(redis, keys, db, board, derived=False)
        return refused

    monkeypatch.setattr(Rebuilder, "_wait_stored", wait_then_write)
    monkeypatch.setattr(Rebuilder, "_replay", replay_then_write)
    done = await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(board)

    assert (done.events, done.journal_known, done.journal_replayed) == (31, 1, 1)
    async with db.connect() as conn:
        rows = await conn.execute(
            text("SELECT user_id, SUM(value) FROM score_events GROUP BY user_id")
        )
        expected = {user: int(total) for user, total in rows}
    view = keys.region_view("main", "alltime", "all", "eu")
    actual = dict(await read_view(redis, view, True))
    assert actual == expected == {"u0": 80, "u1": 180, "u2": 1070, "u3": 70}
    teams = keys.teams_view("main", "alltime", "all")
    assert await stored_score(redis, teams, "red", True) == 1400
    assert await redis.get(keys.event_count("main", "alltime", "all")) == "32"
    # The rebuild derived the journaled event into what it put in place, and cleared its
    # derive-pending bit: the aggregator, catching up, derives nothing of it again.
    assert [e.event_id for e in late] == ["late"]
    assert await derive(redis, keys, board, late, FEED_LENGTH) == 0
    assert await redis.get(keys.event_count("main", "alltime", "all")) == "32"
    assert (await redis.lrange(keys.feed("main"), 0, 0))[0].startswith('{"event_id":"late"')


async def test_a_second_rebuild_of_a_board_at_once_is_refused(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Two rebuilds of one board at once would share, and reset, one journal: the second is
    refused while the first holds the flag, and nothing of the first's is touched."""
    await redis.set(keys.rebuilding("main"), "another-rebuild", px=60_000)
    await redis.rpush(keys.rebuild_journal("main"), "begin")
    with pytest.raises(RebuildFailed, match="being rebuilt by another process"):
        await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(BOARDS[0])
    assert await redis.get(keys.rebuilding("main")) == "another-rebuild"
    assert await redis.lrange(keys.rebuild_journal("main"), 0, -1) == ["begin"]


async def test_without_history_catching_up_the_rebuild_gives_up_and_changes_nothing(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """An accepted event still in the outbox, never stored (history is not consuming): the
    rebuild waits ``--wait`` seconds for it, then fails, leaving Redis as it was."""
    board = BOARDS[0]
    now = datetime.now(UTC).isoformat()
    await write(redis, keys, settings, board, **eu("e1", "u1", 3, now))
    await relay(redis, keys, db, board)
    await write(redis, keys, settings, board, **eu("e2", "u1", 4, now))
    before = await snapshot(redis, settings.key_prefix)

    with pytest.raises(RebuildFailed, match="1 events applied in Redis are not in the history"):
        await Rebuilder(db, redis, keys, settings, wait_seconds=1).board(board)
    assert await snapshot(redis, settings.key_prefix) == before


async def test_without_the_aggregator_catching_up_the_rebuild_gives_up_and_changes_nothing(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """An accepted event stored by history but not derived by the aggregator (it is behind):
    the rebuild would derive it into staging, and the aggregator again after the rebuild. It
    waits ``--wait`` seconds for the aggregator, then fails, leaving Redis as it was; once the
    aggregator derived it, the rebuild goes through."""
    board = BOARDS[0]
    now = datetime.now(UTC).isoformat()
    await write(redis, keys, settings, board, **eu("e1", "u1", 3, now))
    await relay(redis, keys, db, board)
    await write(redis, keys, settings, board, **eu("e2", "u1", 4, now))
    behind = await outbox_events(redis, keys, board)
    await relay(redis, keys, db, board, derived=False)
    before = await snapshot(redis, settings.key_prefix)

    with pytest.raises(RebuildFailed, match="1 events applied in Redis are not derived"):
        await Rebuilder(db, redis, keys, settings, wait_seconds=1).board(board)
    assert await snapshot(redis, settings.key_prefix) == before

    assert await derive(redis, keys, board, behind, FEED_LENGTH) == 1
    derived = await projection(redis, settings)
    await Rebuilder(db, redis, keys, settings, wait_seconds=1).board(board)
    assert await projection(redis, settings) == derived
    assert await redis.get(keys.event_count("main", "alltime", "all")) == "2"


async def test_regional_distinct_sets_are_dropped_and_built_again_from_the_rebuilt_views(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """A board read densely in two regions: eu's set built, na's half built. The rebuild makes
    no regional distinct set (its replay keeps none) and drops both, so that right after it no
    regional view has one, live or rebuilt; it asks the aggregator to build both again, which
    makes them from the rebuilt views: the keys are then those before, byte for byte. A board
    never read densely in a region gets no set, and no build."""
    board = BOARDS[1]  # best, ascending
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)
    for body in random_scores(board, 60, seed=4):
        await write(redis, keys, settings, board, **body)
    await relay(redis, keys, db, board)
    bid = board.board_id
    eu_view = keys.region_view(bid, "alltime", "all", "eu")
    na_view = keys.region_view(bid, "alltime", "all", "na")
    await redis.sadd(keys.dense(bid), "region")
    await redis.sadd(keys.dense_build(bid), "alltime|all|region:eu")
    merger = Merger(redis, keys)
    await merger.build_dense(board)
    await redis.sadd(keys.dense_build(bid), "alltime|all|region:na")
    merger.build_step = 1
    await merger.build_dense(board, 0)
    assert await redis.exists(Keys.distinct(eu_view), Keys.distinct_building(na_view)) == 2
    before = await projection(redis, settings)

    await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(board)
    sets = [k async for k in redis.scan_iter(match=keys.tag(bid) + ":*region:*:distinct*")]
    assert sets == []
    assert await redis.smembers(keys.dense_build(bid)) == {
        "alltime|all|region:eu",
        "alltime|all|region:na",
    }
    # Built again by the aggregator that was building na: its cursor's set went, so it starts
    # from the top.
    await merger.build_dense(board)
    after = await projection(redis, settings)
    assert not await redis.exists(Keys.distinct_building(na_view), keys.dense_build(bid))
    na_pairs = sorted({int(s) for _, s in await redis.zrange(na_view, 0, -1, withscores=True)})
    assert await redis.zrange(Keys.distinct(na_view), 0, -1) == [str(s) for s in na_pairs]
    after.pop(Keys.distinct(na_view))
    before.pop(Keys.distinct_building(na_view))
    before.pop(keys.dense_build(bid))
    # The merge lease the half-built set was held under, given up once it was built.
    before.pop(keys.merge_lease(bid))
    assert after == before

    # A set begun after the rebuild looked at the board's keys goes too: it would not follow
    # the view put in its place.
    found = (await existing(redis, keys, [bid], keys.tag(bid) + ":"))[bid]
    await redis.sadd(keys.dense_build(bid), "alltime|all|region:as")
    merger = Merger(redis, keys)
    merger.build_step = 1
    await merger.build_dense(board, 0)
    as_view = keys.region_view(bid, "alltime", "all", "as")
    assert await redis.exists(Keys.distinct_building(as_view))
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(board, found)
    assert not await redis.exists(Keys.distinct_building(as_view), Keys.distinct(as_view))

    # A board not read densely in a region: nothing to build again.
    other = BOARDS[2]
    await save_board(db, other)
    await BoardCatalog(redis, keys).put(other)
    for body in random_scores(other, 20, seed=5):
        await write(redis, keys, settings, other, **body)
    await relay(redis, keys, db, other)
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(other)
    assert not await redis.exists(keys.dense_build(other.board_id))


async def test_the_ranked_views_do_not_depend_on_the_order_the_log_holds_events(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Events come in out of the order they happened in (late ones), and the log may hold them
    in yet another order (relays store in no order between them): every rule of a score's reach
    time and metadata goes by when events happened, so the rebuild's replay in the log's order
    gives every regional and team view, with its records, as the live writes made them; and
    each user's latest team, which goes by when events were accepted, as the derive step kept
    it."""
    rng = random.Random(7)
    for n, board in enumerate(BOARDS):
        await save_board(db, board)
        await BoardCatalog(redis, keys).put(board)
        bodies = random_scores(board, 60, seed=20 + n)
        # Distinct times, in shuffled order: exact ties fall back on the order of arrival.
        base = datetime.now(UTC) - timedelta(seconds=60)
        moments = rng.sample(range(len(bodies)), len(bodies))
        for body, moment in zip(bodies, moments, strict=True):
            body["occurred_at"] = (base + timedelta(milliseconds=250 * moment)).isoformat()
            body["metadata"] = {"at": moment}
            await write(redis, keys, settings, board, **body)
        events = await outbox_events(redis, keys, board)
        await HistoryHandler(db)(rng.sample(events, len(events)))
        await derive(redis, keys, board, events, FEED_LENGTH)
        await redis.xdel(
            keys.outbox(board.board_id),
            *[e for e, _ in await redis.xrange(keys.outbox(board.board_id))],
        )

    def ranked(state: dict[str, Any]) -> dict[str, Any]:
        teams = {keys.user_team(board.board_id) for board in BOARDS}
        return {
            k: v for k, v in state.items() if (":lb:" in k and ":global" not in k) or k in teams
        }

    before = ranked(await projection(redis, settings))
    assert any(":teams" in k for k in before) and keys.user_team("main") in before
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    assert ranked(await projection(redis, settings)) == before
