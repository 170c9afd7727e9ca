"""A user's erasure recorded while the aggregator applies a batch of the user's events
(docs/reliability.md, "Erasure and the outboxes"): the batch was filtered before the tombstone
and applied after the erasure's passes, which found nothing of it to take out. The aggregator
looks again after its apply, and Redis ends without the user in any key the batch writes (the
feed, the user's team and regions, the hot and MVP views, the event's record), its counters
counting each event once, whatever the timing. Before the look, all of those were left."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.aggregator import late_erasures
from services.aggregator import main as aggregator
from services.aggregator.fresh import FreshRegions
from services.api.eraser import Eraser
from shared.boards import BoardCatalog
from shared.db import open_engine
from shared.erasure import Erasure, Split, finish_erasure, request_erasure, user_hash
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.uncount import Uncount
from tests.api.helpers import post, score
from tests.helpers import api_client, snapshot


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def naming(redis: Redis, keys: Keys, user_id: str) -> dict[str, Any]:
    """Every key whose name or content names ``user_id``, but the outbox (whose entries the
    erasure rewrites none of: the consumers leave them out) and the dirty sets (marks the merge
    takes, finding the user in no regional view)."""
    found: dict[str, Any] = {}
    for key, (_, content) in (await snapshot(redis, keys.prefix)).items():
        if key in (keys.outbox("main"), keys.dirty("main")):
            continue
        if user_id in key or user_id.encode() in repr(content).encode():
            found[key] = content
    return found


async def two_users_batch(client: Any, redis: Redis, keys: Keys) -> list[ScoreAccepted]:
    """u-x's event e-1 (team t-x) and u-2's e-2 (team t-2) written, and the batch of both as the
    aggregator would be given it, read from the outbox."""
    await post(client, score(user_id="u-x", event_id="e-1", team_id="t-x"))
    await post(client, score(user_id="u-2", event_id="e-2", team_id="t-2"))
    entries: list[Any] = await redis.xrange(keys.outbox("main"))
    return [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]


def erased_before_the_apply(
    engine: AsyncEngine, redis: Redis, keys: Keys, secret: str, erasures: list[Erasure]
) -> Any:
    """``aggregator.aggregate`` whose apply comes late: the filter has let the batch through,
    then u-x's erasure is recorded (appended to ``erasures``) and both its passes run (they find
    nothing the batch writes), and only then is the batch applied."""
    aggregate = aggregator.aggregate

    def late(*handlers: Any) -> Any:
        apply = aggregate(*handlers)

        async def handle(events: list[ScoreAccepted]) -> None:
            erasure = await request_erasure(engine, redis, keys, "u-x", secret)
            eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
            for _ in range(2):
                await eraser.erase_user("u-x", erasure.cutoff)
            erasures.append(erasure)
            await apply(events)

        return handle

    return late


async def test_a_batch_applied_after_the_erasures_passes_leaves_none_of_the_user_in_redis(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = keys.event_count("main", "alltime", "all")
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        batch = await two_users_batch(client, redis, keys)
        catalog = BoardCatalog(redis, keys)
        aggregate = aggregator.aggregate
        erasures: list[Erasure] = []
        erased = erased_before_the_apply(engine, redis, keys, quiet.effective_jwt_secret, erasures)
        monkeypatch.setattr(aggregator, "aggregate", erased)
        await aggregator.batch_handler(redis, keys, catalog, quiet, FreshRegions())(batch)
        assert erasures
        assert sorted(await naming(redis, keys, "u-x")) == []
        assert await naming(redis, keys, "u-2") != {}
        # e-1 was counted by the apply and taken out again, once; e-2 stays counted.
        assert await redis.get(counter) == "1"

        # Delivered again (a crash before the ack): the filter leaves e-1 out now, and e-2 is
        # derived no more.
        monkeypatch.setattr(aggregator, "aggregate", aggregate)
        await aggregator.batch_handler(redis, keys, catalog, quiet, FreshRegions())(batch)
        assert sorted(await naming(redis, keys, "u-x")) == []
        assert await redis.get(counter) == "1"


async def test_the_look_sees_a_tombstone_whose_request_had_not_written_it_to_redis_yet(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erasure's passes go by MySQL; the look reads the Redis projection. An API paused
    between its MySQL commit and its write of the projection would leave a pass with no
    tombstone in Redis yet: the worker writes the pending tombstones there before its passes,
    so that the look after any apply the passes missed sees them."""
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await post(client, score(user_id="u-x", event_id="e-1", team_id="t-x"))
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        batch = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
        catalog = BoardCatalog(redis, keys)
        aggregate = aggregator.aggregate

        def recorded_before_the_apply(*handlers: Any) -> Any:
            apply = aggregate(*handlers)

            async def handle(events: list[ScoreAccepted]) -> None:
                await request_erasure(engine, redis, keys, "u-x", quiet.effective_jwt_secret)
                # As if the request had stopped before its write of the projection.
                await redis.delete(keys.erased, keys.erasing)
                assert await Eraser(engine, redis, keys, catalog, 0).round() == 0
                await apply(events)

            return handle

        monkeypatch.setattr(aggregator, "aggregate", recorded_before_the_apply)
        await aggregator.batch_handler(redis, keys, catalog, quiet, FreshRegions())(batch)
        assert sorted(await naming(redis, keys, "u-x")) == []


