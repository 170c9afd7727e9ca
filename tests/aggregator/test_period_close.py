"""The close of a period, step by step, against real Redis and RabbitMQ (docs/api.md 8b).

Events are written by the API's write function alone (no consumer runs): the close's last merge
makes the global board from the regional ones; two closers racing close once; the relay keeps
the message while no queue is bound to ``<prefix>.periods`` and publishes it once one is.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import aio_pika
import orjson
import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from services.aggregator import closer as closer_module
from services.aggregator import merge as merge_module
from services.aggregator.closer import Closer, tick
from services.aggregator.merge import Merger
from services.aggregator.period_relay import PeriodRelay
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.amqp import connect as connect_broker
from shared.boards import Board, BoardCatalog, Retention
from shared.keys import REGIONS_SEPARATOR, Keys
from shared.periods import PeriodWindow, close_name, previous_window, window_at
from shared.settings import CLOSE_GRACE, LadderSettings
from shared.topology import Topology
from tests.helpers import ADMIN, api_client, catalog_of, derive_outbox

BOARD = Board(board_id="cup", schedule="* * * * *", regions=("eu", "na"))


@pytest.fixture(autouse=True)
async def defined(redis: Redis, keys: Keys) -> None:
    """A close writes only for a board whose definition is stored (its look for a deletion):
    the boards these tests close are defined."""
    await catalog_of(redis, keys, ["cup", "open"])


@pytest.fixture
def no_derive_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the tests that run no consumer: the close's wait for the derive step (an ``incr``
    board's teams scope, which the derive step sums) taken as run out at once."""
    monkeypatch.setattr(closer_module, "DERIVE_WAIT", 0.0)


async def write(
    redis: Redis, keys: Keys, settings: LadderSettings, at: datetime, board: Board = BOARD
) -> None:
    for n, (user, region, value) in enumerate(
        [("a", "eu", 30), ("b", "eu", 10), ("c", "na", 20), ("a", "na", 5)]
    ):
        score = ScoreIn(user_id=user, region=region, value=value, occurred_at=at)
        await submit(redis, keys, settings, board, score, f"e-{n}")


async def close_until_done(
    closers: list[Closer], merger: Merger, now: datetime, board: Board = BOARD
) -> int:
    """Tick the closers (and the merge between their ticks) until the season is claimed."""
    closed = 0
    for _ in range(10):
        results = await asyncio.gather(*(c.close_board(board, now) for c in closers))
        closed += sum(results)
        await merger.merge_board(board)
    return closed


async def test_two_closers_close_a_season_once_with_the_merged_global_board(
    settings: LadderSettings, redis: Redis, keys: Keys, no_derive_wait: None
) -> None:
    now = datetime.now(UTC)
    season = window_at("season", now, "UTC", BOARD.schedule)
    await write(redis, keys, settings.model_copy(update={"allowed_lateness": 60.0}), now)
    # No consumer ran: the global board is empty until the close's last merge.
    assert await redis.zcard(keys.global_view("cup", "season", season.period_id)) == 0
    closers = [
        Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
        for _ in range(2)
    ]
    assert season.end is not None
    after = season.end + timedelta(seconds=5)
    # Not due before end + lateness + merge interval + grace.
    assert await closers[0].close_board(BOARD, season.end + timedelta(seconds=2)) == 0
    assert not await redis.exists(keys.period_closed("cup", "season", close_name(season)))

    # The season; the one before it, whose close the look above began (then the latest due);
    # and the latest day, week and month. Nobody scored but in the season: one message.
    assert await close_until_done(closers, Merger(redis, keys), after) == 5
    assert await redis.exists(keys.period_closed("cup", "season", close_name(season)))
    outbox = await redis.xrange(keys.periods_outbox("cup"))
    assert len(outbox) == 1
    body = orjson.loads(outbox[0][1]["m"])
    assert (body["board_id"], body["period"], body["period_id"]) == (
        "cup",
        "season",
        season.period_id,
    )
    ranked = {
        scope: [(e["user_id"], e["score"]) for e in entries]
        for scope, entries in body["scopes"].items()
    }
    assert ranked["global"] == [("a", 35), ("c", 20), ("b", 10)]
    assert ranked["region:eu"] == [("a", 30), ("b", 10)]
    assert ranked["region:na"] == [("c", 20), ("a", 5)]
    # An incr board's teams scope is there even empty (the teams board is the consumers': none
    # ran), as a region with no score would be.
    assert BOARD.operator == "incr" and ranked["teams"] == []
    # Again, later, by either: nothing more.
    assert await close_until_done(closers, Merger(redis, keys), after + timedelta(seconds=30)) == 0
    assert await redis.xlen(keys.periods_outbox("cup")) == 1


