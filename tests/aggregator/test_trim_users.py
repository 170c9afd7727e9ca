"""The users' hashes of a board without ``alltime`` trimmed (services/aggregator/trim.py,
docs/architecture.md "Periods"): the names, regions and teams of users no kept period holds go;
those a period still holds, a write not merged yet, a dirty mark or the hidden set keep theirs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from services.aggregator.merge import Merger
from services.aggregator.trim import TRIMMED, Trimmer, until_stopped
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board, BoardCatalog
from shared.keys import Keys, dirty_member
from shared.lease import Lease
from shared.periods import window_at
from shared.settings import LadderSettings
from tests.helpers import derive_outbox, eventually

WEEKLY = Board(board_id="tourney", periods=("weekly",))


def week() -> str:
    return window_at("weekly", datetime.now(UTC), "UTC", None).period_id


async def play(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    user: str,
    event: str,
    region: str = "eu",
    name: str | None = None,
    board: Board = WEEKLY,
) -> None:
    """A score accepted and derived, not merged."""
    at = datetime.now(UTC) - timedelta(seconds=1)
    body = ScoreIn(
        user_id=user, region=region, value=5, team_id="red", display_name=name, occurred_at=at
    )
    await submit(redis, keys, settings, board, body, event)
    await derive_outbox(redis, keys, board, settings.feed_length)


async def merged(redis: Redis, keys: Keys, board: Board, users: list[str], region: str) -> None:
    marks = [dirty_member("weekly", week(), region, user) for user in users]
    await redis.sadd(keys.dirty(board.board_id), *marks)
    await Merger(redis, keys).merge_board(board)


async def expire_periods(redis: Redis, keys: Keys, board_id: str, period: str = "*") -> None:
    """Every key of the board's periods (of one kind) gone, as their expiry takes them."""
    for kind in ("lb", "regions", "players", "events", "mvp"):
        within = f"{kind}:*" if period == "*" else f"{kind}:{period}:*"
        found = [k async for k in redis.scan_iter(match=keys.board_match(board_id, within))]
        if found:
            await redis.delete(*found)


async def fields(redis: Redis, keys: Keys, board_id: str) -> tuple[set[str], ...]:
    return (
        set(await redis.hkeys(keys.names(board_id))),
        set(await redis.hkeys(keys.user_regions(board_id))),
        set(await redis.hkeys(keys.user_team(board_id))),
    )


def trimmer(redis: Redis, keys: Keys, settings: LadderSettings, **kwargs: Any) -> Trimmer:
    lateness, future = settings.allowed_lateness, settings.future_tolerance_seconds
    return Trimmer(redis, keys, lateness=lateness, future=future, **kwargs)


def counted() -> float:
    return TRIMMED._value.get()


