"""The rate limits inside the write (docs/api.md section 9a; shared/lua/limits.lua), against real
Redis: a user's burst is twice its rate, the next write is refused with the wait until a token
is there and writes nothing, a write refused for another reason takes no token, and a bucket
left as a hash by the code before counts as full once and is replaced."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from services.api.errors import Conflict
from services.api.write.limits import Quota, RateLimited
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings

BOARD = Board(board_id="rated")


def quota(keys: Keys, user_rate: float = 1.0, key_rate: float = 1000.0) -> Quota:
    return Quota(keys, BOARD.board_id, "key:test", user_rate, key_rate)


def score(value: int, user: str = "u-1") -> ScoreIn:
    return ScoreIn(user_id=user, region="eu", value=value)


async def test_a_user_bursts_to_twice_its_rate_then_waits(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    limits = quota(keys, user_rate=1.0)
    for n in range(2):
        await submit(redis, keys, settings, BOARD, score(5), f"e-{n}", limits)

    with pytest.raises(RateLimited) as refused:
        await submit(redis, keys, settings, BOARD, score(5), "e-2", limits)

    assert refused.value.headers == {"Retry-After": "1"}
    assert await redis.get(keys.idempotency(BOARD.board_id, "e-2", "u-1")) is None
    assert await redis.xlen(keys.outbox(BOARD.board_id)) == 2
    # Another user has a bucket of its own; the credential's is far from empty.
    await submit(redis, keys, settings, BOARD, score(5, "u-2"), "e-3", limits)


async def test_a_credential_is_limited_across_its_users(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    limits = quota(keys, user_rate=100.0, key_rate=2.0)
    for n in range(2):
        await submit(redis, keys, settings, BOARD, score(5, f"u-{n}"), f"e-{n}", limits)

    with pytest.raises(RateLimited, match="this credential"):
        await submit(redis, keys, settings, BOARD, score(5, "u-9"), "e-9", limits)


async def test_a_write_refused_otherwise_takes_no_token(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    limits = quota(keys, user_rate=1.0)
    await submit(redis, keys, settings, BOARD, score(5), "e-0", limits)
    with pytest.raises(Conflict):
        await submit(redis, keys, settings, BOARD, score(6), "e-0", limits)
    # The conflict left the second token of the burst where it was.
    await submit(redis, keys, settings, BOARD, score(7), "e-1", limits)


async def test_a_bucket_left_as_a_hash_counts_as_full_and_is_replaced(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    bucket = keys.rate_bucket(BOARD.board_id, "user", "u-1")
    await redis.hset(bucket, mapping={"tokens": "0", "at": "0"})

    await submit(redis, keys, settings, BOARD, score(5), "e-0", quota(keys))

    assert await redis.type(bucket) == "string"
    value = str(await redis.get(bucket))
    tokens, _, at = value.partition("|")
    assert float(tokens) == 1.0 and int(at) > 0
    assert 0 < await redis.pttl(bucket) <= 3000


async def test_a_retry_of_an_answered_event_is_answered_with_no_token_left(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    # The user's burst spent on two events whose answers the client never saw (a timeout): the
    # retries get the stored answers, not 429, and another body under an id is still a 409.
    limits = quota(keys, user_rate=1.0)
    first = [await submit(redis, keys, settings, BOARD, score(5), f"e-{n}", limits) for n in (0, 1)]
    for n in (0, 1):
        again = await submit(redis, keys, settings, BOARD, score(5), f"e-{n}", limits)
        assert again["duplicate"] and again["periods"] == first[n]["periods"]
    with pytest.raises(Conflict):
        await submit(redis, keys, settings, BOARD, score(6), "e-0", limits)
    with pytest.raises(RateLimited):
        await submit(redis, keys, settings, BOARD, score(5), "e-2", limits)
    assert await redis.xlen(keys.outbox(BOARD.board_id)) == 2
