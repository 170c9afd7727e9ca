"""Redis's friend sets converge to MySQL (docs/architecture.md "Friendships"): the reconcile takes
out what MySQL no longer has as well as putting back what Redis lost, at the API's start-up and
then every LADDER_FRIENDS_RECONCILE_SECONDS, and ``make rebuild`` runs it too."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.db import open_engine
from shared.friendships import unfriend
from shared.keys import Keys
from shared.restore import Reconciled, reconcile_friendships
from shared.settings import LadderSettings
from tests.api.test_friends import befriend, friends_lists, stored
from tests.helpers import api_client, eventually


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database, with no periodic
    reconcile (a test that wants one sets it)."""
    return quiet.model_copy(update={"friends_reconcile_seconds": 0.0})


USERS = ("u-1", "u-2", "u-3", "u-4", "u-8", "u-9")


async def sets(redis: Redis, keys: Keys) -> dict[str, set[str]]:
    return {u: await redis.smembers(keys.friends(u)) for u in USERS}


async def spoil(settings: LadderSettings, redis: Redis, keys: Keys) -> None:
    """u-1 befriends u-2, u-3 and u-4 through the API; then Redis and MySQL part ways as a
    failed or raced write leaves them: MySQL ends u-1 and u-2 (the SREMs never came), Redis
    loses u-4 from u-1's set, and holds a friendship of two users MySQL never had."""
    async with api_client(settings) as client:
        await befriend(client, "u-1", "u-2", "u-3", "u-4")
    async with open_engine(settings.mysql_url) as engine:
        await unfriend(engine, "u-1", "u-2")
    await redis.srem(keys.friends("u-1"), "u-4")
    await redis.sadd(keys.friends("u-8"), "u-9")
    await redis.sadd(keys.friends("u-9"), "u-8")


# What MySQL holds after spoil(), which Redis must come to (an empty set is no key).
TRUTH = {
    "u-1": {"u-3", "u-4"},
    "u-2": set(),
    "u-3": {"u-1"},
    "u-4": {"u-1"},
    "u-8": set(),
    "u-9": set(),
}


@pytest.mark.parametrize("page", [1, 2, 5000])
async def test_the_reconcile_removes_what_mysql_lacks_and_adds_what_redis_lost(
    quiet: LadderSettings, redis: Redis, keys: Keys, page: int
) -> None:
    await spoil(quiet, redis, keys)
    assert (await sets(redis, keys))["u-2"] == {"u-1"}  # stale: what the reconcile must put right

    async with open_engine(quiet.mysql_url) as engine:
        done = await reconcile_friendships(engine, redis, keys, page=page)
        again = await reconcile_friendships(engine, redis, keys, page=page)

    assert await sets(redis, keys) == TRUTH
    assert not await redis.exists(keys.friends("u-2"), keys.friends("u-8"), keys.friends("u-9"))
    for user, friends in TRUTH.items():
        assert set(await stored(quiet, user)) == friends
    # u-1 needed an add (u-4) and a removal (u-2) both; u-2, u-8 and u-9 removals only.
    assert (done.added, done.removed) == (1, 4)
    # Converged: a second pass compares and changes nothing.
    assert (again.added, again.removed) == (0, 0)
    assert again == Reconciled(users=3, added=0, removed=0)


async def test_the_api_reconciles_at_start_up(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    await spoil(quiet, redis, keys)

    async with api_client(quiet) as client:
        listed = await friends_lists(client, *USERS)

    assert listed == {u: sorted(f) for u, f in TRUTH.items()}


async def test_the_api_reconciles_every_interval(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    settings = quiet.model_copy(update={"friends_reconcile_seconds": 1.0})
    async with api_client(settings) as client:
        await befriend(client, "u-1", "u-2")
        # A friendship MySQL never had appears in Redis while the API runs.
        await redis.sadd(keys.friends("u-1"), "u-9")
        await redis.sadd(keys.friends("u-9"), "u-1")

        async def converged() -> bool | None:
            stale = await redis.exists(keys.friends("u-9")) or "u-9" in await redis.smembers(
                keys.friends("u-1")
            )
            return None if stale else True

        await eventually(converged)
        listed = await friends_lists(client, "u-1", "u-2", "u-9")

    assert listed == {"u-1": ["u-2"], "u-2": ["u-1"], "u-9": []}


async def test_a_set_mysql_knows_nothing_of_is_left_when_it_is_no_friend_set(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The Redis-only pass takes sets under the friends prefix only: another key of the prefix
    that merely looks alike (not a set) is none of its business."""
    await redis.set(keys.friends("u-7"), "not a set")
    async with open_engine(quiet.mysql_url) as engine:
        done = await reconcile_friendships(engine, redis, keys)

    assert await redis.get(keys.friends("u-7")) == "not a set"
    assert done == Reconciled()
