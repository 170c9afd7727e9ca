"""Erase a user and delete a board, the API's part (docs/api.md section 8b): who may, what is
refused and changes nothing, the tombstone that names nobody, and the worker's erasure of the
cache and the history database (the consumers' part is tests/e2e/test_erasure.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from services.history.handlers import HistoryHandler
from shared.db import (
    board_epoch_of,
    count_events,
    erasures,
    hidden_users,
    open_engine,
    score_events,
    user_events,
)
from shared.db_boards import save_snapshots, snapshot_at
from shared.erasure import (
    StoredTombstones,
    Tombstones,
    board_deletion_of,
    erasure_of,
    finish_board_deletion,
    record_board_deletion,
    request_erasure,
    user_hash,
)
from shared.keys import Keys
from shared.ranking import tie_key
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem, done, post, score
from tests.helpers import (
    ADMIN,
    SERVER,
    T0,
    accepted_event,
    api_client,
    eventually,
    player,
    snapshot,
)

BOARD = "arena"


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database."""
    return quiet


async def test_only_an_admin_key_erases_or_deletes_and_refusals_change_nothing(
    quiet: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        assert (await client.put(f"/v1/boards/{BOARD}", json={}, headers=ADMIN)).status_code == 201
        await post(client, score(user_id="u-1"), board=BOARD)
        before = await snapshot(redis, quiet.key_prefix)
        for method, path in (("DELETE", "/v1/users/u-1"), ("DELETE", f"/v1/boards/{BOARD}")):
            assert_problem(await client.request(method, path), 401)
            assert_problem(await client.request(method, path, headers=SERVER), 403)
            assert_problem(await client.request(method, path, headers=player("u-1")), 403)
        assert_problem(await client.get("/v1/erasures/u-1", headers=SERVER), 403)
        assert_problem(await client.delete("/v1/users/bad%20id", headers=ADMIN), 422)
        assert_problem(await client.delete("/v1/boards/Bad!", headers=ADMIN), 422)
        assert_problem(await client.delete("/v1/boards/nope", headers=ADMIN), 404)
        main = assert_problem(await client.delete("/v1/boards/main", headers=ADMIN), 409)
        assert "main" in main["detail"]
        assert_problem(await client.get("/v1/erasures/u-1", headers=ADMIN), 404)
        assert_problem(await client.get(f"/v1/board-deletions/{BOARD}", headers=ADMIN), 404)
        assert await snapshot(redis, quiet.key_prefix) == before
        async with open_engine(quiet.mysql_url) as engine, engine.connect() as conn:
            assert (await conn.execute(select(erasures))).all() == []


async def test_an_erasure_leaves_a_tombstone_naming_nobody_and_erases_cache_and_history(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    secret = quiet.effective_jwt_secret
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await post(client, score(user_id="u-1", region="eu", value=30, display_name="Ana"))
        await post(client, score(user_id="u-1", region="na", value=4))
        await post(client, score(user_id="u-2", region="eu", value=10))
        assert (await client.put("/v1/users/u-1/friends/u-2", headers=SERVER)).status_code == 204
        # The history database as the history consumer fills it (no consumer runs here).
        await HistoryHandler(engine)([accepted_event("h-1", user_id="u-1")])
        await HistoryHandler(engine)([accepted_event("h-2", user_id="u-2")])
        await save_snapshots(
            engine,
            [
                {
                    "board_id": "main",
                    "scope": "global",
                    "period": "alltime",
                    "period_id": "all",
                    "taken_at": T0,
                    "entries": [
                        {"rank": 1, "user_id": "u-1", "score": 30},
                        {"rank": 2, "user_id": "u-2", "score": 10},
                    ],
                }
            ],
        )

        # The users' regions as the derive step keeps them, and as the layout before did.
        await redis.hset(keys.user_regions("main"), mapping={"u-1": "eu na", "u-2": "eu"})
        await redis.sadd(keys.legacy_user_regions("main", "u-1"), "eu")
        # Each user's latest team, and beside it (field "@<user>") when it was given.
        teams = {"u-1": "red", "@u-1": "2026-01-01T00:00:00.000Z", "u-2": "blue"}
        await redis.hset(keys.user_team("main"), mapping=teams)

        answer = await client.delete("/v1/users/u-1", headers=ADMIN)
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "pending"
        async with engine.connect() as conn:
            pending = (await conn.execute(select(erasures))).one()
        assert pending.user_hash == user_hash("u-1", secret) and pending.user_id == "u-1"
        assert await redis.hexists(keys.erased, user_hash("u-1", secret))

        await eventually(lambda: done(client, "/v1/erasures/u-1"), within=15)

        async with engine.connect() as conn:
            tomb = (await conn.execute(select(erasures))).one()
        assert tomb.user_id is None, "a done tombstone holds the hash alone"
        assert "u-1" not in tomb.user_hash
        for region in ("eu", "na"):
            page = await client.get(
                "/v1/boards/main/leaderboard", params={"scope": f"region:{region}"}
            )
            assert "u-1" not in {e["user_id"] for e in page.json()["entries"]}
        assert [
            e["user_id"]
            for e in (
                await client.get("/v1/boards/main/leaderboard", params={"scope": "region:eu"})
            ).json()["entries"]
        ] == ["u-2"]
        standing = await client.get("/v1/boards/main/users/u-1", params={"scope": "region:eu"})
        assert_problem(standing, 404)
        assert (await client.get("/v1/users/u-2/friends", headers=SERVER)).json()["friends"] == []
        assert not await redis.hexists(keys.names("main"), "u-1")
        assert await redis.hgetall(keys.user_regions("main")) == {"u-2": "eu"}
        assert await redis.hgetall(keys.user_team("main")) == {"u-2": "blue"}
        assert not await redis.exists(keys.legacy_user_regions("main", "u-1"))
        assert await user_events(engine, "main", "u-1", 10, None) == ([], None)
        assert len((await user_events(engine, "main", "u-2", 10, None))[0]) == 1
        shot = await snapshot_at(engine, "main", "global", "alltime", T0)
        assert shot is not None
        assert [e["user_id"] for e in shot["entries"]] == ["u-2"]
        records = [k async for k in redis.scan_iter(match=keys.idempotency_match("u-1"))]
        assert records == []

        # The filters every consumer runs: an event of the user accepted by the cut-off is left
        # out, one accepted after it (a fresh user of the same id) is kept, another user's too.
        old = accepted_event("late", user_id="u-1")
        fresh = accepted_event("fresh", user_id="u-1").model_copy(
            update={"accepted_at": tomb.cutoff.replace(year=tomb.cutoff.year + 1)}
        )
        other = accepted_event("other", user_id="u-2")
        for tombstones in (Tombstones(redis, keys, secret), StoredTombstones(engine, secret)):
            kept, erased = await tombstones.split([old, fresh, other])
            assert [e.event_id for e in kept] == ["fresh", "other"]
            assert [e.event_id for e in erased] == ["late"]


async def test_a_board_deleted_is_404_its_name_refused_until_done_then_fresh(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        assert (await client.put(f"/v1/boards/{BOARD}", json={}, headers=ADMIN)).status_code == 201
        await post(client, score(user_id="u-1", value=7), board=BOARD)
        hide = await client.put(f"/v1/boards/{BOARD}/users/u-2/hidden", headers=ADMIN)
        assert hide.status_code == 204, hide.text
        await HistoryHandler(engine)([accepted_event("m-1", board_id=BOARD, accepted_at=T0)])
        answer = await client.delete(f"/v1/boards/{BOARD}", headers=ADMIN)
        assert answer.status_code == 202, answer.text
        assert answer.headers["location"] == f"/v1/board-deletions/{BOARD}"
        assert_problem(await client.get(f"/v1/boards/{BOARD}"), 404)
        assert_problem(
            await client.post(f"/v1/boards/{BOARD}/scores", json=score(), headers=SERVER), 404
        )
        assert BOARD not in {
            b["board_id"] for b in (await client.get("/v1/boards")).json()["boards"]
        }
        busy = assert_problem(await client.put(f"/v1/boards/{BOARD}", json={}, headers=ADMIN), 409)
        assert "being deleted" in busy["detail"]
        await eventually(lambda: done(client, f"/v1/board-deletions/{BOARD}"), within=20)
        assert [k async for k in redis.scan_iter(match=keys.board_match(BOARD))] == []
        # Its hidden users went with it: a rebuild of the new board would hide them again.
        async with engine.connect() as conn:
            assert (await conn.execute(select(hidden_users))).all() == []

        again = await client.put(f"/v1/boards/{BOARD}", json={"operator": "set"}, headers=ADMIN)
        assert again.status_code == 201, again.text
        page = await client.get(f"/v1/boards/{BOARD}/leaderboard", params={"scope": "region:eu"})
        assert page.json()["entries"] == []
        written = await post(client, score(user_id="u-1", value=3), board=BOARD)
        assert written["periods"]["alltime"]["score"] == 3, "none of the old score"
        # The old board's history stays (no purge), set apart by the deletion: the new board's
        # events may use its event ids, and the history consumer stores them (it took them for
        # redeliveries of the old ones).
        await HistoryHandler(engine)(
            [accepted_event("m-1", board_id=BOARD, value=9, accepted_at=datetime.now(UTC))]
        )
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(score_events.c.value, score_events.c.board_epoch)
                    .where(score_events.c.board_id == BOARD, score_events.c.event_id == "m-1")
                    .order_by(score_events.c.board_epoch)
                )
            ).all()
        assert [r.value for r in rows] == [9, 5] and rows[0].board_epoch == 0 < rows[1].board_epoch
        # The old board's event delivered again lands on the old board's epoch: a duplicate.
        await HistoryHandler(engine)([accepted_event("m-1", board_id=BOARD, accepted_at=T0)])
        assert await count_events(engine, BOARD) == 2


async def test_an_erasure_recorded_while_no_api_runs_is_done_by_the_next_one(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The request is durable: recorded (as the route records it) with no worker running, as
    after a crash right after the 202, it is done by the next API process to start."""
    secret = quiet.effective_jwt_secret
    async with api_client(quiet) as client:
        await post(client, score(user_id="u-9", value=12))
    async with open_engine(quiet.mysql_url) as engine:
        await request_erasure(engine, redis, keys, "u-9", secret)
        assert (await erasure_of(engine, "u-9", secret)) is not None
    async with api_client(quiet) as client:
        await eventually(lambda: done(client, "/v1/erasures/u-9"), within=15)
        page = await client.get("/v1/boards/main/leaderboard", params={"scope": "region:eu"})
        assert page.json()["entries"] == []


async def test_an_erased_user_who_was_hidden_leaves_no_trace_of_the_hide(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A hidden user's entries are in no view, but the board still names it as hidden, in
    MySQL and in Redis: the erasure takes both, and the visible users' dense ranks stay."""
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await post(client, score(user_id="u-1", region="eu", value=30))
        await post(client, score(user_id="u-2", region="eu", value=10))
        hide = await client.put("/v1/boards/main/users/u-1/hidden", headers=ADMIN)
        assert hide.status_code == 204, hide.text
        assert await redis.sismember(keys.hidden("main"), "u-1")

        assert (await client.delete("/v1/users/u-1", headers=ADMIN)).status_code == 202
        await eventually(lambda: done(client, "/v1/erasures/u-1"), within=15)

        assert not await redis.sismember(keys.hidden("main"), "u-1")
        async with engine.connect() as conn:
            rows = (await conn.execute(select(hidden_users))).all()
        assert rows == []
        page = await client.get(
            "/v1/boards/main/leaderboard", params={"scope": "region:eu", "rank_style": "dense"}
        )
        assert [(e["user_id"], e["rank"]) for e in page.json()["entries"]] == [("u-2", 1)]


async def test_an_erasure_reaches_a_season_s_views(quiet: LadderSettings, redis: Redis) -> None:
    """A board with a schedule keeps the period season: the worker works out its windows with
    the board's schedule, and the erasure is done."""
    board = {"operator": "incr", "periods": ["alltime"], "schedule": "0 0 1 * *"}
    async with api_client(quiet) as client:
        assert (
            await client.put("/v1/boards/seasonal", json=board, headers=ADMIN)
        ).status_code == 201
        await post(client, score(user_id="u-1", region="eu", value=5), board="seasonal")
        await post(client, score(user_id="u-2", region="eu", value=3), board="seasonal")
        assert (await client.delete("/v1/users/u-1", headers=ADMIN)).status_code == 202
        await eventually(lambda: done(client, "/v1/erasures/u-1"), within=15)
        for period in ("season", "alltime"):
            page = await client.get(
                "/v1/boards/seasonal/leaderboard", params={"scope": "region:eu", "period": period}
            )
            assert [e["user_id"] for e in page.json()["entries"]] == ["u-2"], period


async def test_an_erasure_reaches_every_season_a_long_retention_keeps(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Minute seasons kept 9,000 times: more periods than one Lua call can pass on at once.
    The erasure is done, and the user leaves a past season's view too."""
    board = {"operator": "incr", "schedule": "* * * * *", "retention": {"season": 9000}}
    async with api_client(quiet) as client:
        answer = await client.put("/v1/boards/long", json=board, headers=ADMIN)
        assert answer.status_code == 201, answer.text
        written = await post(client, score(user_id="u-1", region="eu", value=5), board="long")
        season = written["periods"]["season"]["period_id"]
        assert (await client.delete("/v1/users/u-1", headers=ADMIN)).status_code == 202
        await eventually(lambda: done(client, "/v1/erasures/u-1"), within=30)
        for period, period_id in (("season", season), ("alltime", "all")):
            page = await client.get(
                "/v1/boards/long/leaderboard",
                params={"scope": "region:eu", "period": period, "period_id": period_id},
            )
            assert page.json()["entries"] == [], (period, page.json())


async def test_an_erasure_reaches_teams_the_user_left_and_periods_no_longer_kept(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """What the board's definition and the user's latest team do not name: an MVP team the user
    played for before its latest (its contribution stays in that team's member set), and a
    view of a period kept under a longer retention before."""
    old = keys.region_view("main", "daily", "2020-01-01", "eu")
    tie = tie_key(1_577_836_800_000)
    await redis.zadd(old, {f"{tie}u-1": 7, f"{tie}u-2": 4})
    await redis.hset(Keys.ties(old), mapping={"u-1": f"{tie}|7|", "u-2": f"{tie}|4|"})
    teams = [keys.team_members("main", "alltime", "all", team) for team in ("red", "blue")]
    for key in teams:
        await redis.zincrby(key, 5, "u-1")
        await redis.zincrby(key, 2, "u-2")
    # The tops last pushed of that period's views name the user; its global view is never
    # merged again to push another.
    pushed = [keys.last_top("main", "daily", "2020-01-01", s) for s in ("global", "region:eu")]
    for key in pushed:
        await redis.set(key, '1|[{"rank":1,"user_id":"u-1","score":7,"display_name":"Ana"}]')
    async with api_client(quiet) as client:
        await post(client, score(user_id="u-1", value=3, team_id="blue"))
        assert (await client.delete("/v1/users/u-1", headers=ADMIN)).status_code == 202
        await eventually(lambda: done(client, "/v1/erasures/u-1"), within=15)
    assert await redis.zrange(old, 0, -1) == [f"{tie}u-2"]
    assert await redis.hkeys(Keys.ties(old)) == ["u-2"]
    for key in teams:
        assert await redis.zrange(key, 0, -1) == ["u-2"], key
    assert await redis.exists(*pushed) == 0


async def test_an_erasure_waits_for_a_rebuild_under_way(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A rebuild's staged views, replayed from MySQL before the erasure, would take the live
    ones' place when it finishes: the erasure stays pending while the board's rebuild flag is
    up, then is done; a hide meanwhile answers 503, and is done by its retry."""
    async with api_client(quiet) as client:
        await post(client, score(user_id="u-1", value=7))
        await post(client, score(user_id="u-2", value=5))
        await redis.set(keys.rebuilding("main"), "1")
        hide = await client.put("/v1/boards/main/users/u-2/hidden", headers=ADMIN)
        assert_problem(hide, 503)
        assert hide.headers["retry-after"] == "5"
        assert (await client.delete("/v1/users/u-1", headers=ADMIN)).status_code == 202
        await asyncio.sleep(2)
        assert not await done(client, "/v1/erasures/u-1")
        await redis.delete(keys.rebuilding("main"))
        await eventually(lambda: done(client, "/v1/erasures/u-1"), within=60)
        assert (
            await client.put("/v1/boards/main/users/u-2/hidden", headers=ADMIN)
        ).status_code == 204
        page = await client.get("/v1/boards/main/leaderboard", params={"scope": "region:eu"})
        assert page.json()["entries"] == []


async def test_a_deletion_finishes_over_an_event_stored_twice_meanwhile(
    quiet: LadderSettings,
) -> None:
    """An event stored before its board's deletion was recorded, and delivered again after: the
    second copy went to the deletion's epoch. Setting the first apart would break the unique
    key; the finish keeps one row, on the epoch, and marks the deletion done."""
    async with open_engine(quiet.mysql_url) as engine:
        await HistoryHandler(engine)([accepted_event("m-2", board_id="twice", accepted_at=T0)])
        async with engine.begin() as conn:
            deletion = await record_board_deletion(conn, "twice", purge=False)
        await HistoryHandler(engine)([accepted_event("m-2", board_id="twice", accepted_at=T0)])
        assert await count_events(engine, "twice") == 2
        await finish_board_deletion(engine, deletion)
        async with engine.connect() as conn:
            epochs = (
                await conn.execute(
                    select(score_events.c.board_epoch).where(score_events.c.board_id == "twice")
                )
            ).scalars()
            assert list(epochs) == [board_epoch_of(deletion.cutoff)]
        assert (await board_deletion_of(engine, "twice")).done_at is not None  # type: ignore[union-attr]
