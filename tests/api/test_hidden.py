"""Hide and unhide a user on a board (docs/api.md section 8b: a shadow ban), against the real
Redis and MySQL, the aggregator's steps (derive, merge, live views) and history's snapshotter
run in-process as a running aggregator and history run them.

A hidden user is gone from every view (region, global, friends, teams' member lists, around-me,
the feed, hot, MVPs, snapshots taken from then on, top-10 pushes) and everyone else's ranks
close up; its writes are accepted; its own read with its own token still answers; unhiding
brings it all back."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
import websockets
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.aggregator.handlers import MarkDirty
from services.aggregator.live_tracker import LiveViews, RecordLive
from services.aggregator.merge import Merger
from services.aggregator.tops import fingerprint_of
from services.history.snapshotter import Snapshotter, changed_views
from shared import hidden
from shared.boards import MAIN_BOARD, BoardCatalog
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import DEV_SERVER_KEY, LadderSettings
from tests.api.helpers import LEADERBOARD, assert_problem, get_ok, rfc
from tests.helpers import ADMIN, SERVER, api_client, derive, player, serve, until_pong

# Every test on its own migrated database, which the API's quiet settings name.
pytestmark = [
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
    pytest.mark.usefixtures("mysql_database"),
]

FEED_LENGTH: int = LadderSettings.model_fields["feed_length"].default
HIDDEN = "/v1/boards/main/users/{}/hidden"
HOT, MVPS = "/v1/boards/main/hot", "/v1/boards/main/mvps"
# (user, region, team, value): u-a leads, in eu, for team red.
SCORES = [
    ("u-a", "eu", "red", 50),
    ("u-b", "eu", "red", 40),
    ("u-c", "us", "blue", 30),
    ("u-d", "eu", "blue", 20),
]


class Aggregator:
    """What the running aggregator and history do, one pass at a time."""

    def __init__(self, redis: Redis, keys: Keys, db: AsyncEngine) -> None:
        self.redis, self.keys = redis, keys
        self.record_live = RecordLive(redis, keys, BoardCatalog(redis, keys))
        self.live = LiveViews(redis, keys)
        self.snapshotter = Snapshotter(redis, keys, db, size=10)

    async def run(self) -> None:
        """Derive and mark every event of the outbox (each once: a redelivery derives nothing
        twice), merge, record the live views' events and compute them, take the snapshots."""
        entries: list[Any] = await self.redis.xrange(self.keys.outbox(MAIN_BOARD.board_id))
        events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
        await derive(self.redis, self.keys, MAIN_BOARD, events, FEED_LENGTH)
        await MarkDirty(self.redis, self.keys)(events)
        # History's part: each event marks the views it changed for the next snapshot.
        marks = {m for event in events for m in changed_views(event)}
        if marks:
            await self.redis.sadd(self.keys.snapshot_dirty(MAIN_BOARD.board_id), *marks)
        await Merger(self.redis, self.keys).merge_board(MAIN_BOARD)
        await self.record_live(events)
        await self.live.tick_board(MAIN_BOARD)
        await self.snapshotter.take_board(MAIN_BOARD)


async def post_score(
    client: httpx.AsyncClient, user: str, region: str, team: str, value: int
) -> dict[str, Any]:
    body = {
        "user_id": user,
        "region": region,
        "team_id": team,
        "value": value,
        "occurred_at": rfc(datetime.now(UTC)),
    }
    response = await client.post("/v1/boards/main/scores", json=body, headers=SERVER)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def ids_of(client: httpx.AsyncClient, scope: str, **params: Any) -> list[tuple[str, int]]:
    """A leaderboard page as (user, rank) pairs."""
    body = await get_ok(client, LEADERBOARD, scope=scope, period="alltime", **params)
    return [(e["user_id"], e["rank"]) for e in body["entries"]]


