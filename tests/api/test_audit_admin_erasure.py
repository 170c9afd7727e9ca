"""A friendship made while a user's erasure runs (docs/api.md section 8b, "Erasing a user":
its friend list both ways and its pending requests go), against the real Redis and MySQL."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import friend_requests, friendships
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import erase_u_a
from tests.helpers import SERVER, api_client, player

# Every test on its own migrated database, which the API's quiet settings name.
pytestmark = [
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
    pytest.mark.usefixtures("mysql_database"),
]


async def test_a_friendship_asked_while_the_user_is_being_erased_leaves_nothing_after_it(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The erasure's last pass drops the user's friendships and requests, then erases its
    events and snapshots. A friendship, or a request, made in between was answered (204, 202)
    and kept for good: the erased id named in MySQL and in a friend set once the erasure was
    done. While the erasure is pending they are refused with 503, as its score writes are."""
    answers: list[int] = []

    async def befriend_meanwhile() -> None:
        # The erasure's last step, after its friends are gone: friend changes come now.
        for path, headers in (
            ("/v1/users/u-b/friends/u-a", SERVER),
            ("/v1/users/u-a/friends/u-c", SERVER),
            ("/v1/users/u-d/friends/u-a", player("u-d")),
        ):
            answers.append((await client.put(path, headers=headers)).status_code)

    async with api_client(quiet) as client:
        await erase_u_a(client, monkeypatch, befriend_meanwhile)

        async with db.connect() as conn:
            pairs = await conn.execute(select(friendships.c.user_id, friendships.c.friend_id))
            asked = await conn.execute(select(friend_requests.c.user_id))
            assert (pairs.all(), asked.all()) == ([], [])
        for user in ("u-a", "u-b", "u-c"):
            assert await redis.smembers(keys.friends(user)) == set()
        assert answers and set(answers) == {503}, answers
        # Done: the id is a fresh user's, who may have friends.
        assert (await client.put("/v1/users/u-b/friends/u-a", headers=SERVER)).status_code == 204