@pytest.mark.parametrize(
    ("done", "history_first"),
    [(False, False), (True, False), (True, True)],
    ids=["erasing", "erased", "erased-history-first"],
)
async def test_a_batch_whose_look_failed_is_taken_out_when_delivered_again(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
    done: bool,
    history_first: bool,
) -> None:
    """The apply succeeds and the look after it fails (Redis lost at that moment): the batch is
    delivered again, and the filter, which sees the tombstone by then, leaves the user's event
    out. The redelivery finds the event applied by its record and takes the user out of the
    board as the look would have, the event out of the counters once: before or after the
    history consumer's own taking out (``Uncount``, which sets the record's derive-pending bit
    again), the erasure marked done or not yet. Before, all of it was left until a rebuild."""
    counter = keys.event_count("main", "alltime", "all")
    secret = quiet.effective_jwt_secret
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        batch = await two_users_batch(client, redis, keys)
        catalog = BoardCatalog(redis, keys)
        aggregate = aggregator.aggregate
        erasures: list[Erasure] = []

        class LookFailsOnce(late_erasures.Tombstones):
            calls = 0

            async def split(self, events: list[ScoreAccepted]) -> Split:
                LookFailsOnce.calls += 1
                if LookFailsOnce.calls == 1:
                    raise RedisConnectionError("Redis lost after the apply")
                return await super().split(events)

        erased = erased_before_the_apply(engine, redis, keys, secret, erasures)
        monkeypatch.setattr(aggregator, "aggregate", erased)
        monkeypatch.setattr(late_erasures, "Tombstones", LookFailsOnce)
        with pytest.raises(RedisConnectionError):
            await aggregator.batch_handler(redis, keys, catalog, quiet, FreshRegions())(batch)
        # The apply wrote the user's views and counted e-1; the look took nothing out.
        assert await naming(redis, keys, "u-x") != {}
        assert await redis.get(counter) == "2"
        if done:  # the worker's round after its second pass
            await finish_erasure(engine, erasures[0])
            await redis.hdel(keys.erasing, user_hash("u-x", secret))
        if history_first:  # the history consumer leaves e-1 out first
            await Uncount(redis, keys)([e for e in batch if e.user_id == "u-x"])
            assert await redis.get(counter) == "1"

        monkeypatch.setattr(aggregator, "aggregate", aggregate)
        await aggregator.batch_handler(redis, keys, catalog, quiet, FreshRegions())(batch)
        assert sorted(await naming(redis, keys, "u-x")) == []
        assert await naming(redis, keys, "u-2") != {}
        assert await redis.get(counter) == "1"

        # Once more (another crash before the ack): nothing is left to find, nothing is erased.
        erased: list[str] = []
        erase = late_erasures.erase_from_board

        async def counting(*args: Any) -> int:
            erased.append(args[3])
            return await erase(*args)

        monkeypatch.setattr(late_erasures, "erase_from_board", counting)
        await aggregator.batch_handler(redis, keys, catalog, quiet, FreshRegions())(batch)
        assert erased == []
        assert sorted(await naming(redis, keys, "u-x")) == []
        assert await redis.get(counter) == "1"