async def views(client: httpx.AsyncClient, redis: Redis, keys: Keys) -> dict[str, Any]:
    """Every view a hidden user leaves, as the users it names (in order where ranked)."""
    bid = MAIN_BOARD.board_id
    around = await get_ok(client, "/v1/boards/main/users/u-b", scope="region:eu", around=2)
    friends = await get_ok(
        client, LEADERBOARD, scope="friends:u-b", period="alltime", headers=player("u-b")
    )
    teams = await get_ok(client, LEADERBOARD, scope="teams", period="alltime")
    feed = await get_ok(client, "/v1/boards/main/feed", limit=50)
    hot = await get_ok(client, "/v1/boards/main/hot", window=60)
    mvps = await get_ok(client, "/v1/boards/main/mvps", period="alltime")
    snap = await get_ok(client, "/v1/boards/main/snapshots", scope="global", period="alltime")
    pushed = await redis.get(keys.last_top(bid, "alltime", "all", "global"))
    pushed_eu = await redis.get(keys.last_top(bid, "alltime", "all", "region:eu"))
    return {
        "global": await ids_of(client, "global"),
        "eu": await ids_of(client, "region:eu"),
        "us": await ids_of(client, "region:us"),
        "around": [(e["user_id"], e["rank"]) for e in around["around"]],
        "friends": [(e["user_id"], e["rank"]) for e in friends["entries"]],
        "teams": {e["team_id"]: e["score"] for e in teams["entries"]},
        "feed": {e["user_id"] for e in feed["events"]},
        "hot": {e["user_id"] for e in hot["entries"]},
        "mvps": {e["user_id"] for e in mvps["entries"]},
        "snapshot": [e["user_id"] for e in snap["entries"]],
        "pushed": [e["user_id"] for e in orjson.loads(fingerprint_of(pushed) or "[]")],
        "pushed_eu": [e["user_id"] for e in orjson.loads(fingerprint_of(pushed_eu) or "[]")],
    }


async def own_reads(client: httpx.AsyncClient, user: str) -> tuple[Any, Any]:
    """The user's standing (region eu) and ranks, read with its own player token."""
    standing = await get_ok(
        client, f"/v1/boards/main/users/{user}", scope="region:eu", around=2, headers=player(user)
    )
    ranks = await get_ok(client, f"/v1/boards/main/users/{user}/ranks", headers=player(user))
    return standing, ranks["periods"]["alltime"]["scopes"]


