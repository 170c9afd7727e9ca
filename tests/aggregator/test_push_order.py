"""The aggregator's pushes and the state that says they were made: a top-10 fingerprint, a live
view's stored value. A push whose PUBLISH fails (on Redis Cluster a channel's slot is not the
board's: its primary may fail over while the board's answers) leaves that state as it was, so
the next look at the view pushes it, whether or not it changed again meanwhile; a merge's pushes
and rank messages that did not go out are made by the next tick, without another merge. Two
aggregators pushing one view's top never push an older top after a newer one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from services.aggregator import pass_pushes, tops
from services.aggregator.fresh import FreshRegions
from services.aggregator.handlers import MarkDirty
from services.aggregator.live_tracker import LiveViews
from services.aggregator.main import merges
from services.aggregator.merge import Merger
from services.aggregator.tops import fingerprint_of
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import MAIN_BOARD, Board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.periods import window_at
from shared.settings import LadderSettings
from tests.aggregator.test_live_views import consumer, outbox, post, recorder
from tests.api.helpers import add_board
from tests.api.test_reads import at
from tests.helpers import api_client, derive, made, refused_publishes
from tests.notifier.test_badges import listening


def users(messages: list[dict[str, Any]]) -> list[list[str]]:
    return [[e["user_id"] for e in m["entries"]] for m in messages]


async def refused(channel: Any, message: Any) -> int:
    """``Redis.publish`` with the channel's node out of reach."""
    raise RedisConnectionError(f"the node of {channel!r} is failing over")


async def unreachable(*args: Any, **kwargs: Any) -> list[int]:
    """``tops.publish_tops`` with the board's node out of reach."""
    raise RedisConnectionError("the board's node is failing over")


