"""The views derived from accepted events, off the write path (services/aggregator/derive.py,
shared/lua/derive.lua): the write leaves them alone; the aggregator's derive step applies each
event once, however often its batch is delivered, and in any order of batches ends with the same
counts and sets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from bench.phases.commands import SHAPES, commands_per_write, private_redis
from services.aggregator import derive as derive_module
from services.aggregator.derive import Derive
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board, BoardCatalog
from shared.events import ScoreAccepted, rfc3339
from shared.functions import DERIVE_FUNCTION, MARK_SEEN_FUNCTION
from shared.keys import Keys, seen_keys
from shared.ranking import MAX_SCORE, reached_ms, tie_key
from shared.settings import LadderSettings
from tests.helpers import derive, read_view

BOARD = Board(board_id="dv", periods=("daily", "alltime"))
FEED = 10


async def accept(
    redis: Redis, keys: Keys, settings: LadderSettings, count: int, board: Board = BOARD
) -> list[ScoreAccepted]:
    """``count`` scores accepted as the API accepts them (users u0..u4, regions eu and na, team
    red on every other one); the events as the aggregator receives them, in acceptance order."""
    now = datetime.now(UTC) - timedelta(seconds=5)
    for i in range(count):
        score = ScoreIn(
            user_id=f"u{i % 5}",
            region=("eu", "na")[i % 2],
            value=i + 1,
            team_id="red" if i % 2 else None,
            occurred_at=now + timedelta(milliseconds=i),
        )
        await submit(redis, keys, settings, board, score, f"d-{i}")
    entries: list[Any] = await redis.xrange(keys.outbox(board.board_id))
    return [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]


async def derived(
    redis: Redis, keys: Keys, events: list[ScoreAccepted], board: Board = BOARD
) -> dict[str, Any]:
    """Every derived view of the board, in a comparable form (the feed as its event ids)."""
    bid, day = board.board_id, events[0].periods["daily"].period_id
    users = sorted({e.user_id for e in events})
    state: dict[str, Any] = {
        "feed": [orjson_id(entry) for entry in await redis.lrange(keys.feed(bid), 0, -1)],
        "teams": await read_view(redis, keys.teams_view(bid, "alltime", "all"), True),
        "user_team": await user_teams(redis, keys, bid),
        "user_regions": {u: await redis.hget(keys.user_regions(bid), u) for u in users},
    }
    for period, period_id in (("daily", day), ("alltime", "all")):
        state[period] = (
            await redis.get(keys.event_count(bid, period, period_id)),
            await redis.pfcount(keys.players(bid, period, period_id)),
            await redis.smembers(keys.regions(bid, period, period_id)),
        )
    return state


async def user_teams(redis: Redis, keys: Keys, board_id: str) -> dict[str, str]:
    """The board's user-team hash, each user's team (the fields of when each was given, which
    begin with '@', left out)."""
    fields = await redis.hgetall(keys.user_team(board_id))
    return {user: team for user, team in fields.items() if not user.startswith("@")}


async def red_then_blue(
    redis: Redis, keys: Keys, settings: LadderSettings, board_id: str
) -> tuple[ScoreAccepted, ScoreAccepted]:
    """Two events of user u accepted in turn, the first for team red, the second for blue."""
    board = Board(board_id=board_id, periods=("alltime",))
    at = datetime.now(UTC) - timedelta(seconds=5)
    for i, team in enumerate(("red", "blue")):
        score = ScoreIn(user_id="u", region="eu", value=5, team_id=team, occurred_at=at)
        await submit(redis, keys, settings, board, score, f"rb-{i}")
        await asyncio.sleep(0.005)
    entries: list[Any] = await redis.xrange(keys.outbox(board_id))
    red, blue = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    assert red.accepted_at < blue.accepted_at
    return red, blue


def record(keys: Keys, event: ScoreAccepted) -> str:
    """The event's record: named by its board, user and id."""
    return keys.idempotency(event.board_id, event.event_id, event.user_id)