async def test_a_hidden_user_leaves_every_view_its_own_read_answers_and_unhiding_brings_it_back(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    aggregator = Aggregator(redis, keys, db)
    async with api_client(quiet) as client:
        friends = await client.put("/v1/users/u-a/friends/u-b", headers=SERVER)
        assert friends.status_code == 204
        for user, region, team, value in SCORES:
            await post_score(client, user, region, team, value)
        await aggregator.run()
        before = await views(client, redis, keys)
        assert before["global"] == [("u-a", 1), ("u-b", 2), ("u-c", 3), ("u-d", 4)]
        assert before["eu"] == [("u-a", 1), ("u-b", 2), ("u-d", 3)]
        assert before["around"] == [("u-a", 1), ("u-b", 2), ("u-d", 3)]
        assert before["friends"] == [("u-a", 1), ("u-b", 2)]
        assert before["teams"] == {"red": 90, "blue": 50}
        assert {"u-a", "u-b"} <= before["feed"] and "u-a" in before["hot"]
        assert "u-a" in before["mvps"]
        assert before["snapshot"][0] == "u-a" and before["pushed"][0] == "u-a"
        assert before["pushed_eu"][0] == "u-a"

        # Hidden: everyone else's ranks close up, in every view.
        assert (await client.put(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        while_hidden = await views(client, redis, keys)
        assert while_hidden["global"] == [("u-b", 1), ("u-c", 2), ("u-d", 3)]
        assert while_hidden["eu"] == [("u-b", 1), ("u-d", 2)]
        assert while_hidden["us"] == before["us"]
        assert while_hidden["around"] == [("u-b", 1), ("u-d", 2)]
        assert while_hidden["friends"] == [("u-b", 1)]
        # Its contribution stays in its team's total; it is no longer listed as an MVP.
        assert while_hidden["teams"] == {"red": 90, "blue": 50}
        assert "u-a" not in while_hidden["mvps"] and "u-b" in while_hidden["mvps"]
        assert "u-a" not in while_hidden["feed"] and "u-b" in while_hidden["feed"]
        assert "u-a" not in while_hidden["hot"] and "u-b" in while_hidden["hot"]
        # The snapshot taken after the hide, and the tops pushed since, leave it out.
        assert while_hidden["snapshot"] == ["u-b", "u-c", "u-d"]
        assert while_hidden["pushed"] == ["u-b", "u-c", "u-d"]
        assert while_hidden["pushed_eu"] == ["u-b", "u-d"]
        # Others' reads of it: 404, as for a user with no score.
        for headers in (SERVER, player("u-b")):
            # (The ranks read takes no scope: it answers every scope.)
            for path, params in (
                ("/v1/boards/main/users/u-a", {"scope": "global"}),
                ("/v1/boards/main/users/u-a/ranks", {}),
            ):
                response = await client.get(path, params=params, headers=headers)
                assert_problem(response, 404)
        # Its own friends scope too, read with a server key: its friends, not it.
        own_scope = {"scope": "friends:u-a", "period": "alltime"}
        theirs = await get_ok(client, LEADERBOARD, **own_scope)
        assert [e["user_id"] for e in theirs["entries"]] == ["u-b"]
        response = await client.get("/v1/boards/main/users/u-a", params=own_scope, headers=SERVER)
        assert_problem(response, 404)
        mine = await get_ok(client, LEADERBOARD, headers=player("u-a"), **own_scope)
        assert [e["user_id"] for e in mine["entries"]] == ["u-a", "u-b"]
        # Its own read, with its own token, still answers: ranked as if it were shown.
        standing, scopes = await own_reads(client, "u-a")
        assert (standing["rank"], standing["score"]) == (1, 50)
        assert [e["user_id"] for e in standing["around"]] == ["u-a", "u-b", "u-d"]
        assert scopes["global"] == {"rank": 1, "score": 50, "total": 4}
        assert scopes["region:eu"] == {"rank": 1, "score": 50, "total": 3}
        assert scopes["teams"]["score"] == 90

        # Its writes are still accepted, answered as if shown, and stay out of every view.
        answer = await post_score(client, "u-a", "eu", "red", 100)
        assert answer["periods"]["alltime"]["score"] == 150
        assert answer["periods"]["alltime"]["rank"] == 1
        await post_score(client, "u-b", "eu", "red", 5)
        await aggregator.run()
        still = await views(client, redis, keys)
        assert still["global"] == [("u-b", 1), ("u-c", 2), ("u-d", 3)]
        assert still["eu"] == [("u-b", 1), ("u-d", 2)]
        assert still["teams"] == {"red": 195, "blue": 50}
        assert "u-a" not in still["feed"] | still["hot"] | still["mvps"]
        assert "u-a" not in still["pushed"] + still["snapshot"]
        standing, scopes = await own_reads(client, "u-a")
        assert (standing["rank"], standing["score"]) == (1, 150)
        assert scopes["global"] == {"rank": 1, "score": 150, "total": 4}

        # Shown again: every view holds it, with the score it wrote while hidden.
        assert (await client.delete(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        after = await views(client, redis, keys)
        assert after["global"] == [("u-a", 1), ("u-b", 2), ("u-c", 3), ("u-d", 4)]
        assert after["eu"] == [("u-a", 1), ("u-b", 2), ("u-d", 3)]
        assert after["around"] == [("u-a", 1), ("u-b", 2), ("u-d", 3)]
        assert after["friends"] == [("u-a", 1), ("u-b", 2)]
        assert {"u-a", "u-b"} <= after["feed"] and "u-a" in after["hot"]
        assert "u-a" in after["mvps"]
        assert after["snapshot"][0] == "u-a" and after["pushed"][0] == "u-a"
        assert after["pushed_eu"][0] == "u-a"
        body = await get_ok(client, "/v1/boards/main/users/u-a/ranks")
        assert body["periods"]["alltime"]["scopes"]["global"]["score"] == 150


async def test_ranks_close_up_in_every_rank_style_and_period(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """Competition and dense ranks, and each period's views, count the others only."""
    aggregator = Aggregator(redis, keys, db)
    async with api_client(quiet) as client:
        for user, value in (("u-a", 50), ("u-b", 50), ("u-c", 40), ("u-d", 30)):
            await post_score(client, user, "eu", "red", value)
        await aggregator.run()
        assert (await client.put(HIDDEN.format("u-b"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        for style, expected in (
            ("ordinal", [("u-a", 1), ("u-c", 2), ("u-d", 3)]),
            ("competition", [("u-a", 1), ("u-c", 2), ("u-d", 3)]),
            ("dense", [("u-a", 1), ("u-c", 2), ("u-d", 3)]),
        ):
            for scope in ("global", "region:eu"):
                assert await ids_of(client, scope, rank_style=style) == expected, (style, scope)
        for period in MAIN_BOARD.periods:
            body = await get_ok(client, LEADERBOARD, scope="global", period=period)
            assert [e["user_id"] for e in body["entries"]] == ["u-a", "u-c", "u-d"]
            assert body["total"] == 3
        standing = await get_ok(
            client, "/v1/boards/main/users/u-c", scope="global", rank_style="competition"
        )
        assert standing["rank"] == 2
        assert (await client.delete(HIDDEN.format("u-b"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        assert await ids_of(client, "global", rank_style="competition") == [
            ("u-a", 1),
            ("u-b", 1),
            ("u-c", 3),
            ("u-d", 4),
        ]


async def test_a_friends_scope_whose_only_friend_is_hidden_ranks_the_player_alone(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """The ranks read's friends scope closes up as if the hidden friend were not there: the
    player ranked alone, as beside a friend with no score, not a scope gone (which would tell
    the player its friend is hidden). The leaderboard's friends scope says the same."""
    aggregator = Aggregator(redis, keys, db)
    alone = {"rank": 1, "score": 10, "total": 1}
    async with api_client(quiet) as client:
        await post_score(client, "u-a", "eu", "red", 10)
        await post_score(client, "u-b", "eu", "red", 20)
        for a, b in (("u-a", "u-b"), ("u-c", "u-d")):
            answer = await client.put(f"/v1/users/{a}/friends/{b}", headers=SERVER)
            assert answer.status_code == 204, answer.text
        await post_score(client, "u-c", "eu", "red", 10)  # u-d: a friend with no score
        await aggregator.run()
        assert (await client.put(HIDDEN.format("u-b"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        for reader in (player("u-a"), SERVER):
            ranks = await get_ok(client, "/v1/boards/main/users/u-a/ranks", headers=reader)
            for period in MAIN_BOARD.periods:
                assert ranks["periods"][period]["scopes"]["friends"] == alone, (period, reader)
        unscored = await get_ok(client, "/v1/boards/main/users/u-c/ranks", headers=player("u-c"))
        assert unscored["periods"]["alltime"]["scopes"]["friends"] == alone
        page = await get_ok(client, LEADERBOARD, scope="friends:u-a", headers=player("u-a"))
        assert ([e["user_id"] for e in page["entries"]], page["total"]) == (["u-a"], 1)
        # Shown again, the friend is back in the scope.
        assert (await client.delete(HIDDEN.format("u-b"), headers=ADMIN)).status_code == 204
        ranks = await get_ok(client, "/v1/boards/main/users/u-a/ranks", headers=player("u-a"))
        assert ranks["periods"]["alltime"]["scopes"]["friends"] == {
            "rank": 2,
            "score": 10,
            "total": 2,
        }
        # A player with no friends at all has no friends scope.
        await post_score(client, "u-e", "eu", "red", 5)
        await aggregator.run()
        lone = await get_ok(client, "/v1/boards/main/users/u-e/ranks", headers=player("u-e"))
        assert "friends" not in lone["periods"]["alltime"]["scopes"]


async def test_hide_and_unhide_are_idempotent_and_kept_in_mysql(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    db: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with api_client(quiet) as client:
        await post_score(client, "u-a", "eu", "red", 5)
        for _ in range(2):
            assert (await client.put(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
            assert await redis.smembers(keys.hidden("main")) == {"u-a"}
            async with db.connect() as conn:
                assert await hidden.stored(conn, "main") == ["u-a"]
        # A hide of a user hidden already changes no row, and says nothing: its INSERT IGNORE
        # made the driver log MySQL's duplicate-entry warning every time.
        assert await hidden.store(db, "main", "u-a", hidden=True) is False
        assert [r.message for r in caplog.records if r.name.startswith("asyncmy")] == []
        # A user with no score on the board can be hidden too (before its first write).
        response = await client.put(HIDDEN.format("u-new"), headers=ADMIN)
        assert response.status_code == 204 and response.content == b""
        for _ in range(2):
            assert (await client.delete(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
            assert await redis.smembers(keys.hidden("main")) == {"u-new"}
            async with db.connect() as conn:
                assert await hidden.stored(conn, "main") == ["u-new"]


async def test_refusals_change_nothing(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    async with api_client(quiet) as client:
        await post_score(client, "u-a", "eu", "red", 5)
        for method in ("PUT", "DELETE"):
            path = HIDDEN.format("u-a")
            assert_problem(await client.request(method, path), 401)
            for headers in (SERVER, player("u-a"), player("u-b")):
                assert_problem(await client.request(method, path, headers=headers), 403)
            assert_problem(
                await client.request(method, "/v1/boards/nope/users/u-a/hidden", headers=ADMIN),
                404,
            )
            assert_problem(await client.request(method, HIDDEN.format("-bad!"), headers=ADMIN), 422)
            # The credential's refusal comes before the board's 404 and the id's 422.
            assert_problem(await client.request(method, "/v1/boards/nope/users/-bad!/hidden"), 401)
    assert await redis.exists(keys.hidden("main")) == 0
    async with db.connect() as conn:
        assert await hidden.stored(conn, "main") == []


async def test_a_hidden_user_whose_only_view_it_was_comes_back(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """A view whose only entry is hidden has no sorted set; showing the user makes it again,
    expiring with the view's records."""
    aggregator = Aggregator(redis, keys, db)
    async with api_client(quiet) as client:
        await post_score(client, "u-z", "sa", "red", 7)
        await aggregator.run()
        assert (await client.put(HIDDEN.format("u-z"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        assert await ids_of(client, "region:sa") == []
        daily = keys.region_view("main", "daily", datetime.now(UTC).date().isoformat(), "sa")
        assert await redis.exists(daily) == 0
        assert await redis.exists(keys.ties(daily)) == 1
        assert (await client.delete(HIDDEN.format("u-z"), headers=ADMIN)).status_code == 204
        assert await ids_of(client, "region:sa") == [("u-z", 1)]
        assert await redis.ttl(daily) > 0


async def test_a_hidden_users_write_is_answered_as_if_shown_and_pushes_nobody_out(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """Its answer holds the rank it would have had, and its previous rank; its outbox entry
    names nobody pushed out of a bracket (no ``overtaken`` push), though it passed the top."""
    aggregator = Aggregator(redis, keys, db)
    async with api_client(quiet) as client:
        for user, region, team, value in SCORES:
            await post_score(client, user, region, team, value)
        await aggregator.run()
        assert (await client.put(HIDDEN.format("u-d"), headers=ADMIN)).status_code == 204
        answer = await post_score(client, "u-d", "eu", "blue", 1000)
        alltime = answer["periods"]["alltime"]
        assert (alltime["score"], alltime["rank"], alltime["previous_rank"]) == (1020, 1, 3)
        entries: list[Any] = await redis.xrevrange(keys.outbox("main"), count=1)
        entry = orjson.loads(entries[0][1]["e"])
        assert entry["user_id"] == "u-d"
        assert all(p["pushed_out"] == {} for p in entry["periods"].values())
        # A shown user's write that passes the top names whom it pushed out: the hidden
        # user's 1020 is not above it.
        await post_score(client, "u-b", "eu", "red", 1000)
        entries = await redis.xrevrange(keys.outbox("main"), count=1)
        entry = orjson.loads(entries[0][1]["e"])
        assert entry["periods"]["alltime"]["pushed_out"] == {"1": "u-a"}
        await aggregator.run()
        assert await ids_of(client, "region:eu") == [("u-b", 1), ("u-a", 2)]


async def test_a_hidden_user_leaves_a_season_s_views_too(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """A season's period id holds a ``:`` (``2026-12-04T18:00``): its views are found, and left,
    as the others are."""
    board = {"operator": "incr", "periods": ["alltime"], "schedule": "0 0 1 * *"}
    aggregator = Aggregator(redis, keys, db)
    async with api_client(quiet) as client:
        put = await client.put("/v1/boards/seasonal", json=board, headers=ADMIN)
        assert put.status_code == 201, put.text
        for user, value in (("u-a", 50), ("u-b", 40)):
            body = {"user_id": user, "region": "eu", "value": value}
            response = await client.post("/v1/boards/seasonal/scores", json=body, headers=SERVER)
            assert response.status_code == 200, response.text
        hide = await client.put("/v1/boards/seasonal/users/u-a/hidden", headers=ADMIN)
        assert hide.status_code == 204
        await aggregator.run()
        for period in ("season", "alltime"):
            page = await get_ok(
                client, "/v1/boards/seasonal/leaderboard", scope="region:eu", period=period
            )
            assert [(e["user_id"], e["rank"]) for e in page["entries"]] == [("u-b", 1)], period
            assert page["total"] == 1


async def test_a_write_made_while_a_show_puts_members_back_is_answered(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The show takes the user out of the hidden set, then puts its members back view by view:
    a write between the two found a record with no member (a script error, answered 500). It
    puts the member back itself, and the show's pass still restores the distinct scores."""
    board = {"operator": "best", "periods": ["alltime"]}
    async with api_client(quiet) as client:
        assert (await client.put("/v1/boards/bb", json=board, headers=ADMIN)).status_code == 201
        for user, value in (("u-a", 50), ("u-b", 30)):
            body = {"user_id": user, "region": "eu", "value": value}
            assert (await client.post("/v1/boards/bb/scores", json=body, headers=SERVER)).is_success
        hide = await client.put("/v1/boards/bb/users/u-a/hidden", headers=ADMIN)
        assert hide.status_code == 204
        await redis.srem(keys.hidden("bb"), "u-a")  # the show's first step, alone
        body = {"user_id": "u-a", "region": "eu", "value": 40}  # under its best: unchanged
        answer = await client.post("/v1/boards/bb/scores", json=body, headers=SERVER)
        assert answer.status_code == 200, answer.text
        alltime = answer.json()["periods"]["alltime"]
        assert (alltime["score"], alltime["rank"], alltime["previous_rank"]) == (50, 1, 1)
        await hidden.move(redis, keys, "bb", "u-a", show=True)  # the show's second step
        page = await get_ok(
            client, "/v1/boards/bb/leaderboard", scope="region:eu", rank_style="dense"
        )
        assert [(e["user_id"], e["rank"]) for e in page["entries"]] == [("u-a", 1), ("u-b", 2)]


async def test_a_redis_that_lost_its_data_hides_the_user_again_at_the_apis_start(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """MySQL keeps who is hidden: an API that starts on a Redis that lost its data hides them
    again before a write of theirs shows them (security: a lost Redis is no way back in)."""
    async with api_client(quiet) as client:
        assert (await client.put(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
    lost = [key async for key in redis.scan_iter(match=f"*{keys.prefix}*")]
    assert keys.hidden("main") in lost
    await redis.delete(*lost)
    async with api_client(quiet) as client:
        assert await redis.smembers(keys.hidden("main")) == {"u-a"}
        await post_score(client, "u-b", "eu", "red", 10)
        await post_score(client, "u-a", "eu", "red", 50)
        page = await get_ok(client, LEADERBOARD, scope="region:eu", period="alltime")
        assert [e["user_id"] for e in page["entries"]] == ["u-b"]
        mine = await client.get("/v1/boards/main/users/u-a", params={"scope": "region:eu"})
        assert_problem(mine, 404)


def ranked(entries: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["rank"], e["user_id"]) for e in entries]


async def test_the_hot_view_leaves_a_hidden_user_out_from_the_hide_on_not_from_the_next_tick(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """The hot view the aggregator stored before a hide is read without the user, the others'
    ranks closed up as the aggregator's next tick stores them; a show puts it back at that
    tick."""
    aggregator = Aggregator(redis, keys, db)
    async with api_client(quiet) as client:
        for user, value in (("u-a", 50), ("u-b", 10), ("u-c", 5)):
            await post_score(client, user, "eu", "red", value)
        await aggregator.run()
        before = await get_ok(client, HOT, window=60)
        assert ranked(before["entries"]) == [(1, "u-a"), (2, "u-b"), (3, "u-c")]
        assert (await client.put(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
        for window in (10, 60):
            at_once = await get_ok(client, HOT, window=window)
            assert ranked(at_once["entries"]) == [(1, "u-b"), (2, "u-c")], window
        await aggregator.run()
        ticked = await get_ok(client, HOT, window=60)
        assert ticked["entries"] == at_once["entries"]
        assert (await client.delete(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
        await aggregator.run()
        shown = await get_ok(client, HOT, window=60)
        assert shown["entries"] == before["entries"]


async def test_a_new_subscriber_of_the_live_views_is_sent_them_without_a_hidden_user(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine
) -> None:
    """The first message of a subscription to the MVP or hot topic, sent between a hide and the
    aggregator's next tick, leaves the user out as the reads do, and holds what that tick then
    pushes."""
    aggregator = Aggregator(redis, keys, db)
    async with serve(quiet) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        api = url.replace("ws://", "http://").removesuffix("/v1/ws")
        async with httpx.AsyncClient(base_url=api) as client:
            for user, region, team, value in SCORES:
                await post_score(client, user, region, team, value)
            await aggregator.run()
            assert (await client.put(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
            mvps = await get_ok(client, MVPS, period="alltime")
            hot = await get_ok(client, HOT, window=60)
            sent: dict[str, dict[str, Any]] = {}
            for topic in ("leaderboard:main:mvps:alltime", "leaderboard:main:hot:60"):
                await ws.send(json.dumps({"op": "subscribe", "topic": topic}))
                # The subscription's first message is its view's. On a Redis Cluster the tick's
                # push of the other view, published before the hide on another node, may reach
                # the hub's node over the cluster bus only after this subscription: not this one.
                view = topic.split(":")[2]
                [sent[topic]] = [m for m in await until_pong(ws) if m["view"] == view]
            await aggregator.run()
            pushed: dict[str, Any] = {}
            async with asyncio.timeout(5):
                while len(pushed) < 2:
                    message = json.loads(await ws.recv())
                    if message["type"] != "resync":  # on a cluster, at any moment (until_pong)
                        pushed[message["view"]] = message["entries"]
    first_mvps = sent["leaderboard:main:mvps:alltime"]["entries"]
    assert ranked(first_mvps) == [(1, "u-c"), (2, "u-b"), (3, "u-d")]
    assert first_mvps == mvps["entries"] == pushed["mvps"]
    first_hot = sent["leaderboard:main:hot:60"]["entries"]
    assert ranked(first_hot) == [(1, "u-b"), (2, "u-c"), (3, "u-d")]
    assert first_hot == hot["entries"] == pushed["hot"]


async def test_a_show_stored_while_the_start_hides_again_is_not_undone(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine, monkeypatch: Any
) -> None:
    """Another API process shows the user while this one's start puts it back in the set: the
    start reads MySQL again after its adds, so the show stands."""
    async with api_client(quiet) as client:
        await post_score(client, "u-a", "eu", "red", 50)
        await post_score(client, "u-b", "eu", "red", 10)
        assert (await client.put(HIDDEN.format("u-a"), headers=ADMIN)).status_code == 204
        await redis.delete(keys.hidden("main"))  # the set lost
        move = hidden.move
        shown: list[httpx.Response] = []
        calls: list[bool] = []

        async def move_then_show(*args: Any, **kwargs: Any) -> int:
            moved = await move(*args, **kwargs)
            if not calls:  # the show lands between the start's hide and its check
                calls.append(True)
                shown.append(await client.delete(HIDDEN.format("u-a"), headers=ADMIN))
            return moved

        monkeypatch.setattr(hidden, "move", move_then_show)
        assert await hidden.restore(db, redis, keys) == 0
        monkeypatch.undo()
        assert shown[0].status_code == 204
        page = await get_ok(client, LEADERBOARD, scope="region:eu", period="alltime")
        assert [e["user_id"] for e in page["entries"]] == ["u-a", "u-b"]
        assert await redis.smembers(keys.hidden("main")) == set()