async def test_a_board_without_declared_regions_closes_every_region_the_writes_made(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """On a board with ``regions: null`` the close learns the period's regions from its regions
    set. The derive step fills it from the events it consumes, and an event whose message was
    still on its way left its region out of the close, and its users out of the global top: the
    write now names a region in the set in the step that gives a user its first score there.
    No consumer runs here, as if every message were still in the broker."""
    open_board = BOARD.model_copy(update={"board_id": "open", "regions": None, "operator": "best"})
    now = datetime.now(UTC)
    season = window_at("season", now, "UTC", open_board.schedule)
    await write(
        redis, keys, settings.model_copy(update={"allowed_lateness": 60.0}), now, open_board
    )
    regions = keys.regions("open", "season", season.period_id)
    assert await redis.smembers(regions) == {"eu", "na"}
    assert season.end is not None
    # Expiring with the season's other keys.
    assert await redis.expiretime(regions) == await redis.expiretime(
        keys.region_view("open", "season", season.period_id, "eu")
    )
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)

    after = season.end + timedelta(seconds=5)
    assert await close_until_done([closer], Merger(redis, keys), after, open_board) == 4
    [(_, fields)] = await redis.xrange(keys.periods_outbox("open"))
    scopes = orjson.loads(fields["m"])["scopes"]
    ranked = {
        scope: [(e["user_id"], e["score"]) for e in entries] for scope, entries in scopes.items()
    }
    assert ranked == {
        "global": [("a", 30), ("c", 20), ("b", 10)],
        "region:eu": [("a", 30), ("b", 10)],
        "region:na": [("c", 20), ("a", 5)],
    }


@dataclass
class TeamsSeason:
    """A season of this minute in which two teams scored (no consumer runs), its claim's key,
    and a closer and merge to tick past its close's delay (``after``)."""

    season: PeriodWindow
    claim: str
    closer: Closer
    merger: Merger
    after: datetime


async def teams_played(redis: Redis, keys: Keys, settings: LadderSettings) -> TeamsSeason:
    now = datetime.now(UTC)
    season = window_at("season", now, "UTC", BOARD.schedule)
    assert season.end is not None
    late_ok = settings.model_copy(update={"allowed_lateness": 60.0})
    for n, (user, team, value) in enumerate([("a", "red", 30), ("b", "blue", 10), ("c", "red", 5)]):
        score = ScoreIn(user_id=user, region="eu", value=value, team_id=team, occurred_at=now)
        await submit(redis, keys, late_ok, BOARD, score, f"e-{n}")
    return TeamsSeason(
        season,
        keys.period_closed("cup", "season", close_name(season)),
        Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100),
        Merger(redis, keys),
        season.end + timedelta(seconds=5),
    )


def season_messages(entries: list[Any]) -> list[dict[str, Any]]:
    return [m for _, f in entries if (m := orjson.loads(f["m"]))["period"] == "season"]


