"""The event's record under its board, user and id (docs/architecture.md, "Idempotency"): the
first answer kept compactly, the consumers' seen marks in it, records of the layouts before
(under the id alone) still answered and marked, and what an accepted event keeps in Redis for a
day."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from services.aggregator.derive import Derive
from services.aggregator.handlers import MarkDirty, aggregate
from services.aggregator.live_tracker import RecordLive
from services.api.write.models import ScoreIn
from services.notifier.handlers import SEEN_TTL_SECONDS, Notify
from shared.boards import BoardCatalog
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, SCORES, get_ok, post, rfc, score
from tests.helpers import SERVER, api_client

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

BATCH = "/v1/boards/main/scores/batch"
# The consumers' bits (SETBIT offsets) in the marks byte '@' that starts a record
# (shared/lua/live.lua, SEEN_BITS), and the derive-pending bit the write sets ('D') and the
# aggregator's derive step clears (PENDING_BIT).
NOTIFIER_BIT, AGGREGATOR_BIT, PENDING_BIT = 6, 7, 5
KEPT_TARGET = 250


async def outbox(redis: Redis, keys: Keys) -> list[ScoreAccepted]:
    entries: list[Any] = await redis.xrange(keys.outbox("main"))
    return [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]


async def consume(redis: Redis, keys: Keys, events: list[ScoreAccepted]) -> None:
    """Hand ``events`` to the aggregator's and the notifier's handlers, as their mains wire
    them."""
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    derive = Derive(redis, keys, catalog, LadderSettings().feed_length)
    await aggregate(derive, MarkDirty(redis, keys), RecordLive(redis, keys, catalog))(events)
    await Notify(redis, keys, catalog)(events)


def without_duplicate(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "duplicate"}


async def test_a_duplicate_answers_the_first_answer_exactly(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    # A first score (no previous rank), a negative total, an unchanged one (improved false),
    # a large one, and a second user's that moves u-1 down: every field of the compact record.
    bodies = [
        score(event_id="r-1", value=5, team_id="red"),
        score(event_id="r-2", value=-1_000_000),
        score(event_id="r-3", value=0, display_name="Ana"),
        score(event_id="r-4", user_id="u-2", value=999_999, region="eu"),
        score(event_id="r-5", value=1_000_000, occurred_at=rfc(datetime.now(UTC))),
    ]
    async with api_client(quiet) as client:
        firsts = [await post(client, body) for body in bodies]
        agains = [await post(client, body) for body in bodies]
        batch = await client.post(BATCH, json={"events": bodies}, headers=SERVER)
        board = await get_ok(client, LEADERBOARD, scope="region:eu")
    assert [f["duplicate"] for f in firsts] == [False] * 5
    assert firsts[1]["periods"]["daily"]["score"] == -999_995
    assert firsts[2]["periods"]["alltime"]["improved"] is False
    assert firsts[0]["periods"]["weekly"]["previous_rank"] is None
    for first, again, batched in zip(firsts, agains, batch.json()["results"], strict=True):
        assert again["duplicate"] is True and batched["duplicate"] is True
        assert without_duplicate(again) == without_duplicate(first)
        assert without_duplicate(batched) == without_duplicate(first)
    assert [(e["user_id"], e["score"]) for e in board["entries"]] == [
        ("u-2", 999_999),
        ("u-1", 5),
    ]
    record = await redis.get(keys.idempotency("main", "r-1", "u-1"))
    # The marks byte with the derive-pending bit alone: the aggregator has not derived it yet.
    assert record is not None and record.startswith("D") and len(record) < 110


async def test_a_late_retry_and_another_body_read_the_compact_record(
    quiet: LadderSettings,
) -> None:
    settings = quiet.model_copy(update={"allowed_lateness": 1.0})
    occurred = rfc(datetime.now(UTC))
    body = score(event_id="late-1", value=7, occurred_at=occurred)
    async with api_client(settings) as client:
        first = await post(client, body)
        # Past the allowed lateness: answered from the record, before the time is refused.
        settings_late = datetime.now(UTC) + timedelta(seconds=1.5)
        while datetime.now(UTC) < settings_late:
            await get_ok(client, LEADERBOARD, scope="region:eu")
        again = await post(client, body)
        other = await client.post(SCORES, json=body | {"value": 8}, headers=SERVER)
    assert again == first | {"duplicate": True}
    assert other.status_code == 409


def legacy_record(body: dict[str, Any], event_id: str) -> str:
    """A record of the layout before: the body hash in 32 hex digits, then the outbox entry."""
    canonical = ScoreIn.model_validate(body).model_dump(mode="json", exclude={"event_id"})
    for optional in ("subscore", "metadata"):
        if canonical[optional] is None:
            del canonical[optional]
    digest = hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()
    entry = {
        "event_id": event_id,
        "board_id": "main",
        "user_id": body["user_id"],
        "region": body["region"],
        "team_id": body.get("team_id"),
        "value": body["value"],
        "occurred_at": "2026-11-29T17:00:00Z",
        "accepted_at": "2026-11-29T17:00:00Z",
        "periods": {
            "alltime": {
                "period_id": "all",
                "score": 125,
                "rank": 3,
                "previous_rank": 5,
                "improved": True,
                "pushed_out": {},
            },
            "daily": {
                "period_id": "2026-11-29",
                "score": 25,
                "rank": 1,
                "previous_rank": None,
                "improved": False,
                "pushed_out": {"1": "u-9"},
            },
        },
    }
    return digest[:32] + "\n" + orjson.dumps(entry).decode()


async def test_a_record_of_the_first_layout_still_answers(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    body = score(event_id="old-1", value=25, team_id="red")
    stored = legacy_record(body, "old-1")
    # Under the id alone, as every record before ids were scoped to users.
    await redis.set(keys.legacy_idempotency("main", "old-1"), stored, ex=3600)
    async with api_client(quiet) as client:
        again = await post(client, body)
        other = await client.post(SCORES, json=body | {"value": 26}, headers=SERVER)
        # It names no user: while it lasts, another user's event of its id is refused as before
        # the upgrade, rather than risk counting its own event twice.
        another = await client.post(SCORES, json=body | {"user_id": "u-2"}, headers=SERVER)
        board = await get_ok(client, LEADERBOARD, scope="region:eu")
    assert again == {
        "event_id": "old-1",
        "duplicate": True,
        "board_id": "main",
        "user_id": "u-1",
        "region": "eu",
        "periods": {
            "daily": {
                "period_id": "2026-11-29",
                "score": 25,
                "rank": 1,
                "previous_rank": None,
                "improved": False,
            },
            "alltime": {
                "period_id": "all",
                "score": 125,
                "rank": 3,
                "previous_rank": 5,
                "improved": True,
            },
        },
    }
    assert other.status_code == 409 and another.status_code == 409
    assert board["entries"] == []
    # Its consumers mark it with seen keys of that layout, leaving the record as it was, and
    # make no record under the user's id.
    event = ScoreAccepted.model_validate_json(stored.partition("\n")[2])
    await consume(redis, keys, [event])
    assert await redis.get(keys.legacy_idempotency("main", "old-1")) == stored
    assert await redis.exists(keys.seen("main", "notifier", "old-1"))
    assert await redis.exists(keys.seen("main", "aggregator", "old-1"))
    assert not await redis.exists(keys.idempotency("main", "old-1", "u-1"))


async def test_an_event_accepted_before_ids_were_per_user_counts_once(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """An event the write of the layout before accepted (its record under the id alone, derive
    pending), still in flight at the upgrade: a retry is its duplicate, another body 409; its
    consumers find and mark that record, and the aggregator derives it exactly once."""
    async with api_client(quiet) as client:
        first = await post(client, score(event_id="up-1", value=30, team_id="red"))
        [event] = await outbox(redis, keys)
        # Moved to where the write of the layout before kept it, as the upgrade finds it.
        await redis.rename(
            keys.idempotency("main", "up-1", "u-1"), keys.legacy_idempotency("main", "up-1")
        )
        again = await post(client, score(event_id="up-1", value=30, team_id="red"))
        other = await client.post(SCORES, json=score(event_id="up-1", value=31), headers=SERVER)
        await consume(redis, keys, [event])
        await consume(redis, keys, [event, event])
        feed = await get_ok(client, "/v1/boards/main/feed")
    assert again == first | {"duplicate": True}
    assert other.status_code == 409
    legacy = await redis.get(keys.legacy_idempotency("main", "up-1"))
    # Both consumers' bits set and the derive-pending bit cleared, in the old record.
    assert legacy is not None and legacy[0] == "C"
    assert not await redis.exists(keys.idempotency("main", "up-1", "u-1"))
    assert [e["event_id"] for e in feed["events"]] == ["up-1"]
    assert await redis.zscore(keys.team_members("main", "alltime", "all", "red"), "u-1") == 30


async def test_consumers_mark_the_record_once_and_keep_it_a_day(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    settings = quiet.model_copy(update={"idempotency_ttl_seconds": 60})
    async with api_client(settings) as client:
        await post(client, score(event_id="m-1", value=40, team_id="red"))
        events = await outbox(redis, keys)
        record = keys.idempotency("main", "m-1", "u-1")
        before = await redis.get(record)
        assert 0 < await redis.ttl(record) <= 60
        await consume(redis, keys, events)
        await consume(redis, keys, events + events)
        again = await post(client, score(event_id="m-1", value=40, team_id="red"))
    marked = await redis.get(record)
    # Written derive-pending ('D'); consumed: both seen bits set and the pending bit cleared
    # ('C'), the answer after them untouched.
    assert before is not None and before[0] == "D" and marked == "C" + before[1:]
    assert await redis.getbit(record, PENDING_BIT) == 0
    assert await redis.getbit(record, NOTIFIER_BIT) == await redis.getbit(record, AGGREGATOR_BIT)
    # A redelivery within a day of handling is known, however short the idempotency TTL.
    assert await redis.ttl(record) > SEEN_TTL_SECONDS - 60
    assert again["duplicate"] is True
    assert await redis.zscore(keys.team_members("main", "alltime", "all", "red"), "u-1") == 40
    assert not [k async for k in redis.scan_iter(match=f"{keys.tag('main')}:seen:*")]


async def test_an_event_without_a_record_gets_one_of_marks_alone(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    event = ScoreAccepted(
        event_id="gone-1",
        board_id="main",
        user_id="u-1",
        region="eu",
        team_id="red",
        value=3,
        occurred_at=now,
        accepted_at=now,
        periods={},
    )
    await consume(redis, keys, [event])
    await consume(redis, keys, [event])
    record = keys.idempotency("main", "gone-1", "u-1")
    assert await redis.get(record) == "C"
    assert SEEN_TTL_SECONDS - 60 < await redis.ttl(record) <= SEEN_TTL_SECONDS
    # Marks alone are no answer: a write of that id is a first acceptance (its answer had
    # expired), and its record starts its marks again.
    async with api_client(quiet) as client:
        answer = await post(client, score(event_id="gone-1", value=3))
    assert answer["duplicate"] is False
    stored = await redis.get(record)
    assert stored is not None and stored.startswith("D") and len(stored) > 17


async def test_an_event_keeps_at_most_250_bytes_in_redis(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Measured as bench/phases/sizes.py does, with MEMORY USAGE, on board main (four periods)
    with teams, after every consumer handled every event."""
    run = uuid.uuid4().hex[:6]
    events = [
        score(
            event_id=f"{run}-{i % 4}-{i}",
            user_id=f"u{i % 150}",
            region=f"r{i % 3}",
            team_id=f"t{i % 10}",
            value=1 + i * 37 % 1000,
        )
        for i in range(600)
    ]
    async with api_client(quiet) as client:
        answer = await client.post(BATCH, json={"events": events}, headers=SERVER)
        assert answer.status_code == 200, answer.text
    await consume(redis, keys, await outbox(redis, keys))
    records = [k async for k in redis.scan_iter(match=f"{keys.tag('main')}:idem:*")]
    seen = [k async for k in redis.scan_iter(match=f"{keys.tag('main')}:seen:*")]
    async with redis.pipeline(transaction=False) as pipe:
        for key in records:
            pipe.memory_usage(key, samples=0)
        sizes: list[Any] = await pipe.execute()
    assert len(records) == 600 and seen == []
    assert [await redis.getbit(key, NOTIFIER_BIT) for key in records[:20]] == [1] * 20
    assert sum(sizes) / len(sizes) <= KEPT_TARGET
