"""What the aggregator's tickers cost for a board with nothing to do, against real Redis: the
merge pass probes every board in one round trip, merges only those with marks or a merging set
and builds only those with a dense build asked for; the closer, having found nothing due on a
board, looks at it again only when the earliest of its current periods comes due, or once its
definition changes; the board catalog parses a definition once while its stored text stays the
same; and the live views' pass computes a hot view that was empty again only once its board
has a hot event, the API answering for the others as of the pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import orjson
import websockets
from redis.asyncio import Redis

from services.aggregator.closer import Closer
from services.aggregator.live_tracker import LiveViews, RecordLive
from services.aggregator.merge import Merger
from shared.boards import MAIN_BOARD, Board, BoardCatalog
from shared.keys import Keys
from shared.lease import Lease
from shared.live_maths import hot_current, hot_message
from shared.periods import PeriodWindow, window_at
from shared.settings import DEV_SERVER_KEY, LadderSettings
from tests.aggregator.test_live_views import subscribe
from tests.helpers import made, serve


async def test_the_merge_probe_names_the_boards_with_work_and_no_other(
    redis: Redis, keys: Keys
) -> None:
    boards = [f"b{i:02}" for i in range(30)]
    await redis.sadd(keys.dirty("b03"), "alltime|all|eu|u-1")
    await redis.sadd(keys.dirty_merging("b11"), "alltime|all|eu|u-2")
    await redis.sadd(keys.dense_build("b27"), "alltime|all|global")

    merger = Merger(redis, keys)
    assert await merger.with_work(boards) == ({"b03", "b11"}, {"b27"})
    assert await merger.with_work([]) == (set(), set())


async def test_a_board_finished_elsewhere_is_behind_no_more(redis: Redis, keys: Keys) -> None:
    """A pass that left a board partway marks it behind, and the ticker goes again at once while
    any board is; if another aggregator (having taken the lease) drains it meanwhile, the probe
    that finds nothing there takes it off, or the ticker would spin."""
    merger = Merger(redis, keys)
    merger.behind.update({"b01", "b02"})
    await redis.sadd(keys.dirty_merging("b02"), "alltime|all|eu|u-2")

    assert await merger.with_work(["b01", "b02"]) == ({"b02"}, set())
    assert merger.behind == {"b02"}


class Counting(Closer):
    """A closer that counts its looks at a board's periods (each one a Redis round trip)."""

    looks = 0

    async def _due(self, board: Board, current: PeriodWindow) -> list[PeriodWindow]:
        self.looks += 1
        return await super()._due(board, current)


async def test_the_closer_looks_at_a_quiet_board_again_only_once_a_period_comes_due(
    redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="quiet", periods=("daily", "weekly", "alltime"))
    await BoardCatalog(redis, keys).put(board)  # a close writes for a defined board alone
    closer = Counting(redis, keys, lateness=2, merge_interval=0.2, size=10, outbox_max=100)
    now = datetime.now(UTC)
    # The first looks close the latest day and week (none closed before; nobody scored), in
    # two steps, a tick each; the third finds nothing due.
    for _ in range(3):
        await closer.close_board(board, now)
    looked = closer.looks

    # Nothing is due now: later ticks make no round trip, until the day (the closer's current
    # one, 3.2 s behind) ends and its 3.2 s pass. (Ticks at fixed offsets would reach the next
    # day when the test runs near midnight.)
    day = window_at("daily", now - timedelta(seconds=3.2), "UTC")
    assert day.end is not None
    quiet = day.end + timedelta(seconds=3.2) - now
    for share in (0.01, 0.5, 0.99):
        assert await closer.close_board(board, now + quiet * share) == 0
    assert closer.looks == looked
    await closer.close_board(board, day.end + timedelta(seconds=4))
    assert closer.looks > looked

    # A changed definition is looked at at once.
    looked = closer.looks
    await closer.close_board(board.model_copy(update={"timezone": "Asia/Tokyo"}), now)
    assert closer.looks > looked