async def test_users_of_expired_periods_leave_all_three_hashes(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    for user in ("a", "b"):
        await play(redis, keys, settings, user, f"e-{user}", name=user.upper())
    await merged(redis, keys, WEEKLY, ["a", "b"], "eu")
    await expire_periods(redis, keys, "tourney")
    assert await fields(redis, keys, "tourney") == ({"a", "b"}, {"a", "b"}, {"a", "@a", "b", "@b"})
    before = counted()

    assert await trimmer(redis, keys, settings).trim_board(WEEKLY) == 8

    assert await fields(redis, keys, "tourney") == (set(), set(), set())
    assert counted() - before == 8
    # A returning player scores into a global entry, a team and a name again; its name from
    # a score that carries one only.
    await play(redis, keys, settings, "a", "e-a2", name="A")
    await play(redis, keys, settings, "b", "e-b2")
    await merged(redis, keys, WEEKLY, ["a", "b"], "eu")
    ties = Keys.ties(keys.global_view("tourney", "weekly", week()))
    assert set(await redis.hkeys(ties)) == {"a", "b"}
    assert await fields(redis, keys, "tourney") == ({"a"}, {"a", "b"}, {"a", "@a", "b", "@b"})


async def test_users_a_kept_period_holds_or_will_hold_are_kept(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    # gone: of an expired period only; kept: merged this week; late: accepted and derived but
    # neither marked nor merged; marked, merging: a dirty mark only; hidden: hidden.
    for user in ("gone", "kept", "marked", "merging", "hidden"):
        await play(redis, keys, settings, user, f"e-{user}", name=user)
    await expire_periods(redis, keys, "tourney")
    await play(redis, keys, settings, "kept", "e-kept2", name="kept")
    await merged(redis, keys, WEEKLY, ["kept"], "eu")
    await play(redis, keys, settings, "late", "e-late", name="late")
    await redis.sadd(keys.dirty("tourney"), dirty_member("weekly", week(), "eu", "marked"))
    await redis.sadd(keys.dirty_merging("tourney"), dirty_member("weekly", week(), "eu", "merging"))
    await redis.sadd(keys.hidden("tourney"), "hidden")

    assert await trimmer(redis, keys, settings).trim_board(WEEKLY) == 4

    users = {"kept", "late", "marked", "merging", "hidden"}
    teams = users | {f"@{u}" for u in users}
    assert await fields(redis, keys, "tourney") == (users, users, teams)


async def test_a_region_new_to_a_period_since_the_read_keeps_its_users(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    await play(redis, keys, settings, "a", "e-a", region="eu", name="A")
    trim = trimmer(redis, keys, settings)
    held = await trim.held(WEEKLY)
    # A write into a region the period had none in, between the read and the call.
    await play(redis, keys, settings, "b", "e-b", region="us", name="B")

    gone, deleted, again = await trim._trim(WEEKLY, [], held, ["a", "b"])

    assert (gone, deleted) == (0, 0)
    assert [h.regions for h in again] != [h.regions for h in held]
    assert (await fields(redis, keys, "tourney"))[0] == {"a", "b"}


async def test_a_board_that_dropped_alltime_keeps_the_users_of_its_all_time_view(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    before = Board(board_id="tourney", periods=("weekly", "alltime"))
    await play(redis, keys, settings, "old", "e-old", name="Old", board=before)
    await redis.sadd(keys.dirty("tourney"), dirty_member("alltime", "all", "eu", "old"))
    await Merger(redis, keys).merge_board(before)
    await play(redis, keys, settings, "gone", "e-gone", name="Gone")
    await expire_periods(redis, keys, "tourney", "weekly")

    assert await trimmer(redis, keys, settings).trim_board(WEEKLY) == 4

    assert await fields(redis, keys, "tourney") == ({"old"}, {"old"}, {"old", "@old"})


async def test_a_board_with_alltime_is_left_alone(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="forever", periods=("weekly", "alltime"))
    await play(redis, keys, settings, "a", "e-a", name="A", board=board)
    await expire_periods(redis, keys, "forever")

    await trimmer(redis, keys, settings).sweep([board])

    assert await fields(redis, keys, "forever") == ({"a"}, {"a"}, {"a", "@a"})


async def test_a_sweep_walks_more_users_than_a_chunk(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    # More fields than a hash keeps in one listpack (hash-max-listpack-entries, 128 by default,
    # 512 where set so), which HSCAN returns whole: these are walked by cursor.
    users = [f"u{n:04}" for n in range(1000)]
    await play(redis, keys, settings, "k", "e-k", name="K")
    await merged(redis, keys, WEEKLY, ["k"], "eu")
    await redis.hset(keys.names("tourney"), mapping={u: u for u in users})
    await redis.hset(keys.user_regions("tourney"), mapping=dict.fromkeys(users, "eu"))
    teams = {f: "red" for u in users for f in (u, f"@{u}")}
    await redis.hset(keys.user_team("tourney"), mapping=teams)
    # Some of the many are in this week's global view.
    global_ties = Keys.ties(keys.global_view("tourney", "weekly", week()))
    await redis.hset(global_ties, mapping={u: "x|1|" for u in users[::10]})
    before = counted()

    trimmed = await trimmer(redis, keys, settings, chunk=7).trim_board(WEEKLY)

    left = {"k", *users[::10]}
    assert trimmed == 900 * 4
    assert counted() - before == 900 * 4
    assert await fields(redis, keys, "tourney") == (left, left, left | {f"@{u}" for u in left})


async def test_the_aggregator_sweeps_every_interval_until_stopped(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(WEEKLY)
    stop = asyncio.Event()
    task = asyncio.create_task(until_stopped(trimmer(redis, keys, settings), catalog, 0.05, stop))
    for n in range(2):  # a sweep, and another one an interval later
        await play(redis, keys, settings, "a", f"e-a{n}", name="A")
        await expire_periods(redis, keys, "tourney")

        async def trimmed() -> bool:
            return await fields(redis, keys, "tourney") == (set(), set(), set())

        await eventually(trimmed)
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_a_board_is_swept_by_the_holder_of_its_trim_lease_alone(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    first, second = (
        trimmer(redis, keys, settings, lease=Lease(redis, keys, ttl=60, kind="trim"))
        for _ in range(2)
    )
    other = Board(board_id="cup", periods=("weekly",))
    for board in (WEEKLY, other):
        await play(redis, keys, settings, "a", f"e-{board.board_id}", name="A", board=board)
        await expire_periods(redis, keys, board.board_id)

    await first.sweep([WEEKLY])
    # The first holds the board's lease: the second leaves it, and takes and sweeps another.
    await play(redis, keys, settings, "b", "e-b", name="B")
    await expire_periods(redis, keys, "tourney")
    await second.sweep([WEEKLY, other])
    assert await fields(redis, keys, "tourney") == ({"b"}, {"b"}, {"b", "@b"})
    assert await fields(redis, keys, "cup") == (set(), set(), set())
    # The holder's next sweep renews its lease and trims; once it gives the lease up, so does
    # the second's.
    await first.sweep([WEEKLY])
    assert await fields(redis, keys, "tourney") == (set(), set(), set())
    await play(redis, keys, settings, "c", "e-c", name="C")
    await expire_periods(redis, keys, "tourney")
    await second.sweep([WEEKLY])
    assert await fields(redis, keys, "tourney") == ({"c"}, {"c"}, {"c", "@c"})
    assert first.lease is not None
    assert await first.lease.release_all() == 1
    await second.sweep([WEEKLY])
    assert await fields(redis, keys, "tourney") == (set(), set(), set())


async def test_a_stopped_sweeper_gives_its_trim_leases_up(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(WEEKLY)
    lease = Lease(redis, keys, ttl=60, kind="trim")
    stop = asyncio.Event()
    sweeping = until_stopped(trimmer(redis, keys, settings, lease=lease), catalog, 0.05, stop)
    task = asyncio.create_task(sweeping)

    async def held() -> bool:
        return await redis.exists(keys.lease("tourney", "trim")) == 1

    await eventually(held)
    assert await redis.pttl(keys.lease("tourney", "trim")) > 50_000
    stop.set()
    await asyncio.wait_for(task, 1)
    assert not await held()


def test_the_trim_interval_is_a_minute_to_a_week(settings: LadderSettings) -> None:
    assert settings.trim_interval == 3600
    for wrong in (59, 7 * 86_400 + 1):
        with pytest.raises(ValidationError):
            settings.model_validate({**settings.model_dump(), "trim_interval": wrong})
