"""The rebuild's finish step is given every key the rebuild knows of. Events journaled after the
rebuild last read its journal can name keys it was not given (new users, a new region): the step
names their staging copies itself and finishes in the same call, so that writes arriving all the
time never hold a rebuild back."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline
from sqlalchemy.ext.asyncio import AsyncEngine

from services.rebuild import finish as finish_module
from services.rebuild import rebuilder as rebuilder_module
from services.rebuild.rebuilder import Rebuilder
from shared.boards import BoardCatalog
from shared.derived import derive_pending
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import SERVER, api_client
from tests.rebuild.test_rebuild import BOARDS, eu, relay, write

# Events written between the rebuild's last read of its journal and its finish.
LATE = 25


async def test_events_journaled_after_the_journal_was_read_are_applied_in_the_same_call(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
    broker: Topology,  # the API started at the end declares the queues: deleted afterwards
) -> None:
    board = BOARDS[0]
    await BoardCatalog(redis, keys).put(board)
    now = datetime.now(UTC).isoformat()
    for i in range(6):
        await write(redis, keys, settings, board, **eu(f"e{i}", f"u{i % 3}", 10, now))
    await relay(redis, keys, db, board)

    answers: list[str] = []
    client_class = type(redis)  # Redis, or the cluster's client
    original_fcall = client_class.fcall

    def recording_fcall(self: Any, name: str, *args: Any) -> Any:
        called = original_fcall(self, name, *args)
        # Pipelines queue the call (the replays); the finish step is awaited on the client.
        if name != finish_module.REBUILD_FINISH_FUNCTION or isinstance(
            self, (Pipeline, ClusterPipeline)
        ):
            return called

        async def recorded() -> Any:
            answer = await called
            answers.append(answer[0])
            return answer

        return recorded()

    original_finish = rebuilder_module.finish

    sa = keys.region_view(board.board_id, "alltime", "all", "sa")

    async def write_then_finish(*args: Any, **kwargs: Any) -> tuple[str, str, int]:
        # After the journal was read: new users in a new region, journaled only (not stored),
        # and a distinct-score set made for the new region's view meanwhile.
        for i in range(LATE):
            late = {**eu(f"late{i}", f"newcomer{i}", 70 + i, now), "region": "sa"}
            await write(redis, keys, settings, board, **late)
        await redis.zadd(Keys.distinct(sa), {"70": 70})
        return await original_finish(*args, **kwargs)

    monkeypatch.setattr(client_class, "fcall", recording_fcall)
    monkeypatch.setattr(rebuilder_module, "finish", write_then_finish)
    done = await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(board)

    assert answers == ["ok"]
    assert (done.attempts, done.events, done.journal_replayed) == (1, 6, LATE)
    assert not [k async for k in redis.scan_iter(match="{" + settings.key_prefix + ":*rebuild*")]
    # The replay derived them (the user's regions), and the aggregator will not derive them again.
    assert await redis.hget(keys.user_regions(board.board_id), "newcomer0") == "sa"
    records = [keys.idempotency(board.board_id, f"late{i}", f"newcomer{i}") for i in range(LATE)]
    firsts = [await redis.getrange(record, 0, 0) for record in records]
    assert not [first for first in firsts if derive_pending(first)]
    assert not await redis.exists(Keys.distinct(sa))
    async with api_client(settings) as client:
        standing = await client.get(
            "/v1/boards/main/users/newcomer0",
            params={"scope": "region:sa", "period": "alltime"},
            headers=SERVER,
        )
        others = await client.get(
            "/v1/boards/main/leaderboard",
            params={"scope": "region:eu", "period": "alltime"},
            headers=SERVER,
        )
    assert (standing.status_code, standing.json()["score"]) == (200, 70)
    assert await redis.zcard(sa) == LATE
    # Reached at the same moment, the three tie: their order among themselves is not the point.
    assert sorted((e["user_id"], e["score"]) for e in others.json()["entries"]) == [
        ("u0", 20),
        ("u1", 20),
        ("u2", 20),
    ]
