"""The edges of a score's body that docs/api.md sections 1 and 4 name: metadata's numbers, bytes
and depth, and integers past every range, each refused as the contract says and writing nothing,
or kept and read back exactly."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from shared.settings import LadderSettings
from tests.api.helpers import SCORES, assert_problem
from tests.helpers import SERVER, api_client, snapshot

HEADERS = SERVER | {"Content-Type": "application/json"}


def body(metadata: Any) -> bytes:
    return raw(orjson.dumps(metadata))


def raw(metadata: bytes) -> bytes:
    return b'{"user_id": "u-1", "region": "eu", "value": 1, "metadata": ' + metadata + b"}"


def nested(levels: int) -> bytes:
    """An object ``levels`` deep (serialised by hand: past a few hundred levels no encoder
    will)."""
    return b'{"a": ' * (levels - 1) + b"{}" + b"}" * (levels - 1)


@pytest.mark.parametrize(
    ("content", "status", "loc"),
    [
        # Integers past 64 bits and numbers past a double's range: no JSON parser holds them.
        (body({"a": 2**64 - 1}), 200, None),
        (body({"a": -(2**63)}), 200, None),
        (b'{"user_id": "u-1", "region": "eu", "value": 1, "metadata": {"a": 18446744073709551616}}',
         422, ["body", "metadata"]),
        (b'{"user_id": "u-1", "region": "eu", "value": 1, "metadata": {"a": -9223372036854775809}}',
         422, ["body", "metadata"]),
        (b'{"user_id": "u-1", "region": "eu", "value": 1, "metadata": {"a": 1e400}}',
         422, ["body", "metadata"]),
        # 1024 bytes as compact JSON in UTF-8: "é" counts two.
        (body({"k": "\u00e9" * 508}), 200, None),
        (body({"k": "\u00e9" * 509}), 422, ["body", "metadata"]),
        # 32 levels of objects, the metadata itself the first.
        (raw(nested(32)), 200, None),
        (raw(nested(33)), 422, ["body", "metadata"]),
        # A body nested past 1024 levels is not read: 400, as for one that is not JSON.
        (raw(nested(1024)), 400, None),
        # An integer past every range is a 422 (not a 400: it is JSON).
        (b'{"user_id": "u-1", "region": "eu", "value": 123456789012345678901234567890}',
         422, ["body", "value"]),
    ],
    ids=[
        "metadata-2**64-1", "metadata-minus-2**63", "metadata-2**64", "metadata-below-minus-2**63",
        "metadata-1e400", "metadata-1024-bytes", "metadata-1026-bytes", "metadata-32-levels",
        "metadata-33-levels", "body-1025-levels", "value-past-64-bits",
    ],
)  # fmt: skip
async def test_a_score_body_at_its_edges(
    quiet: LadderSettings, redis: Redis, content: bytes, status: int, loc: list[str] | None
) -> None:
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        response = await client.post(SCORES, content=content, headers=HEADERS)
        if status != 200:
            problem = assert_problem(response, status)
            if loc is not None:
                assert [e["loc"] for e in problem["errors"]] == [loc]
            assert await snapshot(redis, quiet.key_prefix) == before
            return
        assert response.status_code == 200, response.text
        page = await client.get("/v1/boards/main/leaderboard", params={"scope": "region:eu"})
    # Kept exactly: what comes back is what was sent.
    assert page.json()["entries"][0]["metadata"] == orjson.loads(content)["metadata"]