async def test_the_catalog_parses_a_definition_once_while_it_stays_the_same(
    redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(Board(board_id="one"))
    await catalog.put(Board(board_id="two"))
    first = await catalog.all()
    again = await catalog.all()
    assert [b.board_id for b in again] == ["one", "two"]
    assert all(a is b for a, b in zip(first, again, strict=True))

    await catalog.put(Board(board_id="two", operator="incr"))
    changed = await catalog.all()
    assert changed[0] is first[0]
    assert changed[1].operator == "incr"


class CountingHot(LiveViews):
    """Live views that note each board whose hot view they compute (a trim call, then a
    ``SET ... GET`` a window), and each whose MVPs they look at."""

    computed: list[str]
    looked: list[str]

    async def hot(self, board: Board, now: datetime | None = None) -> int:
        self.computed.append(board.board_id)
        return await super().hot(board, now)

    async def mvps(self, board: Board, now: datetime | None = None) -> int:
        self.looked.append(board.board_id)
        return await super().mvps(board, now)


async def test_a_board_without_hot_events_is_computed_once_then_left_until_one_comes(
    redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    other = Board(board_id="other", periods=("alltime",))
    live = CountingHot(redis, keys)
    live.computed, live.looked = [], []

    # Both views are computed empty once; then neither, while no event comes.
    await live.tick([MAIN_BOARD, other])
    await live.tick([MAIN_BOARD, other])
    assert live.computed == [MAIN_BOARD.board_id, other.board_id]
    # An event on main: its view is computed again each pass while the event is in its windows.
    await RecordLive(redis, keys, catalog)([made("u-1", 5, datetime.now(UTC))])
    await live.tick([MAIN_BOARD, other])
    await live.tick([MAIN_BOARD, other])
    assert live.computed == [MAIN_BOARD.board_id, other.board_id, "main", "main"]
    stored = await redis.get(keys.hot_view("main", 60))
    assert [e["user_id"] for e in orjson.loads(stored)["entries"]] == ["u-1"]

    # The pass's time is when the boards left alone were last found quiet: the answer for
    # `other` (its stored view gone, as after two minutes) is empty as of then.
    quiet = await redis.get(keys.live_quiet())
    assert quiet is not None and 0 < await redis.ttl(keys.live_quiet()) <= 120
    await redis.delete(keys.hot_view("other", 60))
    assert hot_current("other", 60, None, quiet) == hot_message("other", 60, quiet, [])


async def test_the_hot_read_and_a_new_subscriber_see_a_quiet_board_as_of_the_last_pass(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    hot, topic = "/v1/boards/main/hot", "leaderboard:main:hot:10"
    before, after = "2026-12-04T16:00:00.000Z", "2026-12-04T16:00:04.000Z"
    entry = {"rank": 1, "user_id": "u-1", "score": 5.0}
    async with serve(quiet) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        api = url.replace("ws://", "http://").removesuffix("/v1/ws")
        async with httpx.AsyncClient(base_url=api) as client:
            # No aggregator yet: no time, no entries, nothing sent on subscribing.
            nothing = (await client.get(hot, params={"window": 10})).json()
            assert await subscribe(ws, topic) == []
            # A pass found main without events after its empty view was stored.
            await redis.set(
                keys.hot_view("main", 10), orjson.dumps(hot_message("main", 10, before, []))
            )
            await redis.set(keys.live_quiet(), after)
            empty = (await client.get(hot, params={"window": 10})).json()
            await ws.send(orjson.dumps({"op": "unsubscribe", "topic": topic}).decode())
            [sent] = await subscribe(ws, topic)
            # The stored view gone (two minutes on): the same answer.
            await redis.delete(keys.hot_view("main", 10))
            gone = (await client.get(hot, params={"window": 10})).json()
            # A view with entries is as of when it was computed, whatever the pass's time.
            await redis.set(
                keys.hot_view("main", 10), orjson.dumps(hot_message("main", 10, before, [entry]))
            )
            full = (await client.get(hot, params={"window": 10})).json()
    assert (nothing["as_of"], nothing["entries"]) == (None, [])
    assert (empty["as_of"], empty["entries"]) == (after, [])
    assert sent == hot_message("main", 10, after, [])
    assert (gone["as_of"], gone["entries"]) == (after, [])
    assert (full["as_of"], full["entries"]) == (before, [entry])


async def test_mvps_are_looked_at_where_contributions_marked_them_or_when_all_are_due(
    redis: Redis, keys: Keys
) -> None:
    live = CountingHot(redis, keys)
    live.computed, live.looked = [], []
    boards = [MAIN_BOARD, Board(board_id="other", periods=("alltime",))]

    await live.tick(boards)  # the first pass computes all of every incr board's
    await live.tick(boards)  # nothing marked, none due
    await redis.sadd(keys.mvp_dirty("other"), "alltime|all")
    await live.tick(boards)
    assert live.looked == ["main", "other", "other"]


class CountingHolds(Lease):
    """A live lease that notes each board it is asked to take or renew (an ``FCALL`` each)."""

    held: list[str]

    async def hold(self, board_id: str) -> bool:
        self.held.append(board_id)
        return await super().hold(board_id)


async def test_a_board_without_mvps_is_left_alone_and_a_stray_mvp_mark_goes(
    redis: Redis, keys: Keys
) -> None:
    """Only an incr board keeps MVPs: a best board out of play costs the live pass nothing after
    its empty hot view is computed once (no lease taken each pass for MVPs it never has), and an
    MVP mark found on it (left by an erasure of the version before) is dropped, not kept."""
    best = Board(board_id="best", operator="best", periods=("alltime",))
    lease = CountingHolds(redis, keys, ttl=6.0, kind="live")
    lease.held = []
    live = CountingHot(redis, keys, lease)
    live.computed, live.looked = [], []
    await redis.sadd(keys.mvp_dirty("best"), "alltime|all", "daily|2026-12-01")

    for _ in range(4):
        await live.tick([best])

    assert live.computed == ["best"] and live.looked == []
    assert lease.held == ["best"]
    assert not await redis.exists(keys.mvp_dirty("best"))


async def test_an_ask_for_a_dense_build_never_made_goes(redis: Redis, keys: Keys) -> None:
    """A dense read asked for a daily view's set, then the board stopped keeping daily before
    the build: that view is never built, and its ask goes at the next pass instead of leaving
    the board with a build to do (probed, its lease taken and given up) every pass for good. So
    does an ask for a team view's set, which the derive step keeps always."""
    board = Board(board_id="b1", periods=("alltime",))
    never = ["daily|2026-12-06|global", "daily|2026-12-06|region:eu", "alltime|all|teams"]
    await redis.sadd(keys.dense_build("b1"), *never, "alltime|all|region:teams")
    merger = Merger(redis, keys)
    assert await merger.with_work(["b1"]) == (set(), {"b1"})

    assert await merger.build_dense(board) == 1  # the regional view of the region "teams"
    assert await merger.with_work(["b1"]) == (set(), set())
    assert not await redis.exists(keys.dense_build("b1"))
