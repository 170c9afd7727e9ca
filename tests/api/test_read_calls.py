"""The leaderboard and standing reads in one Redis round trip each (``ladder_page_v3``,
``ladder_place_v3``), and the cursor's other path inside the page function: the cursor's entry
has moved since the page that handed it out."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection

from services.aggregator.merge import Merger
from services.api.reads import friends
from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.redis import PackedConnection
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, get_ok, post, rfc, score
from tests.api.test_reads import Friends, merge
from tests.helpers import api_client, player

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


class Sends:
    """How many times one read sends to Redis (a pipeline sends once to each node it names):
    sends made in the read's context, that of the client's task that sends it over the ASGI
    transport, and of the tasks it starts (a cluster pipeline sends to its nodes from tasks
    of its own). The app's background tasks (relay, hub) run in contexts of their own."""

    def __init__(self) -> None:
        self.count = 0

    async def of(self, client: httpx.AsyncClient, path: str, **params: Any) -> int:
        """The sends of one read, which must answer 200."""
        token, before = READING.set(self), self.count
        try:
            await get_ok(client, path, **params)
        finally:
            READING.reset(token)
        return self.count - before


READING: contextvars.ContextVar[Sends | None] = contextvars.ContextVar("reading", default=None)


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sends]:
    """Counts the sends of redis-py's connections and of Ladder's (PackedConnection has a send
    of its own, which does not call redis-py's)."""
    sends = Sends()

    def counting(send: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        async def counted(self: Connection, *args: Any, **kwargs: Any) -> None:
            if READING.get() is sends:
                sends.count += 1
            await send(self, *args, **kwargs)

        return counted

    for cls in (Connection, PackedConnection):
        monkeypatch.setattr(cls, "send_packed_command", counting(cls.send_packed_command))
    yield sends


def nodes_of(redis: Redis, *keys: str) -> int:
    """How many nodes hold ``keys``: one on one Redis, the primaries of their slots on a
    cluster."""
    if not isinstance(redis, RedisCluster):
        return 1
    return len({redis.get_node_from_key(key).name for key in keys})


@pytest.mark.parametrize("style", ["ordinal", "competition", "dense"])
async def test_each_read_is_one_round_trip(
    quiet: LadderSettings, redis: Redis, keys: Keys, round_trips: Sends, style: str
) -> None:
    async with api_client(quiet) as client:
        for i in range(1, 8):
            await post(client, score(user_id=f"u-{i}", value=10 * (i % 3), display_name=f"P{i}"))
        first = await get_ok(client, LEADERBOARD, scope="region:eu", limit=3)  # the board cached
        if style == "dense":
            # The region's dense ranks prepared: the first dense read asks for its distinct-score
            # set (two round trips, the walk then the marks), which the aggregator builds.
            await get_ok(client, LEADERBOARD, scope="region:eu", rank_style="dense")
            await Merger(redis, keys).build_dense(MAIN_BOARD)
        counts = {
            "page": await round_trips.of(
                client, LEADERBOARD, scope="region:eu", limit=3, rank_style=style
            ),
            "cursor page": await round_trips.of(
                client,
                LEADERBOARD,
                scope="region:eu",
                limit=3,
                cursor=first["next_cursor"],
                rank_style=style,
            ),
            "teams page": await round_trips.of(
                client, LEADERBOARD, scope="teams", rank_style=style
            ),
            "standing": await round_trips.of(
                client,
                "/v1/boards/main/users/u-4",
                scope="region:eu",
                around=2,
                rank_style=style,
            ),
        }

    assert counts == {"page": 1, "cursor page": 1, "teams page": 1, "standing": 1}


@pytest.mark.parametrize("style", ["ordinal", "dense"])
async def test_a_friends_read_is_two_round_trips(
    quiet: LadderSettings, redis: Redis, keys: Keys, round_trips: Sends, style: str
) -> None:
    """The friend set (a key of the user) with the board's hidden set, then the group's
    records and names and the global view's as_of in one call of the board's keys
    (ladder_friends_v1): two round trips, on the first page, a cursor's page and a standing,
    never one a friend. On a cluster the first is one send to each node of its two keys, made
    at once."""
    async with api_client(quiet) as client:
        await Friends().seed(client, redis, keys)
        own = player("u-1")
        first = await get_ok(client, LEADERBOARD, headers=own, scope="friends:u-1", limit=2)
        counts = {
            "page": await round_trips.of(
                client, LEADERBOARD, headers=own, scope="friends:u-1", limit=2, rank_style=style
            ),
            "cursor page": await round_trips.of(
                client,
                LEADERBOARD,
                headers=own,
                scope="friends:u-1",
                limit=2,
                cursor=first["next_cursor"],
                rank_style=style,
            ),
            "standing": await round_trips.of(
                client,
                "/v1/boards/main/users/u-3",
                headers=own,
                scope="friends:u-1",
                around=1,
                rank_style=style,
            ),
        }
        as_of = await redis.hget(keys.as_of("main"), "alltime:all")

    sends = nodes_of(redis, keys.friends("u-1"), keys.hidden("main")) + 1
    assert counts == {"page": sends, "cursor page": sends, "standing": sends}
    assert first["as_of"] == as_of is not None
    assert [e["user_id"] for e in first["entries"]] == ["u-2", "u-1"]


async def test_a_friends_read_takes_the_first_friends_in_byte_order_past_the_most(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the most friends a read takes (1000; 3 here), the first in byte order are ranked,
    then the owner, whatever the set's own order: upper case before lower, '9' before 'A'."""
    monkeypatch.setattr(friends, "MAX_FRIENDS", 3)
    async with api_client(quiet) as client:
        for user in ("me", "b", "B", "a", "9", "Z"):
            await post(client, score(user_id=user, value=10, display_name=f"N{user}"))
        await redis.sadd(keys.friends("me"), "me", "b", "B", "a", "9", "Z", "nobody")
        await redis.sadd(keys.friends("b"), "me")
        await merge(redis, keys)
        page = await get_ok(client, LEADERBOARD, scope="friends:me", limit=10)
        alone = await get_ok(client, LEADERBOARD, scope="friends:b", limit=10)

    assert sorted(e["user_id"] for e in page["entries"]) == ["9", "B", "Z", "me"]
    assert {e["display_name"] for e in page["entries"]} == {"N9", "NB", "NZ", "Nme"}
    assert page["total"] == 4
    assert sorted(e["user_id"] for e in alone["entries"]) == ["b", "me"]


async def test_a_cursor_whose_entry_moved_goes_on_below_where_it_was(
    quiet: LadderSettings,
) -> None:
    """Six users tie at 100, reached at the same moment (so ordered by id, the greater first);
    the second of them improves after the first page: the next page goes on after where it
    was, with ranks as they are now."""
    at = rfc(datetime.now(UTC) - timedelta(seconds=30))
    async with api_client(quiet) as client:
        for i in range(6):
            await post(client, score(user_id=f"u-{i}", value=100, occurred_at=at))
        first = await get_ok(client, LEADERBOARD, scope="region:eu", limit=2)
        await post(client, score(user_id="u-4", value=100))
        second = await get_ok(
            client, LEADERBOARD, scope="region:eu", limit=2, cursor=first["next_cursor"]
        )
        third = await get_ok(
            client, LEADERBOARD, scope="region:eu", limit=2, cursor=second["next_cursor"]
        )
        styled = await get_ok(
            client,
            LEADERBOARD,
            scope="region:eu",
            limit=2,
            cursor=first["next_cursor"],
            rank_style="competition",
        )

    assert [e["user_id"] for e in first["entries"]] == ["u-5", "u-4"]
    assert [(e["user_id"], e["rank"]) for e in second["entries"]] == [("u-3", 3), ("u-2", 4)]
    assert [(e["user_id"], e["rank"]) for e in third["entries"]] == [("u-1", 5), ("u-0", 6)]
    assert third["next_cursor"] is None
    # Competition: the five still at 100 share rank 2, under u-4's 200.
    assert [(e["user_id"], e["rank"]) for e in styled["entries"]] == [("u-3", 2), ("u-2", 2)]