def newest_first(events: list[ScoreAccepted]) -> list[str]:
    """The events' ids in the feed's order: by accepted_at, then id and user, newest first (two
    accepted in the same millisecond go by their ids)."""
    placed = sorted(events, key=lambda e: (rfc3339(e.accepted_at), e.event_id, e.user_id))
    return [e.event_id for e in reversed(placed)]


def orjson_id(entry: str) -> str:
    """A feed entry's event id."""
    return str(orjson.loads(entry)["event_id"])


async def test_the_write_leaves_the_derived_views_to_the_aggregator(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    events = await accept(redis, keys, settings, 4)
    bid = BOARD.board_id
    before = await derived(redis, keys, events)
    assert before["feed"] == [] and before["user_team"] == {} and before["teams"] == []
    # Counters and players are the derive step's; the regions set has each region from the
    # write of its first user there (the period's close reads it).
    assert before["alltime"] == (None, 0, {"eu", "na"})
    assert await redis.hget(keys.as_of(bid), "derived") is None
    # The write notes the newest event for the rebuild, and each record waits for its derive.
    assert await redis.get(keys.newest_event(bid)) == "d-3:u3"
    assert [(await redis.get(record(keys, e)))[0] for e in events] == ["D"] * 4

    assert await derive(redis, keys, BOARD, events, FEED) == 4
    after = await derived(redis, keys, events)
    assert after["feed"] == ["d-3", "d-2", "d-1", "d-0"]
    assert after["user_team"] == {"u1": "red", "u3": "red"}
    assert after["teams"] == [("red", 2 + 4)]
    assert after["user_regions"] == {"u0": "eu", "u1": "na", "u2": "eu", "u3": "na"}
    assert after["alltime"] == ("4", 4, {"eu", "na"})
    assert after["daily"] == after["alltime"]
    assert await redis.hget(keys.as_of(bid), "derived") is not None
    assert [(await redis.get(record(keys, e)))[0] for e in events] == ["@"] * 4


async def test_a_redelivered_batch_derives_nothing_twice(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    events = await accept(redis, keys, settings, 6)
    assert await derive(redis, keys, BOARD, events[:4], FEED) == 4
    once = await derived(redis, keys, events)
    # The same batch again, and a batch overlapping it: only the new events count.
    assert await derive(redis, keys, BOARD, events[:4], FEED) == 0
    assert await derived(redis, keys, events) == once
    assert await derive(redis, keys, BOARD, events[2:], FEED) == 2
    assert await derive(redis, keys, BOARD, events, FEED) == 0
    state = await derived(redis, keys, events)
    assert state["alltime"] == ("6", 5, {"eu", "na"})
    assert state["teams"] == [("red", 2 + 4 + 6)]
    assert state["feed"] == [f"d-{i}" for i in range(5, -1, -1)]


async def test_a_users_regions_set_of_the_layout_before_is_taken_into_the_hash(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A user whose regions the layout before kept in a set of its own: its next derived event
    puts them in its field of the board's users' regions hash, with the event's, sorted, and the
    set goes (until then the merge and the ranks read take the set: test_merge_function.py,
    tests/api/test_hardening_boards.py)."""
    bid = BOARD.board_id
    await redis.sadd(keys.legacy_user_regions(bid, "u0"), "sa", "af")
    await redis.sadd(keys.legacy_user_regions(bid, "u4"), "af")
    events = await accept(redis, keys, settings, 3)  # u0 in eu, u1 in na, u2 in eu

    assert await derive(redis, keys, BOARD, events, FEED) == 3
    fields = await redis.hgetall(keys.user_regions(bid))
    assert fields == {"u0": "af eu sa", "u1": "na", "u2": "eu"}
    assert not await redis.exists(keys.legacy_user_regions(bid, "u0"))
    assert await redis.smembers(keys.legacy_user_regions(bid, "u4")) == {"af"}  # not derived yet


async def test_batches_applied_in_any_order_give_the_same_counts_and_sets(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Counts, players, regions, users' regions and the feed (newest accepted first) do not
    depend on the order of batches."""
    other = BOARD.model_copy(update={"board_id": "dv-other"})
    events = await accept(redis, keys, settings, 8)
    assert await derive(redis, keys, BOARD, events[4:], FEED) == 4
    assert await derive(redis, keys, BOARD, events[:4], FEED) == 4
    reversed_order = await derived(redis, keys, events)
    events = await accept(redis, keys, settings, 8, other)
    assert await derive(redis, keys, other, events, FEED) == 8
    in_order = await derived(redis, keys, events, other)
    assert in_order["feed"] == newest_first(events)
    # The latest team of each user is the one of its latest event in both (each user has one).
    assert reversed_order == in_order


async def test_an_event_the_write_before_derived_is_not_derived_again(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A record without the derive-pending bit (the write of the layout before applied the
    derived views itself) derives nothing."""
    events = await accept(redis, keys, settings, 1)
    await redis.setrange(record(keys, events[0]), 0, "@")  # as the write before v6 left it
    assert await derive(redis, keys, BOARD, events, FEED) == 0
    # No count, no player; the region is the write's own.
    assert (await derived(redis, keys, events))["alltime"] == (None, 0, {"eu"})


async def test_an_event_whose_record_expired_is_derived_once(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """An event reaching the derive step after its record expired (the broker away longer than
    the idempotency TTL) is applied, whichever consumer saw it first, and once."""
    events = await accept(redis, keys, settings, 4)
    await redis.delete(record(keys, events[1]), record(keys, events[3]))
    # The notifier marked events[3] seen first: its mark made a record of marks alone.
    mark = seen_keys(keys, BOARD.board_id, "notifier", "d-3", events[3].user_id)
    assert mark[0] == record(keys, events[3])
    await redis.fcall(MARK_SEEN_FUNCTION, 3, *mark, "notifier", 60)
    assert await derive(redis, keys, BOARD, events, FEED) == 4
    assert await derive(redis, keys, BOARD, events, FEED) == 0
    state = await derived(redis, keys, events)
    assert state["alltime"] == ("4", 4, {"eu", "na"})
    assert state["teams"] == [("red", 2 + 4)]
    assert state["feed"] == ["d-3", "d-2", "d-1", "d-0"]
    assert await redis.get(record(keys, events[1])) == "@"
    assert 86_000 < await redis.ttl(record(keys, events[1])) <= 86_400


async def test_a_derived_event_is_known_a_day_however_short_the_idempotency_ttl(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The derive step keeps an event's record at least a day from the step on (as a consumer's
    seen mark does, live.lua), so that a redelivery after the idempotency TTL (here its least,
    60 s: the aggregator died between its derive step and its ack) derives nothing again, its
    count, team sum and feed entry counted once. The minute is taken off each record's life with
    ``PEXPIRE`` rather than waited out (a record with less left is deleted, as it would expire).
    A record of marks alone that a consumer's mark made (here for 60 s) is kept a day too."""
    short = settings.model_copy(update={"idempotency_ttl_seconds": 60})
    events = await accept(redis, keys, short, 3)
    await redis.delete(record(keys, events[2]))
    mark = seen_keys(keys, BOARD.board_id, "notifier", "d-2", events[2].user_id)
    await redis.fcall(MARK_SEEN_FUNCTION, 3, *mark, "notifier", 60)
    assert await derive(redis, keys, BOARD, events, FEED) == 3
    once = await derived(redis, keys, events)

    for event in events:
        left = await redis.pttl(record(keys, event))
        await redis.pexpire(record(keys, event), left - 60_000)
    assert await derive(redis, keys, BOARD, events, FEED) == 0
    assert await derived(redis, keys, events) == once
    assert once["alltime"] == ("3", 3, {"eu", "na"})
    assert once["teams"] == [("red", 2)]
    for event in events:
        assert await redis.getbit(record(keys, event), 5) == 0  # derived: its bit clear
        assert 86_000 < await redis.ttl(record(keys, event)) <= 86_400


async def test_a_team_sum_beyond_the_exact_scores_leaves_the_event_out(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The write no longer refuses an event whose team sum would leave ±(2**53 - 1): the event is
    accepted (its user's entry is exact), and the derive step leaves it out of the team's sum,
    which stays at its last exact total and goes on from there."""
    board = Board(board_id="wide", periods=("alltime",), min_value=-MAX_SCORE, max_value=MAX_SCORE)
    now = datetime.now(UTC) - timedelta(seconds=5)
    for i, (user, value) in enumerate([("a", MAX_SCORE), ("b", MAX_SCORE), ("c", -5)]):
        score = ScoreIn(
            user_id=user,
            region="eu",
            value=value,
            team_id="big",
            occurred_at=now + timedelta(milliseconds=i),
        )
        await submit(redis, keys, settings, board, score, f"w-{i}")
    entries: list[Any] = await redis.xrange(keys.outbox("wide"))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    assert len(events) == 3
    call_keys, args = Derive(redis, keys, None, FEED).call(board, events, "t")
    assert await redis.fcall(DERIVE_FUNCTION, len(call_keys), *call_keys, *args) == [3, 1]
    teams = keys.teams_view("wide", "alltime", "all")
    assert await read_view(redis, teams, True) == [("big", MAX_SCORE - 5)]
    # Reached when c's event changed it, the last that did.
    tie = tie_key(reached_ms(events[2].occurred_at), "")
    assert await redis.zrange(teams, 0, -1) == [tie + "big"]
    assert await redis.get(keys.event_count("wide", "alltime", "all")) == "3"


@pytest.mark.parametrize("batches", [1, 3], ids=["one-batch", "a-batch-each"])
async def test_a_late_event_does_not_make_a_team_sum_reached_earlier(
    settings: LadderSettings, redis: Redis, keys: Keys, batches: int
) -> None:
    """A team's sum is reached when the last event it counts happened: an event that comes late
    adds its value, and the sum keeps the later reach time, however the events are batched."""
    board = Board(board_id="tm", periods=("alltime",))
    start = datetime.now(UTC) - timedelta(seconds=60)
    plays = [("u1", "red", 50, 20), ("u2", "blue", 100, 10), ("u3", "red", 50, 0)]
    for i, (user, team, value, second) in enumerate(plays):
        score = ScoreIn(
            user_id=user,
            region="eu",
            value=value,
            team_id=team,
            occurred_at=start + timedelta(seconds=second),
        )
        await submit(redis, keys, settings, board, score, f"t-{i}")
    entries: list[Any] = await redis.xrange(keys.outbox("tm"))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    size = len(events) // batches
    for at in range(0, len(events), size):
        await derive(redis, keys, board, events[at : at + size], FEED)
    teams = keys.teams_view("tm", "alltime", "all")
    # Blue had 100 at second 10, red at second 20.
    assert await read_view(redis, teams, True) == [("blue", 100), ("red", 100)]
    assert await redis.zrange(teams, 0, 0) == [tie_key(reached_ms(events[0].occurred_at)) + "red"]


async def test_the_write_runs_fewer_redis_commands() -> None:
    """Counted as bench/phases/commands.py counts them, on a redis-server of its own: the write
    on an incr board with teams and four periods ran 89.8 commands with the derived views and
    team boards in it (a count, the same on every run); without them 50.8, and 38.8 without
    the regional distinct-score sets too (a ZADD, a ZCOUNT and a ZREM a period); 39.8 with the
    check of the board's hidden users (one SISMEMBER a write, shared/lua/write.lua). Counted as
    the API sends it, behind its rate limits: 42.8, the two token buckets read in one MGET and
    each taken with one SET (45.8 while each bucket was a hash: HMGET, HSET and PEXPIRE)."""
    board, extra = SHAPES["incr, 4 periods, with teams (like main)"]
    async with private_redis() as redis:
        assert await commands_per_write(redis, board, extra) <= 43.0


async def test_a_batch_longer_than_a_call_goes_in_calls_in_order(
    settings: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler splits a board's batch into calls of ``CHUNK`` events, in order: the feed
    still lists the newest accepted first, and each event counts once."""
    monkeypatch.setattr(derive_module, "CHUNK", 3)
    catalog = BoardCatalog(redis, keys)
    await catalog.put(BOARD)
    events = await accept(redis, keys, settings, 8)
    handler = derive_module.Derive(redis, keys, catalog, FEED)
    await handler(events)
    await handler(events)
    state = await derived(redis, keys, events)
    assert state["feed"] == [f"d-{i}" for i in range(7, -1, -1)]
    assert state["alltime"] == ("8", 5, {"eu", "na"})


async def test_the_feed_keeps_acceptance_order_and_its_length_in_any_delivery_order(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Batches interleaved and late, the feed full: it holds the newest accepted, newest first,
    and a call takes off the top only the entries newer than its batch's oldest."""
    events = await accept(redis, keys, settings, 30)
    short = 12
    for part in (events[20:], events[5:10], events[1:5], events[10:20]):
        await derive(redis, keys, BOARD, part, short)
    feed = [orjson_id(e) for e in await redis.lrange(keys.feed(BOARD.board_id), 0, -1)]
    assert feed == newest_first(events[1:])[:short]
    newest = await redis.lrange(keys.feed(BOARD.board_id), 0, 0)
    assert await derive(redis, keys, BOARD, [events[0]], short) == 1  # older than all: trimmed
    assert await redis.lrange(keys.feed(BOARD.board_id), 0, 0) == newest
    assert await redis.llen(keys.feed(BOARD.board_id)) == short


@pytest.mark.parametrize("one_batch", [True, False], ids=["one-batch", "a-batch-each"])
async def test_a_users_latest_team_is_its_latest_accepted_events(
    settings: LadderSettings, redis: Redis, keys: Keys, one_batch: bool
) -> None:
    """Red accepted, then blue; the events derived blue first (two relays' batches come in no set
    order), in one batch or in two: the user's team is blue, as the MVP view's member team says
    (live.lua contribute), and the time beside it is blue's accepted_at."""
    red, blue = await red_then_blue(redis, keys, settings, "lt")
    board = Board(board_id="lt", periods=("alltime",))
    for part in [[blue, red]] if one_batch else [[blue], [red]]:
        await derive(redis, keys, board, part, FEED)
    assert await user_teams(redis, keys, "lt") == {"u": "blue"}
    stamp = await redis.hget(keys.user_team("lt"), "@u")
    assert stamp == rfc3339(blue.accepted_at)


async def test_a_users_team_of_the_layout_before_gives_way_to_any_event(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A team the layout before kept (the user's field alone, no time beside it) is older than
    any event derived since: the next one replaces it, and the latest of those is kept."""
    red, blue = await red_then_blue(redis, keys, settings, "lb")
    board = Board(board_id="lb", periods=("alltime",))
    await redis.hset(keys.user_team("lb"), "u", "green")
    await derive(redis, keys, board, [blue], FEED)
    assert await user_teams(redis, keys, "lb") == {"u": "blue"}
    await derive(redis, keys, board, [red], FEED)
    assert await user_teams(redis, keys, "lb") == {"u": "blue"}


@pytest.mark.parametrize("red_first", [True, False], ids=["red-first", "blue-first"])
async def test_of_two_teams_accepted_in_one_millisecond_the_greater_is_kept(
    settings: LadderSettings, redis: Redis, keys: Keys, red_first: bool
) -> None:
    """Two events of a user accepted in the same millisecond: the team greater byte by byte is
    kept, in either order of derivation."""
    red, blue = await red_then_blue(redis, keys, settings, "ms")
    red = red.model_copy(update={"accepted_at": blue.accepted_at})
    board = Board(board_id="ms", periods=("alltime",))
    for event in (red, blue) if red_first else (blue, red):
        await derive(redis, keys, board, [event], FEED)
    assert await user_teams(redis, keys, "ms") == {"u": "red"}
