"""Friends (docs/api.md section 6): mutual and idempotent, kept in MySQL, projected into Redis sets
that the API restores at start-up. Players' requests: tests/api/test_friend_requests.py; Redis
converging to MySQL: tests/api/test_friends_reconcile.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared import friendships
from shared.db import open_engine
from shared.friendships import friends_by_user, load_friends
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.helpers import ADMIN, SERVER, api_client, player, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database."""
    return quiet


def path(user_id: str, friend_id: str | None = None) -> str:
    return f"/v1/users/{user_id}/friends" + (f"/{friend_id}" if friend_id else "")


async def befriend(
    client: httpx.AsyncClient, user_id: str, *friend_ids: str, headers: dict[str, str] = SERVER
) -> None:
    """``user_id`` befriends each of ``friend_ids`` in turn; each is 204 with no body."""
    for friend_id in friend_ids:
        response = await client.put(path(user_id, friend_id), headers=headers)
        assert response.status_code == 204, response.text
        assert response.content == b""


async def friends_of(client: httpx.AsyncClient, user_id: str) -> list[str]:
    response = await client.get(path(user_id), headers=SERVER)
    assert response.status_code == 200, response.text
    listed: list[str] = response.json()["friends"]
    return listed


async def friends_lists(client: httpx.AsyncClient, *user_ids: str) -> dict[str, list[str]]:
    return {u: await friends_of(client, u) for u in user_ids}


async def stored(settings: LadderSettings, user_id: str) -> list[str]:
    async with open_engine(settings.mysql_url) as engine:
        return await load_friends(engine, user_id)


