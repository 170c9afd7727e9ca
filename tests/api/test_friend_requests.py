"""Friend requests (docs/api.md section 6, docs/security.md "Friend-list stuffing"): a player's PUT
asks, and only both sides asking makes a friendship; server keys befriend at once; requests are
bounded so that a flood of them neither grows without end nor keeps the victim from anything."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select, text

from shared import friendships
from shared.db import friend_requests, open_engine
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.api.test_friends import friends_lists, path, stored
from tests.helpers import SERVER, api_client, player, snapshot


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database."""
    return quiet


async def ask(client: httpx.AsyncClient, user_id: str, friend_id: str) -> int:
    """``user_id``'s player PUT to ``friend_id``; its status (a 2xx has no body)."""
    response = await client.put(path(user_id, friend_id), headers=player(user_id))
    if response.status_code < 300:
        assert response.content == b"", response.text
    return response.status_code


async def requests_of(client: httpx.AsyncClient, user_id: str) -> dict[str, list[str]]:
    response = await client.get(path(user_id, "requests"), headers=player(user_id))
    assert response.status_code == 200, response.text
    listed: dict[str, list[str]] = response.json()
    return listed


async def pending_rows(settings: LadderSettings) -> int:
    async with open_engine(settings.mysql_url) as engine, engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(friend_requests)) or 0)


