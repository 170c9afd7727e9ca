"""The hot view's rankings (shared/lua/hot.lua): each window's users kept ranked in Redis as
events enter and leave it, so that a tick reads its top instead of every user of the window.

The rankings are held to a reference computed here from the events themselves: the users of the
window's events, by average (a double, the sum over the count), then count, then user id, the
board's hidden users left out. The trim is run with a small step, so that one tick takes many
bounded calls, and a millisecond holding more events than a step is taken whole.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from redis.asyncio import Redis

from services.aggregator import live_tracker
from services.aggregator.live_tracker import LiveViews, RecordLive
from shared.boards import MAIN_BOARD, BoardCatalog
from shared.events import ScoreAccepted
from shared.functions import HOT_TRIM_FUNCTION
from shared.keys import Keys
from shared.live_maths import HOT_WINDOWS, TOP
from shared.settings import LadderSettings
from tests.api.helpers import post, score
from tests.helpers import ADMIN, api_client, eventually, made


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database (the erasure needs it)."""
    return quiet


def reference(
    events: list[ScoreAccepted], start: datetime, hidden: set[str]
) -> list[tuple[str, float]]:
    """The top of a window that starts at ``start`` (an event at or before it is outside)."""
    sums: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        if e.occurred_at > start and e.user_id not in hidden:
            sums[e.user_id] += e.value
            counts[e.user_id] += 1
    ranked = sorted(counts, key=lambda u: (-(sums[u] / counts[u]), -counts[u], u))
    return [(u, sums[u] / counts[u]) for u in ranked[:TOP]]


async def shown(redis: Redis, keys: Keys, window: int) -> list[tuple[str, float]]:
    view = json.loads(await redis.get(keys.hot_view("main", window)) or "{}")
    return [(e["user_id"], e["score"]) for e in view.get("entries", [])]


async def test_the_rankings_hold_the_reference_top_as_events_enter_and_leave(
    redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_tracker, "TRIM_STEP", 7)
    rng = random.Random(14)
    now = datetime.now(UTC)
    # 60 users over 58 s of play (the recorder takes events of the last 60 s only): few distinct
    # values (ties of average, broken by count, then user id), zeros and negatives, and a burst
    # of many events in one millisecond.
    users = [f"u-{i:02d}" for i in range(60)]
    events: list[ScoreAccepted] = []
    for _ in range(500):
        at = now - timedelta(milliseconds=rng.randrange(0, 58_000))
        events.append(made(rng.choice(users), rng.choice([-5, 0, 3, 3, 6, 10, 10, 40]), at))
    burst = now - timedelta(seconds=20)
    events += [made(rng.choice(users), rng.choice([3, 10]), burst) for _ in range(30)]
    record = RecordLive(redis, keys, BoardCatalog(redis, keys))
    for start in range(0, len(events), 100):
        await record(events[start : start + 100])
    await redis.sadd(keys.hidden("main"), "u-07", "u-33")
    hidden = {"u-07", "u-33"}

    live = LiveViews(redis, keys)
    for seconds in (0, 3, 9, 19, 20, 21, 35, 52, 61, 75):
        at = now + timedelta(seconds=seconds)
        await live.hot(MAIN_BOARD, now=at)
        for window in HOT_WINDOWS:
            expected = reference(events, at - timedelta(seconds=window), hidden)
            assert await shown(redis, keys, window) == expected, (seconds, window)
    # Every event has left both windows: nothing is ranked, nothing summed, no event kept.
    for window in HOT_WINDOWS:
        assert await redis.zcard(keys.hot_rank("main", window)) == 0
        assert await redis.hkeys(keys.hot_window("main", window)) == ["at"]
    assert await redis.zcard(keys.hot_events("main")) == 0


async def test_sums_past_64_bits_keep_the_averages_of_scores_in_range(
    redis: Redis, keys: Keys
) -> None:
    """A score is any integer within ±(2**53 - 1) (docs/api.md section 1), and a user may send
    some 1,240 events a minute within its rate limits: a window's sum of them passes what a
    64-bit integer holds (9.2e18), though the average stays in range. Every event is recorded,
    none refused, and the averages are the reference's as events enter and leave."""
    now = datetime.now(UTC)
    most = 2**53 - 1
    events: list[ScoreAccepted] = []
    for i in range(1_100):  # 55 s of play, 20 events a second
        at = now - timedelta(milliseconds=50 * i + 1)
        events.append(made("u-max", most, at))
        events.append(made("u-min", -most, at))
        events.append(made("u-alternate", most if i % 2 else most - 2, at))
    events += [made("u-small", 7, now - timedelta(seconds=s)) for s in (2, 30)]
    record = RecordLive(redis, keys, BoardCatalog(redis, keys))
    for start in range(0, len(events), 300):
        await record(events[start : start + 300])
    assert await redis.zcard(keys.hot_events("main")) == len(events)
    live = LiveViews(redis, keys)
    for seconds in (0, 5, 30, 50, 58):
        at = now + timedelta(seconds=seconds)
        await live.hot(MAIN_BOARD, now=at)
        for window in HOT_WINDOWS:
            expected = reference(events, at - timedelta(seconds=window), set())
            assert await shown(redis, keys, window) == expected, (seconds, window)


