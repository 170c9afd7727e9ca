"""The batch route and the ``Idempotency-Key`` header (docs/api.md section 4).

The header carries one event's id. A batch's events carry their own ``event_id`` each, and a
header on a batch has no event to name: it is refused (422, pointing at the header) and writes
nothing, rather than read as a promise the retry of the batch would not keep (its events, without
ids of their own, would each count again).
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.helpers import SERVER, api_client, snapshot

BATCH = "/v1/boards/main/scores/batch"


async def test_a_batch_with_an_idempotency_key_is_refused_and_writes_nothing(
    quiet: LadderSettings, redis: Redis
) -> None:
    events = [{"user_id": "u-1", "region": "eu", "value": 5}]
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        headers = {**SERVER, "Idempotency-Key": "batch-1"}
        first = await client.post(BATCH, json={"events": events}, headers=headers)
        retry = await client.post(BATCH, json={"events": events}, headers=headers)
        after = await snapshot(redis, quiet.key_prefix)
        # Without the header the same batch is written, as before.
        plain = await client.post(BATCH, json={"events": events}, headers=SERVER)
    for response in (first, retry):
        problem = assert_problem(response, 422)
        assert [e["loc"] for e in problem["errors"]] == [["header", "Idempotency-Key"]]
    assert after == before
    assert plain.status_code == 200, plain.text
    assert plain.json()["results"][0]["periods"]["alltime"]["score"] == 5
