"""Outage or refusal (shared/failures.py), judged on errors the real servers raise."""

from __future__ import annotations

import aio_pika
import pytest
from redis import exceptions as cluster
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from shared.failures import is_transient, short_reason
from shared.settings import LadderSettings
from tests.conftest import ON_CLUSTER
from tests.stack import free_port


async def mysql_error(url: str, *statements: str) -> DBAPIError:
    engine = create_async_engine(url)
    try:
        with pytest.raises(DBAPIError) as caught:
            async with engine.begin() as conn:
                for statement in statements:
                    await conn.execute(text(statement))
    finally:
        await engine.dispose()
    return caught.value


async def test_mysql_refusing_a_row_is_not_transient(
    settings: LadderSettings, mysql_database: str
) -> None:
    table = "CREATE TEMPORARY TABLE t (v INT NOT NULL, CONSTRAINT c CHECK (v <> 666))"
    check = await mysql_error(settings.mysql_url, table, "INSERT INTO t VALUES (666)")
    null = await mysql_error(settings.mysql_url, table, "INSERT INTO t VALUES (NULL)")
    out_of_range = await mysql_error(
        settings.mysql_url,
        "SET SESSION sql_mode = 'STRICT_ALL_TABLES'",
        table,
        "INSERT INTO t VALUES (99999999999)",
    )

    assert [is_transient(e) for e in (check, null, out_of_range)] == [False, False, False]


async def test_mysql_away_or_missing_its_table_is_transient(
    settings: LadderSettings, mysql_database: str
) -> None:
    closed_port = make_url(settings.mysql_url).set(port=free_port()).render_as_string(False)
    refused = await mysql_error(closed_port, "SELECT 1")
    no_table = await mysql_error(settings.mysql_url, "INSERT INTO no_such_table VALUES (1)")

    assert is_transient(refused)
    assert is_transient(no_table)


async def test_redis_away_or_without_its_functions_is_transient(redis: Redis) -> None:
    away = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RedisError) as refused:
        await away.get("x")
    await away.aclose()
    with pytest.raises(RedisError) as no_function:
        await redis.fcall("ladder_no_such_function_v1", 0)
    await redis.set("lt-failures-string", "x", ex=5)
    with pytest.raises(RedisError) as wrong_type:
        await redis.zadd("lt-failures-string", {"a": 1})

    assert is_transient(refused.value)
    assert is_transient(no_function.value)
    assert not is_transient(wrong_type.value)


async def test_a_pipelines_missing_function_is_transient_and_its_wrong_type_not(
    redis: Redis,
) -> None:
    """redis-py puts a pipeline's error reply after a description of its command (the
    notifier's calls go in pipelines): a lost library is an outage there too, and the batch
    waits for it rather than being refused toward the dead-letter queue."""
    await redis.set("lt-failures-pipe", "x", ex=5)
    replies = []
    # A member named like a transient reply: the command's arguments are not the reply.
    for command in (
        ("FCALL", "ladder_no_such_function_v1", 0),
        ("ZADD", "lt-failures-pipe", 1, "busy"),
    ):
        async with redis.pipeline(transaction=False) as pipe:
            pipe.execute_command(*command)
            with pytest.raises(RedisError) as caught:
                await pipe.execute()
        replies.append(caught.value)
    no_function, wrong_type = replies

    # On one Redis the reply comes after the command's description (what is_transient reads
    # past); a cluster client's pipeline raises the reply as it came.
    if not ON_CLUSTER:
        assert str(no_function).startswith("Command # 1 (FCALL ladder_no_such_function_v1 0)")
    assert is_transient(no_function)
    assert not is_transient(wrong_type)


def test_a_handlers_own_error_is_not_transient_unless_an_outage_caused_it() -> None:
    assert not is_transient(ValueError("bad event"))
    try:
        try:
            raise ConnectionResetError("peer")
        except ConnectionResetError as cause:
            raise RuntimeError("while storing") from cause
    except RuntimeError as wrapped:
        assert is_transient(wrapped)
    assert is_transient(ExceptionGroup("both", [ValueError("x"), TimeoutError()]))


def test_a_cluster_failing_over_or_forming_is_transient() -> None:
    """What redis-py's cluster client raises while slots move or no node answers: the batch
    waits for the cluster, and no message is sent toward its dead-letter queue."""
    for error in (
        cluster.ClusterDownError("CLUSTERDOWN The cluster is down"),
        cluster.ClusterError("TTL exhausted."),
        cluster.SlotNotCoveredError("Command # 1 (GET x) of pipeline caused error: slot 866"),
        cluster.RedisClusterException("Redis Cluster cannot be connected."),
        cluster.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    ):
        assert is_transient(error), error


async def test_a_reason_names_no_server_address(settings: LadderSettings) -> None:
    """``/readyz`` answers anyone who can reach it: its reasons say what failed, not where."""
    port = free_port()
    mysql = make_url(settings.mysql_url).set(password="s3cret", port=port)
    away = await mysql_error(mysql.render_as_string(False), "SELECT 1")
    redis = Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}/0")
    with pytest.raises(RedisError) as redis_away:
        await redis.ping()
    await redis.aclose()
    with pytest.raises(OSError) as broker_away:
        await aio_pika.connect(f"amqp://guest:s3cret@127.0.0.1:{port}/", timeout=5)
    written = [
        OSError("Error 111 connecting to redis.internal:6379. Connection refused."),
        OSError("Unknown MySQL server host 'db.internal' (-2)"),
        OSError("Connect call failed ('::1', 5672, 0, 0)"),
        OSError("Error 111 connecting to [fd00::7]:6379."),
    ]
    reasons = [short_reason(e) for e in (away, redis_away.value, broker_away.value, *written)]

    for reason in reasons:
        for address in ("127.0.0.1", str(port), "s3cret", "internal", "::1", "fd00"):
            assert address not in reason, reason
    assert "Can't connect to MySQL server" in reasons[0], reasons[0]
    assert reasons[1].startswith("ConnectionError: Error 111 connecting to <address>"), reasons[1]