async def test_a_trim_call_takes_a_bounded_step_even_within_one_millisecond(
    redis: Redis, keys: Keys
) -> None:
    """300 events stamped with one millisecond (a batch), and 40 a millisecond apart, leave both
    windows in calls of a step of 10 each: none takes the whole millisecond at once."""
    now = datetime.now(UTC).replace(microsecond=0)
    events = [made(f"u-{i % 7}", 10 + i % 3, now - timedelta(seconds=46)) for i in range(300)]
    events += [
        made(f"u-{i % 4}", 7, now - timedelta(seconds=50, milliseconds=-i)) for i in range(40)
    ]
    events.append(made("u-late", 1, now + timedelta(seconds=10)))  # inside both, 15 s on
    await RecordLive(redis, keys, BoardCatalog(redis, keys))(events)
    call_keys = [*live_tracker.hot_keys(keys, "main"), keys.hidden("main")]
    at_ms = int((now + timedelta(seconds=15)).timestamp() * 1000)
    starts = [at_ms - w * 1000 for w in HOT_WINDOWS]
    replies: list[Any] = []
    left = [await redis.zcard(keys.hot_events("main"))]
    while not replies or not int(replies[-1][0]):
        replies.append(
            await redis.fcall(
                HOT_TRIM_FUNCTION, len(call_keys), *call_keys, 120_000, 10, TOP, *starts
            )
        )
        left.append(await redis.zcard(keys.hot_events("main")))
    taken = [before - after for before, after in pairwise(left)]
    # Each call takes at most the step, or a little more where events share a position (1024
    # a millisecond); the 340 events take some 35 calls, not one.
    assert len(replies) >= 30
    assert max(taken) <= 16, taken
    assert sum(taken) == 340
    for window, top in zip(HOT_WINDOWS, replies[-1][1:], strict=True):
        assert [member.rpartition("|")[2] for member in top[::2]] == ["u-late"], window
        assert await redis.hget(keys.hot_window("main", window), "c:u-late") == "1"
        assert len(await redis.hkeys(keys.hot_window("main", window))) == 3  # at, s:, c:
    assert left[-1] == 1


async def test_a_window_kept_before_rankings_gets_its_ranking_from_its_sums(
    redis: Redis, keys: Keys
) -> None:
    """Windows written before rankings were (hashes alone): the first call ranks them."""
    now = datetime.now(UTC)
    start_ms = int(now.timestamp() * 1000) - 60_000
    for window in HOT_WINDOWS:
        await redis.hset(
            keys.hot_window("main", window),
            mapping={
                "at": start_ms,
                "s:u-a": 30,
                "c:u-a": 3,
                "s:u-b": 50,
                "c:u-b": 2,
                "s:u-c": 10,
                "c:u-c": 1,
            },
        )
    # A new event of u-c (value 30: sum 40 over 2, ties u-b's 25 on count, then by id).
    fresh = made("u-c", 30, now - timedelta(seconds=1))
    await RecordLive(redis, keys, BoardCatalog(redis, keys))([fresh])
    await LiveViews(redis, keys).hot(MAIN_BOARD, now=now)
    for window in HOT_WINDOWS:
        assert await shown(redis, keys, window) == [("u-b", 25.0), ("u-c", 20.0), ("u-a", 10.0)]


async def test_an_erased_user_leaves_the_rankings(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, score(user_id="u-1", value=50))
        await post(client, score(user_id="u-2", value=10))
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        accepted = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
        await RecordLive(redis, keys, BoardCatalog(redis, keys))(accepted)
        live = LiveViews(redis, keys)
        await live.hot(MAIN_BOARD)
        assert [u for u, _ in await shown(redis, keys, 60)] == ["u-1", "u-2"]

        assert (await client.delete("/v1/users/u-1", headers=ADMIN)).status_code == 202

        async def erased() -> bool:
            answer = await client.get("/v1/erasures/u-1", headers=ADMIN)
            return bool(answer.json()["status"] == "done")

        await eventually(erased, within=15)
        await live.hot(MAIN_BOARD)
    assert [u for u, _ in await shown(redis, keys, 60)] == ["u-2"]
    for window in HOT_WINDOWS:
        ranked = await redis.zrange(keys.hot_rank("main", window), 0, -1)
        assert [member.rpartition("|")[2] for member in ranked] == ["u-2"]


def test_the_reference_is_what_the_docs_say() -> None:
    """Higher average first, then more events, then the smaller id; hidden users left out."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    events = [
        made("b", 10, t0),
        made("b", 10, t0),
        made("a", 10, t0),
        made("c", 30, t0),
        made("c", 0, t0),
        made("h", 99, t0),
    ]
    start = t0 - timedelta(seconds=1)
    assert reference(events, start, {"h"}) == [("c", 15.0), ("b", 10.0), ("a", 10.0)]
    assert reference(events, t0, set()) == []
