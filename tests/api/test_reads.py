"""The read side of scopes, the ranks call, the feed and stats (docs/api.md sections 2, 5, 6 and 8).

The API runs in-process against real Redis with an unreachable broker, so that nothing but the
requests changes the cache. The global view is the aggregator's; where a test needs it, it marks
the outbox's events dirty and runs one merge itself, as the aggregator would.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from services.aggregator.handlers import MarkDirty
from services.aggregator.merge import Merger
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import MAIN_BOARD, Board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, assert_problem, get_ok
from tests.helpers import SERVER, api_client, derive, derive_outbox, player, snapshot

EVENT_FIELDS = {
    *("event_id", "user_id", "region", "team_id", "value"),
    *("subscore", "metadata", "occurred_at", "accepted_at"),
}


def at(second: int) -> str:
    """A time ``second`` seconds into the last two minutes (all-time ticks are a second)."""
    moment = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=120 - second)
    return moment.isoformat().replace("+00:00", "Z")


async def post(client: httpx.AsyncClient, board: str = "main", **body: Any) -> dict[str, Any]:
    response = await client.post(f"/v1/boards/{board}/scores", json=body, headers=SERVER)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


# The feed's length in the suite's settings (LADDER_FEED_LENGTH's default).
FEED_LENGTH: int = LadderSettings.model_fields["feed_length"].default


async def merge(redis: Redis, keys: Keys, board: Board = MAIN_BOARD) -> None:
    """What the aggregator does with the outbox's events: derive the views kept from them (the
    users' regions, which the merge reads), mark them dirty, then merge once."""
    entries: list[Any] = await redis.xrange(keys.outbox(board.board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    await derive(redis, keys, board, events, FEED_LENGTH)
    await MarkDirty(redis, keys)(events)
    assert await Merger(redis, keys).merge_board(board) > 0


async def befriend(redis: Redis, keys: Keys, *pairs: tuple[str, str]) -> None:
    """Mutual friendships, written as the friends routes keep them."""
    for a, b in pairs:
        await redis.sadd(keys.friends(a), b)
        await redis.sadd(keys.friends(b), a)


def table(entries: list[dict[str, Any]], *names: str) -> list[tuple[Any, ...]]:
    return [tuple(e[n] for n in names) for e in entries]


# --- the teams scope ---------------------------------------------------------------------------


async def test_the_teams_scope_ranks_teams_by_their_members_sum(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", region="eu", value=10, team_id="red-wombats")
        await post(client, user_id="u-2", region="na", value=5, team_id="red-wombats")
        await post(client, user_id="u-3", region="eu", value=12, team_id="blue-herons")
        await post(client, user_id="u-4", region="eu", value=99)  # no team
        # The team boards are the aggregator's: until it derives the events, none shows.
        underived = await get_ok(client, LEADERBOARD, scope="teams")
        assert await derive_outbox(redis, keys, MAIN_BOARD, FEED_LENGTH) == 4
        board = await get_ok(client, LEADERBOARD, scope="teams")
        anonymous = await client.get(LEADERBOARD, params={"scope": "teams", "limit": 1})
        weekly = await get_ok(client, LEADERBOARD, scope="teams", period="weekly", limit=1)
        second = await get_ok(
            client,
            LEADERBOARD,
            scope="teams",
            period="weekly",
            limit=1,
            cursor=weekly["next_cursor"],
            rank_style="dense",
        )

    assert board["entries"] == [
        {"rank": 1, "team_id": "red-wombats", "score": 15, "metadata": None},
        {"rank": 2, "team_id": "blue-herons", "score": 12, "metadata": None},
    ]
    assert (board["scope"], board["total"], board["next_cursor"]) == ("teams", 2, None)
    assert (underived["total"], underived["as_of"]) == (0, None)
    assert board["as_of"] == await redis.hget(keys.as_of("main"), "derived")
    assert board["as_of"] is not None
    assert anonymous.status_code == 200
    assert anonymous.json()["entries"] == [
        {"rank": 1, "team_id": "red-wombats", "score": 15, "metadata": None}
    ]
    assert weekly["entries"] == [
        {"rank": 1, "team_id": "red-wombats", "score": 15, "metadata": None}
    ]
    assert second["entries"] == [
        {"rank": 2, "team_id": "blue-herons", "score": 12, "metadata": None}
    ]
    assert second["next_cursor"] is None


async def test_the_teams_scope_has_ties_in_every_style(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        for i, (team, value) in enumerate([("a", 20), ("b", 10), ("c", 10), ("d", 5)]):
            await post(
                client, user_id=f"u-{i}", region="eu", value=value, team_id=team, occurred_at=at(i)
            )
        await derive_outbox(redis, keys, MAIN_BOARD, FEED_LENGTH)
        read = {
            style: await get_ok(client, LEADERBOARD, scope="teams", rank_style=style)
            for style in ("ordinal", "competition", "dense")
        }

    assert table(read["ordinal"]["entries"], "team_id", "rank") == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
        ("d", 4),
    ]
    assert [e["rank"] for e in read["competition"]["entries"]] == [1, 2, 2, 4]
    assert [e["rank"] for e in read["dense"]["entries"]] == [1, 2, 2, 3]


# --- the friends scope -------------------------------------------------------------------------


@dataclass
class Friends:
    """u-1's friends u-2, u-3 and u-5 (u-5 never scored); u-4 is nobody's friend."""

    scores: dict[str, list[tuple[str, int]]] = field(
        default_factory=lambda: {
            "u-1": [("eu", 30), ("na", 10)],  # global 40
            "u-2": [("eu", 50)],
            "u-3": [("na", 40)],  # global 40, reached after u-1
            "u-4": [("eu", 45)],
        }
    )

    async def seed(self, client: httpx.AsyncClient, redis: Redis, keys: Keys) -> None:
        second = 0
        for user, parts in self.scores.items():
            for region, value in parts:
                await post(
                    client,
                    user_id=user,
                    region=region,
                    value=value,
                    display_name=f"Name {user}",
                    occurred_at=at(second),
                )
                second += 1
        await befriend(redis, keys, ("u-1", "u-2"), ("u-1", "u-3"), ("u-1", "u-5"))
        await merge(redis, keys)


async def test_a_standing_says_as_of_as_the_leaderboard_of_its_scope_does(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The global and friends scopes trail the regions by the merge: a standing there says when
    the view was last merged, as the page does; a region's, which the write keeps, is as of the
    read."""
    async with api_client(quiet) as client:
        await Friends().seed(client, redis, keys)
        merged = await redis.hget(keys.as_of("main"), "alltime:all")
        before = datetime.now(UTC).replace(microsecond=0)
        answers = {
            scope: await get_ok(client, "/v1/boards/main/users/u-1", headers=SERVER, scope=scope)
            for scope in ("global", "friends:u-1", "region:eu")
        }
        page = await get_ok(client, LEADERBOARD, scope="global")
    assert merged is not None
    assert answers["global"]["as_of"] == answers["friends:u-1"]["as_of"] == merged
    assert page["as_of"] == merged
    assert datetime.fromisoformat(answers["region:eu"]["as_of"]) >= before


async def test_the_friends_scope_ranks_a_player_among_its_friends_on_the_global_view(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await Friends().seed(client, redis, keys)
        own = await get_ok(client, LEADERBOARD, headers=player("u-1"), scope="friends:u-1")
        served = await get_ok(client, LEADERBOARD, scope="friends:u-1", rank_style="competition")
        mutual = await get_ok(client, LEADERBOARD, headers=player("u-2"), scope="friends:u-2")
        alone = await get_ok(client, LEADERBOARD, headers=player("u-4"), scope="friends:u-4")
        stranger = await client.get(
            LEADERBOARD, params={"scope": "friends:u-1"}, headers=player("u-4")
        )
        anonymous = await client.get(LEADERBOARD, params={"scope": "friends:u-1"})
        as_of = await redis.hget(keys.as_of("main"), "alltime:all")

    assert own["entries"] == [
        {"rank": 1, "user_id": "u-2", "score": 50, "display_name": "Name u-2", "metadata": None},
        {"rank": 2, "user_id": "u-1", "score": 40, "display_name": "Name u-1", "metadata": None},
        {"rank": 3, "user_id": "u-3", "score": 40, "display_name": "Name u-3", "metadata": None},
    ]
    assert (own["scope"], own["total"], own["next_cursor"]) == ("friends:u-1", 3, None)
    assert own["as_of"] == as_of
    assert table(served["entries"], "user_id", "rank") == [("u-2", 1), ("u-1", 2), ("u-3", 2)]
    # Friendship is mutual: u-2 sees u-1 (and not u-1's other friends).
    assert table(mutual["entries"], "user_id", "score") == [("u-2", 50), ("u-1", 40)]
    assert table(alone["entries"], "user_id", "rank") == [("u-4", 1)]
    assert_problem(stranger, 403)
    assert_problem(anonymous, 401)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/boards/nope/leaderboard?scope=friends:u-1",
        "/v1/boards/main/leaderboard?scope=friends:u-1&limit=0",
        "/v1/boards/nope/users/bad!?scope=friends:u-1",
        "/v1/boards/main/leaderboard?scope=friends%3Abad!",
        "/v1/boards/nope/leaderboard?scope=%66riends:u-1",
        "/v1/boards/main/leaderboard?scope=%66riends%3Au-1&limit=0",
    ],
)
async def test_a_friends_scope_judges_the_credential_before_the_board_and_query(
    quiet: LadderSettings, path: str
) -> None:
    """docs/api.md section 1: a friends scope is its player's (or a key's), which is told
    without the board or the body, so its 401 and 403 come before a 404 or a 422."""
    async with api_client(quiet) as client:
        anonymous = await client.get(path)
        other = await client.get(path, headers=player("u-2"))
        key = await client.get(path, headers=SERVER)
    assert_problem(anonymous, 401)
    assert_problem(other, 403)
    assert key.status_code in (404, 422), key.text


@pytest.mark.parametrize("written", ["5.0", "1_0", "+5", " 5", "5 ", "0x5", "1e1", "\u0665"])
async def test_a_query_s_integers_are_written_in_digits(
    quiet: LadderSettings, written: str
) -> None:
    """As a body's integers are JSON's: pydantic read 5.0, 1_0 (ten) and +5 as integers."""
    reads = [
        ("/v1/boards/main/leaderboard", "limit"),
        ("/v1/boards/main/users/u-1", "around"),
        ("/v1/boards/main/hot", "window"),
        ("/v1/boards/main/users/u-1/events", "limit"),
        ("/v1/boards/main/feed", "limit"),
    ]
    async with api_client(quiet) as client:
        for path, name in reads:
            response = await client.get(path, params={name: written}, headers=SERVER)
            problem = assert_problem(response, 422)
            assert [e["loc"] for e in problem["errors"]] == [["query", name]], problem
        # Digits are an integer as before.
        page = await client.get("/v1/boards/main/leaderboard", params={"limit": "5"})
        assert page.status_code == 200, page.text


async def test_the_friends_scope_pages_and_answers_standings(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await Friends().seed(client, redis, keys)
        first = await get_ok(client, LEADERBOARD, scope="friends:u-1", limit=2, rank_style="dense")
        second = await get_ok(
            client,
            LEADERBOARD,
            scope="friends:u-1",
            limit=2,
            rank_style="dense",
            cursor=first["next_cursor"],
        )
        standing = await get_ok(
            client,
            "/v1/boards/main/users/u-3",
            headers=player("u-1"),
            scope="friends:u-1",
            around=1,
            rank_style="competition",
        )
        outsider = await client.get(
            "/v1/boards/main/users/u-4", params={"scope": "friends:u-1"}, headers=SERVER
        )

    assert table(first["entries"], "user_id", "rank") == [("u-2", 1), ("u-1", 2)]
    assert first["next_cursor"] is not None
    assert table(second["entries"], "user_id", "rank", "score") == [("u-3", 2, 40)]
    assert second["next_cursor"] is None
    assert (standing["rank"], standing["score"], standing["total"]) == (2, 40, 3)
    assert standing["percentile"] == pytest.approx(33.33)
    assert table(standing["around"], "user_id", "rank") == [("u-1", 2), ("u-3", 2)]
    assert_problem(outsider, 404)


# --- the ranks call ----------------------------------------------------------------------------


async def test_the_ranks_call_answers_every_period_and_scope(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        answer = await post(
            client, user_id="u-1", region="eu", value=30, team_id="red", occurred_at=at(0)
        )
        await post(client, user_id="u-1", region="na", value=10, team_id="red", occurred_at=at(1))
        await post(client, user_id="u-2", region="eu", value=50, team_id="red", occurred_at=at(2))
        await post(client, user_id="u-3", region="eu", value=30, team_id="blue", occurred_at=at(3))
        await post(client, user_id="u-4", region="na", value=60, team_id="blue", occurred_at=at(4))
        await befriend(redis, keys, ("u-1", "u-2"))
        await merge(redis, keys)
        # The periods the scores went to, even if a day ended while the test ran.
        ids = [p["period_id"] for p in answer["periods"].values()]
        own = await get_ok(
            client, "/v1/boards/main/users/u-1/ranks", headers=player("u-1"), period_id=ids
        )
        public = await client.get("/v1/boards/main/users/u-1/ranks", params={"period_id": ids})
        tied = await get_ok(
            client, "/v1/boards/main/users/u-3/ranks", period_id=ids, rank_style="competition"
        )

    scopes = {
        "global": {"rank": 3, "score": 40, "total": 4},
        "region:eu": {"rank": 2, "score": 30, "total": 3},
        "region:na": {"rank": 2, "score": 10, "total": 2},
        "teams": {"team_id": "red", "rank": 1, "score": 90, "total": 2},
        "friends": {"rank": 2, "score": 40, "total": 2},
    }
    assert own == {
        "board_id": "main",
        "user_id": "u-1",
        "rank_style": "ordinal",
        "periods": {
            period: {"period_id": answer["periods"][period]["period_id"], "scopes": scopes}
            for period in ("daily", "weekly", "monthly", "alltime")
        },
        # When the aggregator (here merge()'s derive step) last applied the board's events.
        "as_of": await redis.hget(keys.as_of("main"), "derived"),
    }
    assert own["as_of"] is not None
    assert list(own["periods"]["weekly"]["scopes"]) == list(scopes)
    # Without the player's token, its friends stay private.
    assert public.status_code == 200
    assert public.json()["periods"]["alltime"]["scopes"] == {
        k: v for k, v in scopes.items() if k != "friends"
    }
    # u-3 ties u-1's 30 in eu, and blue ties red's 90, each reached later: competition shares
    # the rank (and u-3, read with a server key, has no friends to show).
    assert tied["rank_style"] == "competition"
    assert tied["periods"]["daily"]["scopes"] == {
        "global": {"rank": 4, "score": 30, "total": 4},
        "region:eu": {"rank": 2, "score": 30, "total": 3},
        "teams": {"team_id": "blue", "rank": 1, "score": 90, "total": 2},
    }


async def test_the_ranks_call_reads_a_past_period_and_404s_a_stranger(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", region="eu", value=7)
        # The user's regions are the aggregator's: derived from the event, as it would.
        assert await derive_outbox(redis, keys, MAIN_BOARD, FEED_LENGTH) == 1
        past = await get_ok(client, "/v1/boards/main/users/u-1/ranks", period_id=yesterday)
        nobody = await client.get("/v1/boards/main/users/u-9/ranks")

    assert past["periods"]["daily"] == {"period_id": yesterday, "scopes": {}}
    assert past["periods"]["alltime"]["scopes"] == {
        "region:eu": {"rank": 1, "score": 7, "total": 1}
    }
    assert list(past["periods"]) == ["daily", "weekly", "monthly", "alltime"]
    assert_problem(nobody, 404)


# --- the feed ----------------------------------------------------------------------------------


async def test_the_feed_is_newest_first_and_bounded(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    settings = quiet.model_copy(update={"feed_length": 5})
    async with api_client(settings) as client:
        empty = await get_ok(client, "/v1/boards/main/feed")
        # Each time taken once: at() read again later may fall in the next second.
        times = {i: at(i) for i in range(1, 9)}
        for i in range(1, 9):
            await post(
                client,
                event_id=f"e-{i}",
                user_id=f"u-{i % 3}",
                region="eu",
                value=i,
                team_id="red" if i % 2 else None,
                display_name="Ana",
                occurred_at=times[i],
            )
        # The feed is the aggregator's, one batch at a time: until it applies the events, the
        # feed holds none of them.
        before = await get_ok(client, "/v1/boards/main/feed")
        started = datetime.now(UTC)
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
        assert await derive(redis, keys, MAIN_BOARD, events[:3], 5) == 3
        assert await derive(redis, keys, MAIN_BOARD, events[3:], 5) == 5
        whole = await client.get("/v1/boards/main/feed")
        two = await get_ok(client, "/v1/boards/main/feed", limit=2)
        five = await get_ok(client, "/v1/boards/main/feed", limit=5)
        too_many = await client.get("/v1/boards/main/feed", params={"limit": 6})

    assert empty == {"events": [], "as_of": None}
    assert before == {"events": [], "as_of": None}
    assert whole.status_code == 200  # public
    assert datetime.fromisoformat(whole.json()["as_of"]) >= started.replace(microsecond=0)
    events = whole.json()["events"]
    assert [e["event_id"] for e in events] == ["e-8", "e-7", "e-6", "e-5", "e-4"]
    assert five["events"] == events
    assert [e["event_id"] for e in two["events"]] == ["e-8", "e-7"]
    assert all(e.keys() == EVENT_FIELDS for e in events)
    assert events[0] | {"accepted_at": None} == {
        "event_id": "e-8",
        "user_id": "u-2",
        "region": "eu",
        "team_id": None,
        "value": 8,
        "subscore": None,
        "metadata": None,
        "occurred_at": times[8].replace("Z", ".000Z"),
        "accepted_at": None,
    }
    assert events[1]["team_id"] == "red"
    assert datetime.fromisoformat(events[0]["accepted_at"]) >= datetime.fromisoformat(
        events[1]["accepted_at"]
    )
    assert_problem(too_many, 422)


async def test_a_feed_longer_than_a_thousand_is_read_to_its_length(
    quiet: LadderSettings, redis: Redis
) -> None:
    # The bound of limit is the configured feed length, whatever it is.
    settings = quiet.model_copy(update={"feed_length": 2000})
    async with api_client(settings) as client:
        whole = await client.get("/v1/boards/main/feed", params={"limit": 2000})
        past = await client.get("/v1/boards/main/feed", params={"limit": 2001})
        document = (await client.get("/openapi.json")).json()

    feed = document["paths"]["/v1/boards/{board_id}/feed"]["get"]["parameters"]
    (schema,) = [p["schema"] for p in feed if p["name"] == "limit"]
    assert schema["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 2000}
    # The default, 20, is the document's too (it was only in the description).
    assert schema["default"] == 20
    assert whole.status_code == 200
    assert whole.json()["events"] == []
    assert_problem(past, 422)


# --- stats -------------------------------------------------------------------------------------


async def test_stats_count_distinct_players_closely_and_events_exactly(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    users, repeats = 3000, 500
    board = MAIN_BOARD

    async def write(n: int, user: int) -> None:
        score = ScoreIn(user_id=f"p-{user}", region=("eu", "na")[user % 2], value=1)
        await submit(redis, keys, quiet, board, score, f"s-{n}")

    work = [(n, n) for n in range(users)] + [(users + n, n) for n in range(repeats)]
    for start in range(0, len(work), 50):
        await asyncio.gather(*(write(n, user) for n, user in work[start : start + 50]))
    # The counts are the aggregator's: applied in batches of the stream, a batch redelivered
    # (the second call) counting nothing again.
    entries: list[Any] = await redis.xrange(keys.outbox("main"))
    accepted = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    for start in range(0, len(accepted), 500):
        assert await derive(redis, keys, board, accepted[start : start + 500], FEED_LENGTH) > 0
    assert await derive(redis, keys, board, accepted[:500], FEED_LENGTH) == 0
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    async with api_client(quiet) as client:
        alltime = await client.get("/v1/boards/main/stats")
        past = await get_ok(client, "/v1/boards/main/stats", period="daily", period_id=yesterday)

    assert alltime.status_code == 200  # public
    body = alltime.json()
    assert (body["board_id"], body["period"], body["period_id"]) == ("main", "alltime", "all")
    assert body["events"] == users + repeats
    assert abs(body["players"] - users) <= 0.02 * users, body
    assert past == {
        "board_id": "main",
        "period": "daily",
        "period_id": yesterday,
        "players": 0,
        "events": 0,
        "as_of": body["as_of"],
    }
    assert body["as_of"] is not None


# --- every error is a problem and changes nothing ----------------------------------------------


async def best_board(redis: Redis, keys: Keys) -> None:
    await redis.hset(keys.boards, "best", Board(board_id="best", operator="best").model_dump_json())


async def alltime_board(redis: Redis, keys: Keys) -> None:
    board = Board(board_id="forever", periods=("alltime",))
    await redis.hset(keys.boards, "forever", board.model_dump_json())


async def tokyo_board(redis: Redis, keys: Keys) -> None:
    board = Board(board_id="tokyo", timezone="Asia/Tokyo")
    await redis.hset(keys.boards, "tokyo", board.model_dump_json())


def read(path: str, headers: dict[str, str] | None = None, **params: Any) -> dict[str, Any]:
    return {"path": path, "params": params, "headers": SERVER if headers is None else headers}


RANKS = "/v1/boards/main/users/u-seed/ranks"
# A board east of UTC: its 1 January of year 1 begins in year 0 in UTC.
TOKYO = "/v1/boards/tokyo/leaderboard"
ERRORS = [
    pytest.param(401, read(LEADERBOARD, {}, scope="friends:u-seed"), id="401-friends-anonymous"),
    pytest.param(
        403, read(LEADERBOARD, player("u-2"), scope="friends:u-seed"), id="403-friends-stranger"
    ),
    pytest.param(
        403,
        read("/v1/boards/main/users/u-seed", player("u-2"), scope="friends:u-seed"),
        id="403-friends-standing-stranger",
    ),
    pytest.param(404, read("/v1/boards/nope/feed"), id="404-feed-unknown-board"),
    pytest.param(404, read("/v1/boards/nope/stats"), id="404-stats-unknown-board"),
    pytest.param(404, read("/v1/boards/main/users/u-nobody/ranks"), id="404-ranks-unknown-user"),
    pytest.param(
        404,
        read("/v1/boards/main/stats", period="daily", period_id="2020-01-01"),
        id="404-stats-past-retention",
    ),
    pytest.param(
        404, read("/v1/boards/forever/stats", period="weekly"), id="404-stats-period-not-kept"
    ),
    pytest.param(
        404,
        read("/v1/boards/forever/users/u-seed/ranks", period_id="2026-W01"),
        id="404-ranks-period-not-kept",
    ),
    pytest.param(404, read(RANKS, period_id="2099-01-01"), id="404-ranks-period-not-begun"),
    pytest.param(422, read(LEADERBOARD, rank_style="olympic"), id="422-bad-rank-style"),
    pytest.param(
        422, read("/v1/boards/main/users/u-seed", rank_style="x"), id="422-standing-bad-style"
    ),
    pytest.param(422, read(RANKS, rank_style="DENSE"), id="422-ranks-bad-style"),
    pytest.param(422, read(LEADERBOARD, scope="friends:"), id="422-friends-without-user"),
    pytest.param(422, read(LEADERBOARD, scope="friends:-bad"), id="422-friends-bad-user"),
    pytest.param(422, read(LEADERBOARD, scope="teams:red"), id="422-teams-with-a-name"),
    pytest.param(
        422, read("/v1/boards/best/leaderboard", scope="teams"), id="422-teams-on-a-best-board"
    ),
    pytest.param(422, read("/v1/boards/main/users/u-seed", scope="teams"), id="422-teams-standing"),
    pytest.param(
        422, read(LEADERBOARD, scope="friends:u-seed", cursor="zz"), id="422-friends-bad-cursor"
    ),
    pytest.param(422, read("/v1/boards/main/feed", limit=0), id="422-feed-limit-0"),
    pytest.param(422, read("/v1/boards/main/feed", limit=1001), id="422-feed-limit-1001"),
    pytest.param(422, read("/v1/boards/main/feed", limit="ten"), id="422-feed-limit-not-int"),
    pytest.param(422, read("/v1/boards/main/stats", period="hourly"), id="422-stats-bad-period"),
    pytest.param(
        422,
        read("/v1/boards/main/stats", period="daily", period_id="2026-13-45"),
        id="422-stats-bad-period-id",
    ),
    pytest.param(
        422,
        read("/v1/boards/main/stats", period="daily", period_id="2026-W48"),
        id="422-stats-period-id-of-another-period",
    ),
    pytest.param(422, read(RANKS, period_id="someday"), id="422-ranks-bad-period-id"),
    pytest.param(422, read(RANKS, period_id="2026-13"), id="422-ranks-no-such-month"),
    pytest.param(
        422,
        read(
            RANKS,
            period_id=[(datetime.now(UTC) - timedelta(days=d)).date().isoformat() for d in (1, 2)],
        ),
        id="422-ranks-two-daily-ids",
    ),
    pytest.param(422, read(RANKS, period_id=["all"] * 6), id="422-ranks-too-many-ids"),
    # Periods that end past the last instant of year 9999 are periods not yet begun, and one
    # that begins before year 1 in UTC one past retention: 404, as any other.
    pytest.param(
        404,
        read(LEADERBOARD, period="daily", period_id="9999-12-31"),
        id="404-a-day-past-the-calendar",
    ),
    pytest.param(
        404,
        read("/v1/boards/main/users/u-seed", period="daily", period_id="9999-12-31"),
        id="404-standing-a-day-past-the-calendar",
    ),
    pytest.param(
        404,
        read(LEADERBOARD, period="weekly", period_id="9999-W52"),
        id="404-a-week-past-the-calendar",
    ),
    pytest.param(
        404,
        read("/v1/boards/main/stats", period="weekly", period_id="9999-W52"),
        id="404-stats-a-week-past-the-calendar",
    ),
    pytest.param(
        404,
        read("/v1/boards/main/users/u-seed", period="monthly", period_id="9999-12"),
        id="404-standing-a-month-past-the-calendar",
    ),
    pytest.param(404, read(RANKS, period_id="9999-12"), id="404-a-month-past-the-calendar"),
    pytest.param(
        404,
        read(TOKYO, period="daily", period_id="0001-01-01"),
        id="404-a-day-before-the-calendar",
    ),
    pytest.param(
        404,
        read(TOKYO.replace("leaderboard", "users/u-seed"), period="daily", period_id="0001-01-01"),
        id="404-standing-a-day-before-the-calendar",
    ),
    pytest.param(
        422,
        read(LEADERBOARD, period="weekly", period_id="2027-W53"),
        id="422-a-week-2027-does-not-have",
    ),
    pytest.param(
        422,
        read("/v1/boards/main/users/u-seed", period="weekly", period_id="2027-W53"),
        id="422-standing-a-week-2027-does-not-have",
    ),
    # Digits of another script: int() reads them, but no period id is written with them.
    pytest.param(
        422,
        read("/v1/boards/main/stats", period="weekly", period_id="2026-W\uff15\uff13"),
        id="422-a-week-in-fullwidth-digits",
    ),
    pytest.param(
        422,
        read("/v1/boards/main/stats", period="monthly", period_id="2026-\u0660\u0663"),
        id="422-a-month-in-arabic-indic-digits",
    ),
]


@pytest.mark.parametrize(("status", "request_"), ERRORS)
async def test_an_error_is_a_problem_and_changes_nothing(
    status: int, request_: dict[str, Any], quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    await best_board(redis, keys)
    await alltime_board(redis, keys)
    await tokyo_board(redis, keys)
    async with api_client(quiet) as client:
        await post(client, user_id="u-seed", region="eu", value=5, team_id="red")
        await post(client, board="forever", user_id="u-seed", region="eu", value=5)
        await post(client, board="tokyo", user_id="u-seed", region="eu", value=5)
        await befriend(redis, keys, ("u-seed", "u-1"))
        before = await snapshot(redis, quiet.key_prefix)
        response = await client.get(
            request_["path"], params=request_["params"], headers=request_["headers"]
        )
        after = await snapshot(redis, quiet.key_prefix)

    assert_problem(response, status)
    assert before and after == before


async def test_the_new_reads_are_in_the_openapi_document(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        document = (await client.get("/openapi.json")).json()

    paths = document["paths"]
    for path in (
        "/v1/boards/{board_id}/feed",
        "/v1/boards/{board_id}/stats",
        "/v1/boards/{board_id}/users/{user_id}/ranks",
    ):
        assert "200" in paths[path]["get"]["responses"], path
    parameters = {
        p["name"]: p for p in paths["/v1/boards/{board_id}/leaderboard"]["get"]["parameters"]
    }
    assert parameters["rank_style"]["schema"]["enum"] == ["ordinal", "competition", "dense"]
    assert "pattern" in parameters["scope"]["schema"]
    schemas = document["components"]["schemas"]
    assert {"TeamEntry", "RanksOut", "FeedOut", "StatsOut"} <= schemas.keys()
    assert orjson.dumps(schemas["TeamEntry"]).find(b"user_id") == -1
