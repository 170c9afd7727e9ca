"""What a dependency's failure looks like to a client (docs/api.md section 1): Redis refusing
for its own state (read-only after a failover, a cluster slot down, out of memory) and the
database's connection pool timing out are a 503 problem with ``Retry-After``, as a lost
connection is; a fault of the server's own is a problem+json 500, never a bare text page."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from services.api.reads import standings
from services.api.routes import friends
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.helpers import SERVER, api_client

STANDING = "/v1/boards/main/users/u-1?scope=region:eu"


def failing(error: Exception) -> Any:
    async def fail(*_: Any, **__: Any) -> Any:
        raise error

    return fail


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ReadOnlyError("READONLY You can't write against a read only replica."), 503),
        (ClusterDownError("CLUSTERDOWN The cluster is down"), 503),
        (RedisClusterException("Redis Cluster cannot be connected."), 503),
        (OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'."), 503),
        (ResponseError("BUSY Redis is busy running a script."), 503),
        (ResponseError("ERR wrong number of arguments for 'zadd' command"), 500),
        (RuntimeError("a fault of the server's own"), 500),
    ],
)
async def test_a_redis_failure_is_a_problem(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch, error: Exception, status: int
) -> None:
    monkeypatch.setattr(standings, "standing", failing(error))
    async with api_client(quiet) as client:
        response = await client.get(STANDING)
    assert_problem(response, status)  # with Retry-After for a 503
    assert str(error) not in response.text  # the server's own words stay in its log


async def test_a_database_pool_timeout_is_a_503_problem(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = PoolTimeoutError("QueuePool limit of size 5 overflow 10 reached")
    monkeypatch.setattr(friends.friendships, "load_requests", failing(error))
    async with api_client(quiet) as client:
        response = await client.get("/v1/users/u-1/friends/requests", headers=SERVER)
    assert_problem(response, 503)