async def test_a_one_sided_request_makes_no_friendship_until_the_other_side_asks(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        first = await ask(client, "u-1", "u-2")
        again = await ask(client, "u-1", "u-2")
        one_sided = await friends_lists(client, "u-1", "u-2")
        asked = {u: await requests_of(client, u) for u in ("u-1", "u-2")}
        by_server = (await client.get(path("u-2", "requests"), headers=SERVER)).json()
        held = await redis.exists(keys.friends("u-1"), keys.friends("u-2"))

        answer = await ask(client, "u-2", "u-1")
        mutual = await friends_lists(client, "u-1", "u-2")
        after = {u: await requests_of(client, u) for u in ("u-1", "u-2")}
        repeat = await ask(client, "u-1", "u-2")

    assert (first, again) == (202, 202)
    assert one_sided == {"u-1": [], "u-2": []}
    assert asked == {
        "u-1": {"incoming": [], "outgoing": ["u-2"]},
        "u-2": {"incoming": ["u-1"], "outgoing": []},
    }
    assert by_server == asked["u-2"]
    assert held == 0
    # The other side's PUT makes it mutual, everywhere, and settles both requests.
    assert answer == 204
    assert mutual == {"u-1": ["u-2"], "u-2": ["u-1"]}
    assert await stored(quiet, "u-1") == ["u-2"] and await stored(quiet, "u-2") == ["u-1"]
    assert await redis.smembers(keys.friends("u-1")) == {"u-2"}
    assert await redis.smembers(keys.friends("u-2")) == {"u-1"}
    assert after == {u: {"incoming": [], "outgoing": []} for u in ("u-1", "u-2")}
    assert repeat == 204
    assert await pending_rows(quiet) == 0


async def test_a_server_key_makes_a_friendship_at_once_and_settles_requests(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        at_once = await client.put(path("u-2", "u-3"), headers=SERVER)
        asked = await ask(client, "u-1", "u-2")
        settled = await client.put(path("u-2", "u-1"), headers=SERVER)
        listed = await friends_lists(client, "u-1", "u-2", "u-3")
        left = await requests_of(client, "u-2")

    assert (at_once.status_code, asked, settled.status_code) == (204, 202, 204)
    assert listed == {"u-1": ["u-2"], "u-2": ["u-1", "u-3"], "u-3": ["u-2"]}
    assert left == {"incoming": [], "outgoing": []}
    assert await pending_rows(quiet) == 0


async def test_delete_withdraws_and_declines(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        assert await ask(client, "u-1", "u-2") == 202
        assert await ask(client, "u-3", "u-1") == 202
        before = await requests_of(client, "u-1")
        withdrawn = await client.delete(path("u-1", "u-2"), headers=player("u-1"))
        declined = await client.delete(path("u-1", "u-3"), headers=player("u-1"))
        after = {u: await requests_of(client, u) for u in ("u-1", "u-2", "u-3")}
        # A declined request is gone: the decliner's own PUT now asks, it does not accept.
        asks_anew = await ask(client, "u-1", "u-3")
        listed = await friends_lists(client, "u-1", "u-3")

    assert before == {"incoming": ["u-3"], "outgoing": ["u-2"]}
    assert (withdrawn.status_code, declined.status_code) == (204, 204)
    assert after == {u: {"incoming": [], "outgoing": []} for u in ("u-1", "u-2", "u-3")}
    assert asks_anew == 202
    assert listed == {"u-1": [], "u-3": []}


async def test_two_players_asking_each_other_at_once_become_friends_once(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        for n in range(5):
            a, b = f"a-{n}", f"b-{n}"
            statuses = sorted(await asyncio.gather(ask(client, a, b), ask(client, b, a)))
            assert statuses == [202, 204], (n, statuses)
            assert await friends_lists(client, a, b) == {a: [b], b: [a]}
    assert await pending_rows(quiet) == 0


@pytest.mark.timeout(300)
async def test_a_flood_of_requests_neither_grows_nor_blocks_the_victim(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten times MAX_INCOMING fake accounts ask the victim (the cap at 20 here, 100 in
    service): its incoming list keeps the newest MAX_INCOMING, its friends list stays empty,
    and its own adds (asking, accepting, a server key's) all work even with the friend cap at
    2: pending requests never count toward it."""
    monkeypatch.setattr(friendships, "MAX_FRIENDS", 2)
    monkeypatch.setattr(friendships, "MAX_INCOMING", 20)
    fakes = [f"fake-{i:04d}" for i in range(200)]
    async with api_client(quiet) as client:
        # Most of the flood at once, twenty at a time: the victim's list stays at the cap.
        for start in range(0, 180, 20):
            statuses = await asyncio.gather(
                *(ask(client, f, "victim") for f in fakes[start : start + 20])
            )
            assert set(statuses) == {202}
        at_once = len((await requests_of(client, "victim"))["incoming"])
        # The rest in turn, so that which requests are the newest is known.
        for fake in fakes[180:]:
            assert await ask(client, fake, "victim") == 202
        flooded = await requests_of(client, "victim")
        listed = await friends_lists(client, "victim")

        # The victim asks a friend, who accepts; and accepts one of the newest fakes' requests.
        mine = await ask(client, "victim", "pal")
        accepted = await ask(client, "pal", "victim")
        took = await ask(client, "victim", fakes[-1])
        full = await ask(client, "victim", "pal-2")
        friends_now = await friends_lists(client, "victim")
        left = await requests_of(client, "victim")

    kept = fakes[-friendships.MAX_INCOMING :]
    assert at_once == friendships.MAX_INCOMING
    assert flooded == {"incoming": kept, "outgoing": []}
    assert listed == {"victim": []}
    assert (mine, accepted, took) == (202, 204, 204)
    # Only its two friendships fill the victim's list: the flood never counted.
    assert full == 409
    assert friends_now == {"victim": [fakes[-1], "pal"]}
    assert left == {"incoming": kept[:-1], "outgoing": []}
    assert await pending_rows(quiet) == friendships.MAX_INCOMING - 1


async def test_a_player_has_a_bounded_number_of_requests_pending(
    quiet: LadderSettings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(friendships, "MAX_OUTGOING", 3)
    async with api_client(quiet) as client:
        statuses = [await ask(client, "spam", f"u-{i}") for i in range(3)]
        before = await snapshot(redis, quiet.key_prefix)
        refused = await client.put(path("spam", "u-3"), headers=player("spam"))
        after = await snapshot(redis, quiet.key_prefix)
        listed = await requests_of(client, "spam")
        # Accepting another's request is no new request: allowed however many are pending.
        assert await ask(client, "u-9", "spam") == 202
        accepted = await ask(client, "spam", "u-9")
        # Withdrawing one makes room.
        await client.delete(path("spam", "u-0"), headers=player("spam"))
        room = await ask(client, "spam", "u-3")

    assert statuses == [202, 202, 202]
    assert_problem(refused, 409)
    assert after == before
    assert listed == {"incoming": [], "outgoing": ["u-0", "u-1", "u-2"]}
    assert accepted == 204
    assert room == 202


async def test_accepting_into_a_full_list_is_409_and_keeps_the_request(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(friendships, "MAX_FRIENDS", 1)
    async with api_client(quiet) as client:
        await client.put(path("u-1", "u-2"), headers=SERVER)
        asked = await ask(client, "u-3", "u-1")
        refused = await client.put(path("u-1", "u-3"), headers=player("u-1"))
        full_asker = await client.put(path("u-1", "u-4"), headers=player("u-1"))
        listed = await friends_lists(client, "u-1", "u-3")
        pending = await requests_of(client, "u-1")

    assert asked == 202
    assert_problem(refused, 409)
    assert_problem(full_asker, 409)
    assert listed == {"u-1": ["u-2"], "u-3": []}
    assert pending == {"incoming": ["u-3"], "outgoing": []}


async def test_the_requests_list_is_no_friend_id(quiet: LadderSettings, redis: Redis) -> None:
    """``.../friends/requests`` names the list, read only: a PUT or DELETE there is a 405
    naming GET alone (as is any method the path does not have), and changes nothing."""
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        refused = [
            await client.request(method, path("u-1", "requests"), headers=headers)
            for method in ("PUT", "DELETE", "OPTIONS")
            for headers in (SERVER, player("u-1"))
        ]
        after = await snapshot(redis, quiet.key_prefix)
        document = (await client.get("/openapi.json")).json()

    # The document says so, on both operations of the friend path.
    operations = document["paths"]["/v1/users/{user_id}/friends/{friend_id}"]
    for method in ("put", "delete"):
        assert "Allow" in operations[method]["responses"]["405"]["headers"], method

    for response in refused:
        assert_problem(response, 405)
        assert response.headers["allow"] == "GET"
    assert after == before
    assert await pending_rows(quiet) == 0
    assert await stored(quiet, "u-1") == []


async def test_a_change_kept_waiting_for_a_users_lock_is_503_and_changes_nothing(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(friendships, "LOCK_WAIT_SECONDS", 0.2)
    async with open_engine(quiet.mysql_url) as engine, engine.connect() as holder:
        name = friendships._lock_name(engine, "u-2")
        assert await holder.scalar(text("SELECT GET_LOCK(:n, 1)"), {"n": name}) == 1
        async with api_client(quiet) as client:
            waited = [
                await client.put(path("u-1", "u-2"), headers=player("u-1")),
                await client.put(path("u-1", "u-2"), headers=SERVER),
                await client.delete(path("u-1", "u-2"), headers=SERVER),
            ]
            # Other users' changes do not wait.
            other = await ask(client, "u-1", "u-3")
        await holder.scalar(text("SELECT RELEASE_LOCK(:n)"), {"n": name})

    for response in waited:
        assert_problem(response, 503)
        assert response.headers["retry-after"] == "2"
    assert other == 202
    assert await stored(quiet, "u-1") == []
    assert await pending_rows(quiet) == 1
