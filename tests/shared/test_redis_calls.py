"""The hottest reads' Redis call (shared/redis.py ``fcall_ro``) and Ladder's send
(``PackedConnection.send_packed_command``): the same replies and failures as redis-py's
``execute_command``, on a connection the reads keep, which is checked as the pool checks the ones
it hands out (closed by the server, a reply left unread: connected afresh)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bench.probes import fill_board
from shared import redis as shared_redis
from shared.functions import PLACE_FUNCTION
from shared.keys import Keys
from shared.redis import PackedConnection, fcall_ro

MEMBERS = 50


@pytest.fixture
async def board(redis: Redis, keys: Keys) -> tuple[str, ...]:
    """A view of MEMBERS entries and the four keys the standing read's function takes."""
    if not isinstance(redis, Redis):
        pytest.skip("a cluster's client calls through execute_command")
    view = keys.region_view("calls", "alltime", "all", "eu")
    await fill_board(redis, view, MEMBERS)
    return (view, Keys.ties(view), keys.names("calls"), Keys.distinct(view))


async def place(redis: Redis, board: tuple[str, ...], user: str, around: int = 2) -> Any:
    return await fcall_ro(redis, PLACE_FUNCTION, board, user, around, "ordinal", "")


def kept(redis: Redis) -> list[Any]:
    return shared_redis._IDLE.get(redis.connection_pool, [])


async def test_a_call_answers_as_execute_command_on_one_kept_connection(
    redis: Redis, board: tuple[str, ...]
) -> None:
    for user in ("u0", "u7", "u49", "nobody"):
        expected = await redis.execute_command(
            "FCALL_RO", PLACE_FUNCTION, len(board), *board, user, 2, "ordinal", ""
        )
        assert await place(redis, board, user) == expected
    assert len(kept(redis)) == 1


async def test_a_connection_the_server_closed_is_connected_afresh(
    redis: Redis, board: tuple[str, ...]
) -> None:
    first = await place(redis, board, "u3")
    (connection,) = kept(redis)
    await connection.send_command("CLIENT", "ID")
    client_id = await connection.read_response()
    await redis.execute_command("CLIENT", "KILL", "ID", client_id)
    await asyncio.sleep(0.1)  # the close reaches the connection's reader
    assert await place(redis, board, "u3") == first
    assert kept(redis) == [connection]
    await connection.send_command("CLIENT", "ID")
    assert await connection.read_response() != client_id


async def test_an_error_reply_is_raised_and_the_connection_kept(
    redis: Redis, board: tuple[str, ...]
) -> None:
    await place(redis, board, "u1")
    (connection,) = kept(redis)
    with pytest.raises(ResponseError):
        await fcall_ro(redis, PLACE_FUNCTION, board, "u1")  # too few arguments
    with pytest.raises(ResponseError):
        await fcall_ro(redis, "ladder_no_such_function", board)
    assert connection.is_connected
    assert (await place(redis, board, "u1"))[0] is not None
    assert kept(redis) == [connection]


async def test_a_read_cancelled_in_flight_leaves_no_reply_for_the_next(
    redis: Redis, board: tuple[str, ...]
) -> None:
    await place(redis, board, "u1")
    call = asyncio.create_task(place(redis, board, "u1"))
    await asyncio.sleep(0)  # sent; its reply not read yet
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    expected = await redis.execute_command(
        "FCALL_RO", PLACE_FUNCTION, len(board), *board, "u30", 2, "ordinal", ""
    )
    assert await place(redis, board, "u30") == expected


async def test_concurrent_calls_each_take_a_connection_and_few_are_kept(
    redis: Redis, board: tuple[str, ...]
) -> None:
    users = [f"u{i}" for i in range(MEMBERS)] * 2
    answers = await asyncio.gather(*(place(redis, board, user, 0) for user in users))
    assert [answer[3][0][-len(user) :] for answer, user in zip(answers, users, strict=True)] == [
        user for user in users
    ]
    assert len(kept(redis)) == shared_redis._KEPT


async def test_an_unreachable_redis_fails_as_execute_command_does() -> None:
    client = Redis.from_url(
        "redis://127.0.0.1:1/0", decode_responses=True, connection_class=PackedConnection
    )
    try:
        with pytest.raises(RedisConnectionError):
            await client.execute_command("FCALL_RO", PLACE_FUNCTION, 1, "k")
        with pytest.raises(RedisConnectionError):
            await fcall_ro(client, PLACE_FUNCTION, ("k",))
    finally:
        await client.aclose()


async def test_a_send_that_cannot_drain_times_out_and_disconnects(
    redis: Redis, board: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    await place(redis, board, "u1")
    (connection,) = kept(redis)
    writer = connection._writer
    assert isinstance(connection, PackedConnection) and writer is not None

    async def stuck() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(connection, "socket_timeout", 0.05)
    monkeypatch.setattr(writer, "drain", stuck)
    monkeypatch.setattr(writer.transport, "get_write_buffer_size", lambda: 1)
    with pytest.raises(RedisTimeoutError, match="Timeout writing to socket"):
        await connection.send_packed_command(b"*1\r\n$4\r\nPING\r\n", check_health=False)
    assert not connection.is_connected
    monkeypatch.undo()
    assert (await place(redis, board, "u1"))[0] is not None  # connected again


async def test_more_calls_in_flight_than_the_pool_holds_wait_their_turn(
    redis: Redis, keys: Keys
) -> None:
    """More calls at once than a process's pool has connections (a burst of requests behind a
    slow command): each waits for a connection, as it would for Redis itself, rather than failing
    at once with redis-py's "Too many connections", which the API answered 503 though Redis was
    fine."""
    if not isinstance(redis, Redis):
        pytest.skip("a cluster's client keeps a pool a node")
    size = redis.connection_pool.max_connections
    empty = keys.outbox("pool")  # a list nobody pushes to: BLPOP holds its connection 0.2 s
    replies = await asyncio.gather(*(redis.blpop([empty], timeout=0.2) for _ in range(size + 50)))
    assert replies == [None] * (size + 50)


@pytest.mark.timing
async def test_a_reply_that_does_not_come_in_time_times_out_and_disconnects(
    redis: Redis, board: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    await place(redis, board, "u1")
    (connection,) = kept(redis)
    monkeypatch.setattr(connection, "socket_timeout", 0.05)
    await redis.execute_command("CLIENT", "PAUSE", 300, "ALL")  # the call is sent, not answered
    started = asyncio.get_running_loop().time()
    with pytest.raises(RedisTimeoutError, match="Timeout reading from"):
        await place(redis, board, "u1")
    assert asyncio.get_running_loop().time() - started < 0.25
    assert not connection.is_connected
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    monkeypatch.undo()
    expected = await redis.execute_command(
        "FCALL_RO", PLACE_FUNCTION, len(board), *board, "u1", 2, "ordinal", ""
    )
    assert await place(redis, board, "u1") == expected  # connected again


async def test_a_read_whose_timeout_a_maintenance_notice_relaxes_waits_for_its_reply(
    redis: Redis, board: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = await place(redis, board, "u2")
    (connection,) = kept(redis)
    monkeypatch.setattr(connection, "socket_timeout", 0.1)
    await redis.execute_command("CLIENT", "PAUSE", 200, "ALL")
    call = asyncio.create_task(place(redis, board, "u2"))
    await asyncio.sleep(0.02)  # sent; its reply waited for
    connection.update_current_socket_timeout(2.0)  # what redis-py does on a notice
    assert await call == expected
    assert connection.is_connected and kept(redis) == [connection]