async def test_a_friendship_is_mutual_and_idempotent(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await befriend(client, "u-1", "u-2")
        await befriend(client, "u-1", "u-2")
        await befriend(client, "u-2", "u-1")
        await befriend(client, "u-1", "u-0", headers=ADMIN)
        listed = await friends_lists(client, "u-0", "u-1", "u-2", "u-3")

    assert listed == {"u-0": ["u-1"], "u-1": ["u-0", "u-2"], "u-2": ["u-1"], "u-3": []}
    for user_id, friends in listed.items():
        assert await stored(quiet, user_id) == friends
        assert sorted(await redis.smembers(keys.friends(user_id))) == friends


async def test_unfriending_ends_it_both_ways(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await befriend(client, "u-1", "u-2", "u-3")
        first = await client.delete(path("u-2", "u-1"), headers=SERVER)
        again = await client.delete(path("u-1", "u-2"), headers=SERVER)
        never = await client.delete(path("u-1", "u-9"), headers=SERVER)
        listed = await friends_lists(client, "u-1", "u-2", "u-3")

    assert [r.status_code for r in (first, again, never)] == [204, 204, 204]
    assert listed == {"u-1": ["u-3"], "u-2": [], "u-3": ["u-1"]}
    assert await stored(quiet, "u-1") == ["u-3"]
    assert await stored(quiet, "u-2") == []
    assert not await redis.exists(keys.friends("u-2"))


async def test_a_player_manages_only_its_own_friends(quiet: LadderSettings, redis: Redis) -> None:
    async with api_client(quiet) as client:
        asked = await client.put(path("u-1", "u-2"), headers=player("u-1"))
        await befriend(client, "u-2", "u-1", headers=player("u-2"))
        own = await client.get(path("u-1"), headers=player("u-1"))
        removed = await client.delete(path("u-1", "u-2"), headers=player("u-1"))
        await befriend(client, "u-2", "u-3")
        before = await snapshot(redis, quiet.key_prefix)
        refused: dict[int, list[httpx.Response]] = {
            403: [
                await client.put(path("u-2", "u-1"), headers=player("u-1")),
                await client.delete(path("u-2", "u-3"), headers=player("u-1")),
                await client.get(path("u-2"), headers=player("u-1")),
                await client.get(path("u-2", "requests"), headers=player("u-1")),
            ],
            401: [
                await client.put(path("u-2", "u-1")),
                await client.delete(path("u-2", "u-3")),
                await client.get(path("u-2")),
                await client.get(path("u-2", "requests")),
                await client.get(path("u-2"), headers={"Authorization": "Bearer wrong"}),
            ],
        }
        after = await snapshot(redis, quiet.key_prefix)

    assert asked.status_code == 202
    assert own.json() == {"friends": ["u-2"]}
    assert removed.status_code == 204
    for status, responses in refused.items():
        for response in responses:
            assert_problem(response, status)
    assert after == before
    assert await stored(quiet, "u-2") == ["u-3"]


async def test_the_credential_is_judged_before_the_path_s_ids(quiet: LadderSettings) -> None:
    """docs/api.md section 1, "The credential first": a malformed id in the path is a 422 only
    for a caller that may act for the path's user; the others get their 401 or 403 first."""
    async with api_client(quiet) as client:
        answers = {
            401: [
                await client.get(path("bad!")),
                await client.get(path("bad!", "requests")),
                await client.put(path("bad!", "u-2")),
                await client.delete(path("u-1", "bad!")),
            ],
            403: [
                await client.get(path("bad!"), headers=player("u-1")),
                await client.get(path("bad!", "requests"), headers=player("u-1")),
                await client.put(path("u-2", "bad!"), headers=player("u-1")),
                await client.delete(path("u-2", "bad!"), headers=player("u-1")),
                await client.put(path("bad!", "u-2"), headers=player("u-1")),
            ],
            422: [
                await client.get(path("bad!"), headers=SERVER),
                await client.put(path("u-1", "bad!"), headers=player("u-1")),
            ],
        }
    for status, responses in answers.items():
        for response in responses:
            assert_problem(response, status)


@pytest.mark.parametrize(
    ("user_id", "friend_id", "loc"),
    [("u-1", "u-1", "friend_id"), ("u-1", "-bad", "friend_id"), ("u 1", "u-2", "user_id")],
)
async def test_a_bad_friendship_is_422_and_stores_nothing(
    quiet: LadderSettings, redis: Redis, user_id: str, friend_id: str, loc: str
) -> None:
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        response = await client.put(path(user_id, friend_id), headers=SERVER)
        after = await snapshot(redis, quiet.key_prefix)

    problem = assert_problem(response, 422)
    assert any(e["loc"][-1] == loc for e in problem["errors"]), problem
    assert after == before
    assert await stored(quiet, user_id) == []


async def test_a_full_friends_list_refuses_another(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(friendships, "MAX_FRIENDS", 2)
    async with api_client(quiet) as client:
        await befriend(client, "u-1", "u-2", "u-3")
        full = await client.put(path("u-1", "u-4"), headers=SERVER)
        full_other_side = await client.put(path("u-4", "u-1"), headers=SERVER)
        # Already friends: still idempotent.
        await befriend(client, "u-3", "u-1")
        listed = await friends_of(client, "u-1")

    assert_problem(full, 409)
    assert_problem(full_other_side, 409)
    assert listed == ["u-2", "u-3"]
    assert await stored(quiet, "u-4") == []


async def test_friendships_survive_a_restart_that_empties_redis(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await befriend(client, "u-1", "u-2", "u-3")

    await redis.delete(*(keys.friends(u) for u in ("u-1", "u-2", "u-3")))

    async with api_client(quiet) as client:
        listed: dict[str, Any] = await friends_lists(client, "u-1", "u-2", "u-3")

    assert listed == {"u-1": ["u-2", "u-3"], "u-2": ["u-1"], "u-3": ["u-1"]}


async def test_every_friendship_is_read_in_pages_of_whole_users(quiet: LadderSettings) -> None:
    """A user whose friends go on past a page is read whole (alone if it fills the page), so
    that the reconcile never compares a set with half of what MySQL holds."""
    async with api_client(quiet) as client:
        await befriend(client, "u-1", "u-2", "u-3", "u-4")
    async with open_engine(quiet.mysql_url) as engine:
        pages = [page async for page in friends_by_user(engine, page=2)]

    assert pages == [
        {"u-1": {"u-2", "u-3", "u-4"}},
        {"u-2": {"u-1"}},
        {"u-3": {"u-1"}},
        {"u-4": {"u-1"}},
    ]