@contextlib.contextmanager
def refused_pushes() -> Iterator[None]:
    """Within: every PUBLISH queued in a pipeline is refused (a user's channel's node failing
    over: tests.helpers.refused_publishes), and every top-10 push fails, which the board's node
    makes with its fingerprint in one step (services/aggregator/tops.py)."""
    with refused_publishes(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(tops, "publish_tops", unreachable)
        yield


class Catalog:
    """Board main alone, as the ticker asks for boards."""

    async def all(self) -> list[Board]:
        return [MAIN_BOARD]


async def test_a_top_whose_push_failed_is_pushed_by_the_next_pass(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=10)
    fresh = FreshRegions()
    fresh.add("main", "alltime", "all", "eu")
    fingerprint = keys.last_top("main", "alltime", "all", "region:eu")
    async with listening(redis, keys.board_channel("main", "region:eu", "alltime")) as channel:
        with refused_pushes(), pytest.raises(RedisConnectionError):
            await fresh.push(redis, keys, MAIN_BOARD)
        assert await redis.get(fingerprint) is None
        assert await channel.drain() == []
        # Nothing changed since, and no event came: the next pass pushes the top all the same.
        assert await fresh.push(redis, keys, MAIN_BOARD) == 1
        assert users(await channel.drain()) == [["u-1"]]
        assert await redis.get(fingerprint) is not None
        # Pushed now: looked at again, it is not pushed twice.
        fresh.add("main", "alltime", "all", "eu")
        await fresh.push(redis, keys, MAIN_BOARD)
        assert await channel.drain() == []


async def test_a_hot_view_whose_push_failed_is_pushed_by_the_next_pass(
    redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    await recorder(redis, keys)([made("u-1", 7, now - timedelta(seconds=1))])
    live = LiveViews(redis, keys)
    async with listening(redis, keys.board_channel("main", "hot", "10")) as channel:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis, "publish", refused)
            with pytest.raises(RedisConnectionError):
                await live.hot(MAIN_BOARD, now=now)
        # Put back as it was: none stored yet.
        assert await redis.get(keys.hot_view("main", 10)) is None
        assert await channel.drain() == []
        assert await live.hot(MAIN_BOARD, now=now) == 2  # both windows, the 10 s one again
        assert users(await channel.drain()) == [["u-1"]]


async def test_an_emptied_hot_view_whose_push_failed_is_pushed_by_the_next_tick(
    redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    await recorder(redis, keys)([made("u-1", 7, now - timedelta(seconds=1))])
    live = LiveViews(redis, keys)
    async with listening(redis, keys.board_channel("main", "hot", "10")) as channel:
        await live.hot(MAIN_BOARD, now=now)
        assert users(await channel.drain()) == [["u-1"]]
        # A minute on the event has left both windows and the hot set: the views empty out.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis, "publish", refused)
            with pytest.raises(RedisConnectionError):
                await live.hot(MAIN_BOARD, now=now + timedelta(seconds=65))
        assert await redis.zcard(keys.hot_events("main")) == 0
        # No hot event is left, but the board's view still shows u-1: the ticker computes it
        # again rather than taking it for a quiet board, and pushes the empty view.
        await live.tick([MAIN_BOARD])
        assert users(await channel.drain()) == [[]]


async def test_mvps_whose_push_failed_are_pushed_by_the_next_pass(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    live = LiveViews(redis, keys)
    record = consumer(redis, keys)
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=30, team_id="red")
        await record(await outbox(redis, keys))
        assert await live.mvps(MAIN_BOARD) == len(MAIN_BOARD.periods)  # a full pass
        await post(client, user_id="u-2", value=50, team_id="red")
        await record((await outbox(redis, keys))[1:])
    view = keys.mvp_view("main", "alltime")
    stored = await redis.get(view)
    async with listening(redis, keys.board_channel("main", "mvps", "alltime")) as channel:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis, "publish", refused)
            with pytest.raises(RedisConnectionError):
                await live.mvps(MAIN_BOARD)
        assert await redis.get(view) == stored  # put back as it was
        assert await channel.drain() == []
        # Not a full pass (one was made seconds ago): the marks the failed pass took are back.
        assert await live.mvps(MAIN_BOARD) == len(MAIN_BOARD.periods)
        assert users(await channel.drain()) == [["u-2", "u-1"]]


async def marked(redis: Redis, keys: Keys) -> None:
    """The outbox's events as the aggregator's consumer leaves them for the merge."""
    entries: list[Any] = await redis.xrange(keys.outbox("main"))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    await derive(redis, keys, MAIN_BOARD, events, 50)
    await MarkDirty(redis, keys)(events)


async def test_a_merge_s_pushes_that_failed_are_made_by_the_next_tick_without_a_merge(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-a", value=10, occurred_at=at(1))
    await marked(redis, keys)
    merger = Merger(redis, keys)
    channels = (keys.board_channel("main", "global", "alltime"), keys.user_channel("u-a"))
    async with listening(redis, channels[0]) as top, listening(redis, channels[1]) as ranks:
        with refused_pushes():
            assert await merger.merge_board(MAIN_BOARD) > 0  # merged; nothing went out
        assert await top.drain() == [] and await ranks.drain() == []
        assert await redis.get(keys.last_top("main", "alltime", "all", "global")) is None

        # The next tick: nothing left to merge, and the pushes go out all the same.
        once = asyncio.Event()
        once.set()
        await merges(merger, Catalog(), 0.05, once)  # type: ignore[arg-type]
        assert not await redis.exists(keys.dirty("main"), keys.dirty_merging("main"))
        assert users(await top.drain()) == [["u-a"]]
        entered = [(m["period"], m["reason"], m["rank"]) for m in await ranks.drain()]
        assert sorted(entered) == [
            (period, "entered_top", 1) for period in sorted(MAIN_BOARD.periods)
        ]
        # Made once: the tick after pushes nothing again.
        await merges(merger, Catalog(), 0.05, once)  # type: ignore[arg-type]
        assert await top.drain() == [] and await ranks.drain() == []


async def test_rank_messages_refused_for_too_long_are_given_up(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-a", value=10, occurred_at=at(1))
    await marked(redis, keys)
    merger = Merger(redis, keys)
    async with listening(redis, keys.user_channel("u-a")) as ranks:
        with refused_publishes():
            await merger.merge_board(MAIN_BOARD)
        monkeypatch.setattr(pass_pushes, "RANK_RETRY_SECONDS", 0.0)
        await asyncio.sleep(0.01)
        await merger.push_fresh(MAIN_BOARD)
        assert await ranks.drain() == []


class PausedPush:
    """A Redis client whose top-10 push waits at ``gate`` once it has read the view's top (its
    two reads are the first two pipelines; the push is the third): an aggregator paused between
    reading a top and pushing it."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pipelines = 0
        self.gate = asyncio.Event()
        self.reached = asyncio.Event()

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self._redis.pipeline(transaction=transaction)
        self._pipelines += 1
        if self._pipelines == 3:
            send = pipe.execute

            async def held(*args: Any, **kwargs: Any) -> Any:
                self.reached.set()
                await self.gate.wait()
                return await send(*args, **kwargs)

            pipe.execute = held  # type: ignore[method-assign]
        return pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)


async def test_an_older_top_is_never_pushed_after_a_newer_one(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Two aggregators push region eu's top (each the region its own batches touched): the
    first reads [u-1] and is held before its push; meanwhile u-2 tops the view and the second
    pushes [u-2, u-1]. The first's push, of the top it read before, must not follow."""
    fingerprint = keys.last_top("main", "alltime", "all", "region:eu")
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=10)
        async with listening(redis, keys.board_channel("main", "region:eu", "alltime")) as eu:
            one, two = FreshRegions(), FreshRegions()
            one.add("main", "alltime", "all", "eu")
            paused = PausedPush(redis)
            first = asyncio.create_task(one.push(paused, keys, MAIN_BOARD))  # type: ignore[arg-type]
            await asyncio.wait_for(paused.reached.wait(), 5)

            await post(client, user_id="u-2", value=20)
            two.add("main", "alltime", "all", "eu")
            await two.push(redis, keys, MAIN_BOARD)
            paused.gate.set()
            await first
            assert users(await eu.drain()) == [["u-2", "u-1"]]
    # What was pushed last is what the fingerprint holds: the view's top now.
    pushed = fingerprint_of(await redis.get(fingerprint))
    assert [e["user_id"] for e in orjson.loads(pushed or "[]")] == ["u-2", "u-1"]


MINUTES = Board(board_id="cup", periods=("season",), schedule="* * * * *", regions=("eu",))


async def test_a_topic_pushes_its_current_period_s_top_and_no_late_event_s_older_one(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A topic names a period kind, not an id: a late event's change to the period before (or an
    event ahead of the clock's to the next one) would push that period's top on the same channel,
    an older top after the current one. Only the current period's is pushed; a period's final
    top comes in its period_closed push."""
    await add_board(redis, keys, MINUTES)
    if datetime.now(UTC).second >= 50:  # the current season (a minute) must outlast the test
        await asyncio.sleep(61 - datetime.now(UTC).second)
    now = datetime.now(UTC)
    current = window_at("season", now, "UTC", MINUTES.schedule)
    scopes = ("global", "region:eu")
    merger = Merger(redis, keys)
    async with (
        listening(redis, keys.board_channel("cup", scopes[0], "season")) as top,
        listening(redis, keys.board_channel("cup", scopes[1], "season")) as eu,
    ):
        for n, (user, moment) in enumerate(
            [("a", now), ("b", current.start - timedelta(seconds=5))]
        ):
            score = ScoreIn(user_id=user, region="eu", value=10 + n, occurred_at=moment)
            await submit(redis, keys, settings, MINUTES, score, f"e-{n}")
            entries: list[Any] = await redis.xrange(keys.outbox("cup"))
            events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries[-1:]]
            await derive(redis, keys, MINUTES, events, 50)
            await MarkDirty(redis, keys)(events)
            assert await merger.merge_board(MINUTES) > 0
        for channel in (top, eu):
            pushed = await channel.drain()
            assert [(m["period_id"], users([m])[0]) for m in pushed] == [(current.period_id, ["a"])]