async def test_an_incr_board_s_close_waits_for_the_derive_step_to_count_every_team(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The teams scope is summed by the derive step from the event stream. The close now waits
    until the event the board accepted last when it made its marks is derived (the derive step
    applies a board's events in the order they were accepted); it closed with the teams scope as
    the derive step had left it, here empty, however far the stream trailed."""
    t = await teams_played(redis, keys, settings)

    # Marked and merged, but the events are not derived: nothing closes, however often it ticks.
    assert await close_until_done([t.closer], t.merger, t.after) == 0
    assert not await redis.exists(t.claim)
    assert await derive_outbox(redis, keys, BOARD, 10) == 3
    assert await close_until_done([t.closer], t.merger, t.after) == 4
    [body] = season_messages(await redis.xrange(keys.periods_outbox("cup")))
    teams = [(e["team_id"], e["score"]) for e in body["scopes"]["teams"]]
    assert teams == [("red", 35), ("blue", 10)]


async def test_a_close_waits_for_the_derive_step_so_long_at_most(
    settings: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A derive step that does not catch up (a broker down since the period's end) holds the
    close ``DERIVE_WAIT`` from its marks, no longer: it then closes with the teams scope the
    derive step had summed, and says so. (The wait is shortened here, so that the minute season
    is still the latest due when it runs out: a board's first close of a kind looks at the
    latest period alone.)"""
    monkeypatch.setattr(closer_module, "DERIVE_WAIT", 20.0)
    t = await teams_played(redis, keys, settings)

    assert await close_until_done([t.closer], t.merger, t.after) == 0
    waited = timedelta(seconds=closer_module.DERIVE_WAIT - 1)
    assert await close_until_done([t.closer], t.merger, t.after + waited) == 0
    with capture_logs() as logs:
        await close_until_done([t.closer], t.merger, t.after + waited + timedelta(seconds=2))
    assert await redis.exists(t.claim)
    [body] = season_messages(await redis.xrange(keys.periods_outbox("cup")))
    assert [e["user_id"] for e in body["scopes"]["global"]] == ["a", "b", "c"]
    assert body["scopes"]["teams"] == []
    trailing = [e for e in logs if "teams scope may trail" in e["event"]]
    assert {(e["period"], e["waited_for"]) for e in trailing} >= {("season", "e-2:c")}


async def test_an_event_written_after_the_end_within_the_lateness_counts_in_the_close(
    settings: LadderSettings, redis: Redis, keys: Keys, no_derive_wait: None
) -> None:
    """The season that ended last (under a minute ago): its events arrive after its end, within
    the board's allowed lateness. A closer ticking meanwhile closes nothing; one event more
    arrives; past the end plus the lateness (and the merge interval and grace) the close's
    standings count it."""
    lateness = 120.0
    late_ok = settings.model_copy(update={"allowed_lateness": lateness})
    now = datetime.now(UTC)
    current = window_at("season", now, "UTC", BOARD.schedule)
    season = previous_window(current, "UTC", 1, BOARD.schedule)
    assert season.end is not None and season.end <= now
    last_second = season.end - timedelta(seconds=1)
    await write(redis, keys, late_ok, last_second)
    closers = [Closer(redis, keys, lateness=lateness, merge_interval=0.2, size=100, outbox_max=100)]
    merger, claim = Merger(redis, keys), keys.period_closed("cup", "season", close_name(season))

    # Within the lateness (by this test's clock, as by the closer's): the season stays open.
    await close_until_done(closers, merger, datetime.now(UTC))
    assert not await redis.exists(claim)
    score = ScoreIn(user_id="d", region="na", value=50, occurred_at=last_second)
    answer = await submit(redis, keys, late_ok, BOARD, score, "e-late")
    assert answer["periods"]["season"]["period_id"] == season.period_id  # accepted, late

    due = season.end + timedelta(seconds=lateness + 0.2) + timedelta(seconds=CLOSE_GRACE + 1)
    await close_until_done(closers, merger, due)
    assert await redis.exists(claim)
    [body] = [
        m
        for _, fields in await redis.xrange(keys.periods_outbox("cup"))
        if (m := orjson.loads(fields["m"]))["period"] == "season"
    ]
    assert body["period_id"] == season.period_id
    ranked = {
        scope: [(e["user_id"], e["score"]) for e in entries]
        for scope, entries in body["scopes"].items()
    }
    assert ranked["global"] == [("d", 50), ("a", 35), ("c", 20), ("b", 10)]
    assert ranked["region:na"] == [("d", 50), ("c", 20), ("a", 5)]


class NoScans:
    """The closer's Redis, which refuses to scan a set: its wait must not cost Redis a pass over
    the dirty and merging sets."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    def __getattr__(self, name: str) -> Any:
        if name in ("sscan", "sscan_iter"):
            raise AssertionError(f"the close scanned a set ({name})")
        return getattr(self._redis, name)


async def test_the_close_waits_for_a_batch_taken_after_its_marks_without_scanning(
    settings: LadderSettings, redis: Redis, keys: Keys, no_derive_wait: None
) -> None:
    now = datetime.now(UTC)
    season = window_at("season", now, "UTC", BOARD.schedule)
    assert season.end is not None
    claim = keys.period_closed("cup", "season", close_name(season))
    await write(redis, keys, settings.model_copy(update={"allowed_lateness": 60.0}), now)
    # A backlog of another period's marks, as a restart leaves it, and the users' regions that
    # the derive step (not run here) keeps: a user's marks may fall in different rounds.
    backlog = [f"alltime|all|eu|x{i}" for i in range(12_000)]
    await redis.sadd(keys.dirty("cup"), *backlog)
    played = {"a": ["eu", "na"], "b": ["eu"], "c": ["na"]}
    mapping = {user: REGIONS_SEPARATOR.join(regions) for user, regions in played.items()}
    await redis.hset(keys.user_regions("cup"), mapping=mapping)
    closer = Closer(
        cast(Redis, NoScans(redis)), keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100
    )
    merger, after = Merger(redis, keys), season.end + timedelta(seconds=5)

    await closer.close_board(BOARD, after)  # marks the season's users, notes the take count
    assert await redis.sismember(keys.dirty("cup"), f"season|{season.period_id}|eu|a")
    await closer.close_board(BOARD, after)  # nothing taken since: waits
    assert not await redis.exists(claim)
    await merger.merge_board(BOARD, budget=0)  # a batch taken, a round of it merged
    assert await redis.exists(keys.dirty_merging("cup"))
    await closer.close_board(BOARD, after)  # the batch is not drained: waits
    assert not await redis.exists(claim)

    await merger.merge_board(BOARD)
    await closer.close_board(BOARD, after)
    body = orjson.loads((await redis.xrange(keys.periods_outbox("cup")))[0][1]["m"])
    assert body["period_id"] == season.period_id
    ranked = [(e["user_id"], e["score"]) for e in body["scopes"]["global"]]
    assert ranked == [("a", 35), ("c", 20), ("b", 10)]


async def test_the_relay_keeps_a_message_until_a_queue_is_bound_then_publishes_it_once(
    settings: LadderSettings, redis: Redis, keys: Keys, broker: Topology
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(BOARD)
    body = orjson.dumps(
        {
            "schema": 1,
            "type": "period.closed",
            "board_id": "cup",
            "period": "daily",
            "period_id": "2026-12-01",
            "closed_at": "2026-12-02T00:10:03.000Z",
            "scopes": {"global": []},
        }
    ).decode()
    await redis.xadd(keys.periods_outbox("cup"), {"m": body})
    relay = PeriodRelay(redis, keys, catalog, settings)
    stop = asyncio.Event()
    # The logs from the relay's start: it may publish, and say so, before the test's own
    # connection to the broker is made (seen on a cluster, where the line came before a capture
    # that began after that connection).
    with capture_logs() as logs:
        running = asyncio.create_task(relay.relay_until(stop))
        try:
            connection = await connect_broker(settings.amqp_urls)
            async with connection:
                channel = await connection.channel()
                exchange = await broker.declare_periods_exchange(channel)
                await asyncio.sleep(2)  # published mandatory to no queue: it waits
                assert await redis.xlen(keys.periods_outbox("cup")) == 1
                tap = await channel.declare_queue(exclusive=True)
                await tap.bind(exchange)
                got = None
                for _ in range(100):
                    got = await tap.get(no_ack=True, fail=False)
                    if got is not None:
                        break
                    await asyncio.sleep(0.1)
                assert got is not None
                # Said once while it waited (the relay polls twice a second), and once when it
                # went.
                said = [e["event"] for e in logs if "routed" in e["event"]]
                assert said == [
                    "period.closed routed to no queue; it waits",
                    "period.closed routed to a queue again",
                ]
                assert got.body.decode() == body
                assert got.message_id == "cup:daily:2026-12-01"
                assert got.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
                await asyncio.sleep(1.5)
                assert await tap.get(no_ack=True, fail=False) is None
                assert await redis.xlen(keys.periods_outbox("cup")) == 0
        finally:
            stop.set()
            await running


async def test_one_board_failing_its_close_does_not_hold_back_the_others(
    redis: Redis, keys: Keys
) -> None:
    # A board whose close raises (its definition, or Redis, at fault), sorted before another:
    # the other is still closed in the same pass, and the pass goes on next tick.
    stop, tried = asyncio.Event(), []

    class Failing(Closer):
        async def close_board(self, board: Board, now: datetime | None = None) -> int:
            tried.append(board.board_id)
            if board.board_id == "a-broken":
                raise ValueError("year 10000 is out of range")
            stop.set()
            return 0

    class Catalog:
        async def all(self) -> list[Board]:
            return [Board(board_id="a-broken"), Board(board_id="b-fine")]

    closer = Failing(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    await asyncio.wait_for(tick(closer, cast(BoardCatalog, Catalog()), stop), timeout=10)
    assert tried == ["a-broken", "b-fine"]


async def test_a_season_whose_keys_expired_before_its_close_is_still_closed(
    redis: Redis, keys: Keys
) -> None:
    # Minute seasons kept one season after their end, closed two minutes after it (a lateness
    # of 120 s): a definition the API now refuses, but one stored before could be so. The
    # season's keys expire before its close; its close-in-progress marker once took that expiry
    # and vanished as it was set, so the close began again every tick, for good.
    board = Board(board_id="cup", schedule="* * * * *", retention=Retention(season=1))
    closer = Closer(redis, keys, lateness=120, merge_interval=0.2, size=100, outbox_max=100)
    now = datetime.now(UTC)
    current = window_at("season", now - timedelta(seconds=121.2), "UTC", board.schedule)
    season = previous_window(current, "UTC", 1, board.schedule)
    merger = Merger(redis, keys)
    for _ in range(5):
        await closer.close_board(board, now)
        await merger.merge_board(board)
    assert await redis.exists(keys.period_closed("cup", "season", close_name(season)))


async def test_an_older_period_waiting_for_its_merge_is_closed_before_a_newer_one(
    redis: Redis, keys: Keys
) -> None:
    """Two seasons due at once (a catch-up after a stop): the older one's merge not done yet
    on a tick where the newer one's would be. Claiming the newer one first would move the
    watermark past the older one, which would then never close."""

    class OlderMergesLate(Closer):
        looks = 0

        async def _merging(self, bid: str, since: int) -> bool:
            self.looks += 1
            return self.looks == 1  # the first look, the older season's: still merging

    board = Board(board_id="cup", periods=("alltime",), schedule="* * * * *")
    closer = OlderMergesLate(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    now = datetime.now(UTC)
    # The season under way once the close's delay (2 + 0.2 + 1 s) is taken off, and before it.
    current = window_at("season", now - timedelta(seconds=3.2), "UTC", board.schedule)
    latest, older, before = (previous_window(current, "UTC", n, board.schedule) for n in (1, 2, 3))
    assert before.end is not None
    # Closed up to the season before those two.
    await redis.set(keys.period_watermark("cup", "season"), before.end.timestamp())
    claimed = [keys.period_closed("cup", "season", close_name(w)) for w in (older, latest)]
    await closer.close_board(board, now)  # both marked
    await closer.close_board(board, now)  # the older one still merging: neither claimed
    assert [await redis.exists(key) for key in claimed] == [0, 0]
    await closer.close_board(board, now)
    assert [await redis.exists(key) for key in claimed] == [1, 1]


async def test_a_first_close_still_waiting_when_the_next_period_falls_due_is_not_passed_over(
    redis: Redis, keys: Keys, settings: LadderSettings, no_derive_wait: None
) -> None:
    """A board's first close of a kind looks at the latest period: one that waits past the next
    period's due time (a minute season's close waiting for its derive step) still closes, and
    before the next. It was passed over: the next tick looked at the newer season alone."""
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    now = datetime.now(UTC)
    # The season under way once the close's delay (2 + 0.2 + 1 s) is taken off, and before it.
    current = window_at("season", now - timedelta(seconds=3.2), "UTC", BOARD.schedule)
    first = previous_window(current, "UTC", 1, BOARD.schedule)
    await write(redis, keys, settings, first.start + timedelta(seconds=1))
    await closer.close_board(BOARD, now)  # the first season's users marked
    # A minute on, its close not claimed yet: the season that was under way is due too.
    await close_until_done([closer], Merger(redis, keys), now + timedelta(minutes=1))
    claims = [
        await redis.get(keys.period_closed("cup", "season", close_name(w)))
        for w in (first, current)
    ]
    assert None not in claims
    messages = await redis.xrange(keys.periods_outbox("cup"))
    assert [
        orjson.loads(fields["m"])["period_id"]
        for _, fields in messages
        if orjson.loads(fields["m"])["period"] == "season"
    ] == [first.period_id]


async def test_a_close_going_on_after_its_board_was_deleted_writes_nothing(
    redis: Redis, keys: Keys, settings: LadderSettings, no_derive_wait: None
) -> None:
    """A close whose tick read the board's definition before the board was deleted, going on
    with it after: neither its claim, nor its message, nor the marks of another period are
    written, so nothing of it is left to a board made later under the name. They were all
    written, and a fresh board's period relay sent the deleted board's message."""
    catalog = BoardCatalog(redis, keys)
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    now = datetime.now(UTC)
    current = window_at("season", now - timedelta(seconds=3.2), "UTC", BOARD.schedule)
    season = previous_window(current, "UTC", 1, BOARD.schedule)
    await write(redis, keys, settings, season.start + timedelta(seconds=1))
    await closer.close_board(BOARD, now)  # the season's users marked, the board defined
    assert await redis.exists(keys.period_closing("cup", "season", close_name(season)))

    await catalog.remove("cup")  # a deletion's first step; the closer holds its copy of it
    merger = Merger(redis, keys)
    assert await close_until_done([closer], merger, now) == 0
    assert await close_until_done([closer], merger, now + timedelta(minutes=1)) == 0
    assert not await redis.exists(keys.period_closed("cup", "season", close_name(season)))
    assert not await redis.exists(keys.periods_outbox("cup"))
    assert not await redis.exists(keys.period_closing("cup", "season", close_name(current)))


class DeletedWhileMarking(Closer):
    """A closer whose board is deleted while it marks the period's users (a large board's marks
    take many calls)."""

    async def _mark_all(self, board: Board, window: PeriodWindow, regions: list[str]) -> None:
        await super()._mark_all(board, window, regions)
        if window.period == "season":  # the one with scores; the board's days come first
            await BoardCatalog(self._redis, self._keys).remove(board.board_id)


async def test_a_board_deleted_while_its_close_marks_gets_no_close_marker_or_watermark(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    """The close looks again once its marks are in: a deletion whose last pass came while they
    went in left the period's close marker and the kind's watermark, which a board made later
    under the name took for its own (its first season's close never began)."""
    closer = DeletedWhileMarking(
        redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100
    )
    now = datetime.now(UTC)
    current = window_at("season", now - timedelta(seconds=3.2), "UTC", BOARD.schedule)
    season = previous_window(current, "UTC", 1, BOARD.schedule)
    await write(redis, keys, settings, season.start + timedelta(seconds=1))
    assert await closer.close_board(BOARD, now) == 0
    assert await redis.scard(keys.dirty("cup")) == 4  # the marks went in before the deletion
    assert not await redis.exists(keys.period_closing("cup", "season", close_name(season)))
    assert not await redis.exists(keys.period_watermark("cup", "season"))


async def test_a_close_forgets_the_as_of_of_the_period_that_expired_as_it_ended(
    redis: Redis, keys: Keys
) -> None:
    # Minute seasons kept two seasons: when a season closes, the one three before it has no
    # views left, and its field of the board's as_of hash goes too (the hash stays bounded).
    board = Board(board_id="cup", periods=("alltime",), schedule="* * * * *")
    board = board.model_copy(update={"retention": Retention(season=2)})
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    now = datetime.now(UTC)
    current = window_at("season", now - timedelta(seconds=3.2), "UTC", board.schedule)
    latest, kept, gone = (previous_window(current, "UTC", n, board.schedule) for n in (1, 3, 4))
    fields = {f"season:{w.period_id}": "2026-12-05T00:00:00Z" for w in (kept, gone)}
    await redis.hset(keys.as_of("cup"), mapping=fields)
    merger = Merger(redis, keys)
    for _ in range(3):
        await closer.close_board(board, now)
        await merger.merge_board(board)
    assert await redis.exists(keys.period_closed("cup", "season", close_name(latest)))
    assert await redis.hkeys(keys.as_of("cup")) == [f"season:{kept.period_id}"]


async def test_a_close_sums_a_user_of_two_regions_whose_marks_fall_in_two_rounds(
    settings: LadderSettings,
    redis: Redis,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
    no_derive_wait: None,
) -> None:
    """No consumer ran (nothing derived: the users' regions hash is empty), and the close's
    marks, one a user and region, are merged in rounds too small to hold both of a user's: the
    round that merges a user's second mark still reads its first region."""
    monkeypatch.setattr(merge_module, "ROUND", 20)
    users = [f"user-{i:03d}" for i in range(100)]
    late_ok = settings.model_copy(update={"allowed_lateness": 60.0})
    now = datetime.now(UTC)
    season = window_at("season", now, "UTC", BOARD.schedule)
    for n, (user, region, value) in enumerate(
        (u, r, v) for u in users for r, v in (("eu", 3), ("na", 4))
    ):
        score = ScoreIn(user_id=user, region=region, value=value, occurred_at=now)
        await submit(redis, keys, late_ok, BOARD, score, f"e-{n}")
    assert await redis.hlen(keys.user_regions("cup")) == 0
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=len(users), outbox_max=100)
    assert season.end is not None
    await close_until_done([closer], Merger(redis, keys), season.end + timedelta(seconds=5))
    [body] = [orjson.loads(f["m"]) for _, f in await redis.xrange(keys.periods_outbox("cup"))]
    assert body["period_id"] == season.period_id
    scores = {e["user_id"]: e["score"] for e in body["scopes"]["global"]}
    assert scores == {user: 7 for user in users}


async def test_closes_begin_at_a_board_s_creation_and_at_a_change_of_schedule(
    quiet: LadderSettings, redis: Redis, keys: Keys, mysql_database: str
) -> None:
    """A board made by a PUT closes no period that ended before it (the allowed lateness back),
    nor a changed schedule seasons that ended before the change. A first close looked at the
    latest period ended, which the board never ran, and a weekly board made minute by minute
    closed twelve minute seasons of the hour before at once, most of them already expired."""
    settings = quiet.model_copy(update={"allowed_lateness": 2.0})
    weekly = {"schedule": "0 0 * * 0", "retention": {"season": 12}}
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=10, outbox_max=100)
    merger = Merger(redis, keys)
    async with api_client(settings) as client:
        made = await client.put("/v1/boards/fresh", json=weekly, headers=ADMIN)
        assert made.status_code == 201, made.text
        board = Board.model_validate(made.json())
        assert await close_until_done([closer], merger, datetime.now(UTC), board) == 0
        changed_at = datetime.now(UTC)
        minutes = await client.put(
            "/v1/boards/fresh", json=weekly | {"schedule": "* * * * *"}, headers=ADMIN
        )
        assert minutes.status_code == 200, minutes.text
    board = Board.model_validate(minutes.json())
    later = changed_at + timedelta(minutes=2)
    closed = await close_until_done([closer], merger, later, board)
    # The season under way at the change, and the one after it, if it is due by then.
    assert 1 <= closed <= 2
    claims = [str(key) async for key in redis.scan_iter(f"{keys.tag('fresh')}:closed:season:*")]
    ends = [datetime.fromtimestamp(int(claim.rsplit("/", 1)[-1]), UTC) for claim in claims]
    # Closes begin the allowed lateness (2 s) before the change, in whole seconds: a season that
    # ended that little before it may still take events, and is closed (seen on a change 1.x s
    # into a minute: the season of the minute before was closed too).
    since = changed_at - timedelta(seconds=settings.allowed_lateness + 1)
    assert len(claims) == closed and all(end > since for end in ends), (claims, changed_at)
