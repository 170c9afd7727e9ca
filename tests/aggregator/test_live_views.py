"""The live views of play (docs/api.md section 8a): hot streaks and team MVPs, their reads and
pushes.

Most tests run the API in-process against real Redis with an unreachable broker, so accepted
events stay in the outbox; the test hands them to the aggregator's own handler and ticker
(:mod:`services.aggregator.live_tracker`) as the consumer would, at times it chooses. Where a
test needs its own timing it hands the handler events it made itself. The last test runs the four
real services, watches a hot view change arrive on the WebSocket, and has the broker deliver the
events to the aggregator again.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
import websockets
from redis.asyncio import Redis

from services.aggregator import live_tracker
from services.aggregator.derive import Derive
from services.aggregator.handlers import Handler, MarkDirty, aggregate
from services.aggregator.live_tracker import LiveViews, RecordLive
from shared.amqp import connect as connect_broker
from shared.boards import MAIN_BOARD, BoardCatalog
from shared.events import ScoreAccepted, rfc3339
from shared.keys import DERIVED_FIELD, Keys
from shared.lease import Lease
from shared.settings import DEV_SERVER_KEY, LadderSettings
from tests.helpers import (
    ADMIN,
    SERVER,
    api_client,
    eventually,
    made,
    republish,
    serve,
    snapshot,
    until_pong,
)
from tests.stack import Stack

HOT = "/v1/boards/main/hot"
MVPS = "/v1/boards/main/mvps"
PROBLEM = "application/problem+json"


def stamp(moment: datetime) -> str:
    return rfc3339(moment)


async def post(client: httpx.AsyncClient, board: str = "main", **body: Any) -> dict[str, Any]:
    body.setdefault("region", "eu")
    response = await client.post(f"/v1/boards/{board}/scores", json=body, headers=SERVER)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def get_ok(client: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    response = await client.get(path, params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def outbox(redis: Redis, keys: Keys, board_id: str = "main") -> list[ScoreAccepted]:
    """The events the API accepted, as the broker would deliver them to the aggregator."""
    entries: list[Any] = await redis.xrange(keys.outbox(board_id))
    return [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]


def consumer(redis: Redis, keys: Keys) -> Handler:
    """The aggregator's handler, exactly as its main wires it."""
    catalog = BoardCatalog(redis, keys)
    derive = Derive(redis, keys, catalog, LadderSettings().feed_length)
    return aggregate(derive, MarkDirty(redis, keys), RecordLive(redis, keys, catalog))


def recorder(redis: Redis, keys: Keys) -> RecordLive:
    """The live views' part of the aggregator's handler alone, for events a test makes itself."""
    return RecordLive(redis, keys, BoardCatalog(redis, keys))


def ranking(entries: list[dict[str, Any]], *names: str) -> list[tuple[Any, ...]]:
    return [tuple(e[n] for n in names) for e in entries]


# --- hot streaks -------------------------------------------------------------------------------


async def test_hot_ranks_by_average_per_event_not_by_total(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        for _ in range(10):  # many small events: total 50, average 5
            await post(client, user_id="u-many", value=5)
        for value in (15, 25):  # few large ones: total 40, average 20
            await post(client, user_id="u-few", value=value)
        await post(client, user_id="u-one", value=10)
        await consumer(redis, keys)(await outbox(redis, keys))
        assert await LiveViews(redis, keys).hot(MAIN_BOARD) == 2  # both windows changed
        wide = await get_ok(client, HOT, window=60)
        narrow = await get_ok(client, HOT, window=10)
        default = await get_ok(client, HOT)
    expected = [(1, "u-few", 20.0), (2, "u-one", 10.0), (3, "u-many", 5.0)]
    assert ranking(wide["entries"], "rank", "user_id", "score") == expected
    assert ranking(narrow["entries"], "rank", "user_id", "score") == expected
    assert (wide["board_id"], wide["window"], narrow["window"]) == ("main", 60, 10)
    assert default == wide and wide["as_of"] is not None


async def test_events_fall_out_of_each_window_and_out_of_the_set(redis: Redis, keys: Keys) -> None:
    now = datetime.now(UTC)
    await recorder(redis, keys)(
        [
            made("u-recent", 10, now - timedelta(seconds=3)),
            made("u-recent", 30, now - timedelta(seconds=4)),
            made("u-older", 100, now - timedelta(seconds=30)),
            made("u-zero", 0, now - timedelta(seconds=30)),
            made("u-zero", 0, now - timedelta(seconds=2)),
            made("u-gone", 1000, now - timedelta(seconds=70)),  # before the widest window
        ]
    )
    live = LiveViews(redis, keys)

    async def views(at: datetime) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        await live.hot(MAIN_BOARD, now=at)
        found = []
        for window in (10, 60):
            view = json.loads(await redis.get(keys.hot_view("main", window)) or "{}")
            found.append(ranking(view["entries"], "user_id", "score"))
        return found[0], found[1]

    assert await views(now) == (
        [("u-recent", 20.0), ("u-zero", 0.0)],
        [("u-older", 100.0), ("u-recent", 20.0), ("u-zero", 0.0)],
    )
    # 8 s on, the recent events are 10-12 s old: out of the 10 s window, still in the 60 s one.
    assert await views(now + timedelta(seconds=8)) == (
        [],
        [("u-older", 100.0), ("u-recent", 20.0), ("u-zero", 0.0)],
    )
    # 31 s on, the events of 30 s ago are 61 s old: they leave the 60 s window and the set.
    assert await views(now + timedelta(seconds=31)) == (
        [],
        [("u-recent", 20.0), ("u-zero", 0.0)],
    )
    assert await redis.zcard(keys.hot_events("main")) == 3
    assert await views(now + timedelta(seconds=65)) == ([], [])
    assert await redis.zcard(keys.hot_events("main")) == 0


async def test_a_late_event_counts_toward_its_periods_but_not_hot(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    async with api_client(quiet) as client:
        late = await post(
            client, user_id="u-late", value=500, occurred_at=stamp(now - timedelta(seconds=8))
        )
        await post(client, user_id="u-on-time", value=1)
        await consumer(redis, keys)(await outbox(redis, keys))
        await LiveViews(redis, keys).hot(MAIN_BOARD)
        hot = await get_ok(client, HOT, window=60)
        region = await get_ok(client, "/v1/boards/main/leaderboard", scope="region:eu")
    assert late["periods"]["alltime"]["score"] == 500
    assert ranking(region["entries"], "user_id", "score") == [("u-late", 500), ("u-on-time", 1)]
    assert ranking(hot["entries"], "user_id", "score") == [("u-on-time", 1.0)]
    # The late event is not in the hot set at all, so no later pass can count it.
    members = await redis.zrange(keys.hot_events("main"), 0, -1)
    assert [m.split("|")[1] for m in members] == ["u-on-time"]


async def test_a_redelivered_event_counts_once_in_hot_and_mvps(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=10, team_id="red")
        await post(client, user_id="u-1", value=30, team_id="red")
        await post(client, user_id="u-2", value=60, team_id="red")
        events = await outbox(redis, keys)
        handler = consumer(redis, keys)
        await handler(events)
        # The broker delivers again: the whole batch, then the first event twice in one batch.
        await handler(events)
        await handler([events[0], events[0]])
        await LiveViews(redis, keys).hot(MAIN_BOARD)
        hot = await get_ok(client, HOT, window=60)
        mvps = await get_ok(client, MVPS)
    assert ranking(hot["entries"], "user_id", "score") == [("u-2", 60.0), ("u-1", 20.0)]
    assert await redis.zcard(keys.hot_events("main")) == 3
    assert ranking(mvps["entries"], "user_id", "user_score", "team_score", "share") == [
        ("u-2", 60, 100, 0.6),
        ("u-1", 40, 100, 0.4),
    ]


async def test_several_aggregators_and_a_restart_push_a_change_once(
    redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    channel = keys.board_channel("main", "hot", "60")
    pubsub = redis.pubsub()
    await pubsub.subscribe(channel)
    confirmed = await pubsub.get_message(timeout=5)  # subscribed before anything is published
    assert confirmed is not None and confirmed["type"] == "subscribe"
    try:
        await recorder(redis, keys)([made("u-1", 7, now - timedelta(seconds=1))])
        first, second = LiveViews(redis, keys), LiveViews(redis, keys)
        pushed = [await first.hot(MAIN_BOARD, now=now), await second.hot(MAIN_BOARD, now=now)]
        # A restarted aggregator knows nothing in memory; what it finds in Redis is unchanged.
        restarted = await LiveViews(redis, keys).hot(MAIN_BOARD, now=now + timedelta(seconds=1))
        received = []
        # Everything published by now arrives well within a second on loopback.
        end = asyncio.get_running_loop().time() + 1.0
        while asyncio.get_running_loop().time() < end:
            message = await pubsub.get_message(timeout=0.1)
            if message is not None and message["type"] == "message":
                received.append(json.loads(message["data"]))
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert pushed == [2, 0] and restarted == 0
    assert [ranking(m["entries"], "user_id", "score") for m in received] == [[("u-1", 7.0)]]
    assert received[0]["view"] == "hot" and received[0]["window"] == 60


async def test_one_of_several_aggregators_computes_a_boards_live_views(
    redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two aggregators' tickers: the board's live views (hot streaks, and MVPs on their full
    pass) are computed by the holder of its live lease only; once that one is gone (its lease
    lapsed), the other computes them as events come."""
    computed: list[str] = []
    hot, mvps = LiveViews.hot, LiveViews.mvps

    async def counted_hot(self: LiveViews, board: Any, now: Any = None) -> int:
        computed.append(f"{self.lease.owner} hot")
        return await hot(self, board, now)

    async def counted_mvps(self: LiveViews, board: Any) -> int:
        computed.append(f"{self.lease.owner} mvps")
        return await mvps(self, board)

    monkeypatch.setattr(LiveViews, "hot", counted_hot)
    monkeypatch.setattr(LiveViews, "mvps", counted_mvps)
    one = LiveViews(redis, keys, Lease(redis, keys, ttl=0.5, owner="one", kind="live"))
    two = LiveViews(redis, keys, Lease(redis, keys, ttl=0.5, owner="two", kind="live"))
    now = datetime.now(UTC)
    for tick in range(3):
        await recorder(redis, keys)([made(f"u-{tick}", 5, now)])
        await one.tick([MAIN_BOARD])
        await two.tick([MAIN_BOARD])
    assert computed and {entry.split()[0] for entry in computed} == {"one"}, computed
    # "one" stops; its lease lapses, and "two" takes the board over at its next tick with events.
    await asyncio.sleep(0.6)
    computed.clear()
    await recorder(redis, keys)([made("u-9", 5, datetime.now(UTC))])
    await two.tick([MAIN_BOARD])
    assert computed == ["two hot"], computed


# --- team MVPs ---------------------------------------------------------------------------------


async def test_mvps_rank_users_by_their_share_of_their_team(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=30, team_id="red")
        await post(client, user_id="u-2", value=10, team_id="red", region="na")
        await post(client, user_id="u-3", value=50, team_id="blue")
        await post(client, user_id="u-4", value=20, team_id="blue")
        await post(client, user_id="u-4", value=30, team_id="blue")
        await post(client, user_id="u-5", value=5, team_id="green")
        await post(client, user_id="u-7", value=2, team_id="gold")
        await post(client, user_id="u-8", value=2, team_id="gold")
        await post(client, user_id="u-9", value=-3, team_id="grey")  # a team below zero
        await post(client, user_id="u-10", value=999)  # no team
        await consumer(redis, keys)(await outbox(redis, keys))
        alltime = await get_ok(client, MVPS)
        daily = await get_ok(client, MVPS, period="daily")
        teams = await get_ok(client, "/v1/boards/main/leaderboard", scope="teams")
    # green 5/5; red 30/40 and 10/40; blue 50/100 each, gold 2/4 each (the larger user_score
    # first, then the user id); grey has no positive total; u-10 has no team.
    assert ranking(
        alltime["entries"], "rank", "user_id", "team_id", "user_score", "team_score"
    ) == [
        (1, "u-5", "green", 5, 5),
        (2, "u-1", "red", 30, 40),
        (3, "u-3", "blue", 50, 100),
        (4, "u-4", "blue", 50, 100),
        (5, "u-7", "gold", 2, 4),
        (6, "u-8", "gold", 2, 4),
        (7, "u-2", "red", 10, 40),
    ]
    assert [e["share"] for e in alltime["entries"]] == [1.0, 0.75, 0.5, 0.5, 0.5, 0.5, 0.25]
    assert (alltime["period"], alltime["period_id"]) == ("alltime", "all")
    assert daily["entries"] == alltime["entries"] and daily["period"] == "daily"
    team_scores = {e["team_id"]: e["score"] for e in teams["entries"]}
    assert all(e["team_score"] == team_scores[e["team_id"]] for e in alltime["entries"])


async def test_mvps_say_as_of_when_the_events_they_sum_were_applied(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The totals and shares trail the writes as the teams scope does: ``as_of`` is null before
    the aggregator applied a batch of the board, then the time it last did, on the read and on
    the view it pushes; a later batch that changes no share moves the read's ``as_of`` alone."""
    live = LiveViews(redis, keys)
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=3, team_id="red")
        before = await get_ok(client, MVPS)
        await consumer(redis, keys)(await outbox(redis, keys))
        applied = await redis.hget(keys.as_of("main"), DERIVED_FIELD)
        after = await get_ok(client, MVPS)
        teams = await get_ok(client, "/v1/boards/main/leaderboard", scope="teams")
        assert await live.mvps(MAIN_BOARD) == 4
        stored = orjson.loads(await redis.get(keys.mvp_view("main", "alltime")))
        await post(client, user_id="u-9", value=4)  # no team: no share changes
        await consumer(redis, keys)([(await outbox(redis, keys))[-1]])
        later = await get_ok(client, MVPS)
    assert (before["as_of"], before["entries"]) == (None, [])
    assert applied is not None and after["as_of"] == applied == teams["as_of"]
    assert ranking(after["entries"], "user_id", "share") == [("u-1", 1.0)]
    assert stored["as_of"] == applied and stored["entries"] == after["entries"]
    assert later["as_of"] > applied and later["entries"] == after["entries"]


async def test_mvps_keep_only_the_top_ten(quiet: LadderSettings, redis: Redis, keys: Keys) -> None:
    async with api_client(quiet) as client:
        for i in range(12):
            # Team t-i: its member m-i scores i + 1 of a total of 2 * (i + 1) + 1.
            await post(client, user_id=f"m-{i}", value=i + 1, team_id=f"t-{i}")
            await post(client, user_id=f"x-{i}", value=i + 2, team_id=f"t-{i}")
        await consumer(redis, keys)(await outbox(redis, keys))
        body = await get_ok(client, MVPS, period="weekly")
    # x-i's share (i + 2) / (2i + 3) falls with i toward 1/2; every m-i's stays below 1/2.
    expected = [f"x-{i}" for i in range(10)]
    assert [e["user_id"] for e in body["entries"]] == expected
    assert [e["rank"] for e in body["entries"]] == list(range(1, 11))


async def test_mvps_of_members_tied_in_a_large_team_take_the_smaller_user_ids(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Ties rank by the larger ``user_score``, then the smaller user id, however many members
    of a team tie: a team's members are read from the largest contribution down, and Redis
    gives equal contributions in the order of the larger id first, so the members tied at the
    cut of a team's leading ten are read again in the view's order. Checked against the docs'
    rules computed over random play of teams large and small, with moves and hidden users."""
    draw = random.Random(11)
    users = [f"u-{i:02d}" for i in range(40)]
    hidden = {"u-03", "big-02"}
    await redis.sadd(keys.hidden("main"), *hidden)
    async with api_client(quiet) as client:
        for i in range(30):  # thirty members scoring 1 of a total of 10: thirty tied shares
            await post(client, user_id=f"big-{29 - i:02d}", value=1, team_id="big")
        await post(client, user_id="big-low", value=-20, team_id="big")
        await asyncio.sleep(0.01)  # accepted in a later millisecond than its event for big
        await post(client, user_id="big-01", value=1, team_id="red")  # big-01 moves to red
        for _ in range(160):
            user = draw.choice(users)
            team = draw.choice(("red", "blue", "red"))
            await post(client, user_id=user, value=draw.choice((1, 1, 2, -1)), team_id=team)
        events = await outbox(redis, keys)
        await consumer(redis, keys)(events)
        body = await get_ok(client, MVPS)
    totals: dict[str, int] = defaultdict(int)
    scored: dict[tuple[str, str], int] = defaultdict(int)
    latest: dict[str, tuple[datetime, int, str]] = {}
    for order, event in enumerate(events):
        team = str(event.team_id)
        totals[team] += event.value
        scored[(event.user_id, team)] += event.value
        latest[event.user_id] = max(
            latest.get(event.user_id, (event.accepted_at, -1, team)),
            (event.accepted_at, order, team),
        )
    rows = [
        (user, team, scored[(user, team)], totals[team])
        for user, (_, _, team) in latest.items()
        if user not in hidden and scored[(user, team)] > 0 and totals[team] > 0
    ]
    rows.sort(key=lambda r: (-r[2] / r[3], -r[2], r[0]))
    expected = [(i + 1, *row) for i, row in enumerate(rows[:10])]
    assert ranking(body["entries"], "rank", "user_id", "team_id", "user_score", "team_score") == (
        expected
    )
    big = [e["user_id"] for e in body["entries"] if e["team_id"] == "big"]
    assert big and big == [f"big-{i:02d}" for i in range(len(big) + 2) if i not in (1, 2)]


async def test_mvps_of_a_new_period_are_pushed_at_its_first_tick(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick after a period begins stores and pushes the new period's MVP view (empty), so a
    new subscriber's first message and a pushed client name the new period: the view was
    computed again only for a contribution or by the full pass every 30 s, and until then a
    subscriber was sent the period before's."""
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=30, team_id="red")
        await consumer(redis, keys)(await outbox(redis, keys))
    live = LiveViews(redis, keys)
    await live.tick([MAIN_BOARD])  # the first: every period's view, the contribution taken
    today = json.loads(await redis.get(keys.mvp_view("main", "daily")) or "{}")
    assert [e["user_id"] for e in today["entries"]] == ["u-1"]

    class Tomorrow(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + timedelta(days=1)

    # The next day's tick, within the full pass's 30 s and with nothing marked.
    monkeypatch.setattr(live_tracker, "datetime", Tomorrow)
    await live.tick([MAIN_BOARD])
    stored = json.loads(await redis.get(keys.mvp_view("main", "daily")) or "{}")
    assert stored["period_id"] == Tomorrow.now(UTC).date().isoformat()
    assert stored["entries"] == []


async def test_a_user_who_changes_team_ranks_with_its_latest_team(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=30, team_id="red")
        await post(client, user_id="u-2", value=10, team_id="red")
        await post(client, user_id="u-3", value=30, team_id="blue")
        await asyncio.sleep(0.01)  # accepted in a later millisecond than the events before it
        await post(client, user_id="u-1", value=10, team_id="blue")  # u-1 moves to blue
        events = await outbox(redis, keys)
        # Delivered out of order: the move arrives before the events that came first.
        await consumer(redis, keys)(list(reversed(events)))
        body = await get_ok(client, MVPS)
        teams = await get_ok(client, "/v1/boards/main/leaderboard", scope="teams")
    # red keeps u-1's 30 in its total of 40, but u-1 now ranks with blue, for its 10 there.
    assert ranking(teams["entries"], "team_id", "score") == [("red", 40), ("blue", 40)]
    assert ranking(body["entries"], "user_id", "team_id", "user_score", "team_score") == [
        ("u-3", "blue", 30, 40),
        ("u-1", "blue", 10, 40),
        ("u-2", "red", 10, 40),
    ]
    assert [e["share"] for e in body["entries"]] == [0.75, 0.25, 0.25]


@pytest.mark.usefixtures("mysql_database")  # where board definitions are kept
async def test_an_mvp_contribution_is_held_within_the_exact_scores_as_its_team_total(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A member's contribution leaves out an event that would take it past ±(2^53 - 1), as its
    team's total does: it was summed in a double, past the range and inexactly (user_score
    18014398509481976 against a team total of 9007199254740991, a share of 2)."""
    big = 2**53 - 1
    async with api_client(quiet) as client:
        wide = {"operator": "incr", "min_value": -big, "max_value": big}
        made_board = await client.put("/v1/boards/wide", json=wide, headers=ADMIN)
        assert made_board.status_code == 201, made_board.text
        await post(client, "wide", user_id="u-1", value=big, team_id="red")
        await post(client, "wide", user_id="u-1", value=big - 5, team_id="red", region="na")
        await post(client, "wide", user_id="u-1", value=-3, team_id="red")
        await post(client, "wide", user_id="u-2", value=7, team_id="blue")
        await post(client, "wide", user_id="u-2", value=big - 8, team_id="blue", region="na")
        await consumer(redis, keys)(await outbox(redis, keys, "wide"))
        body = await get_ok(client, "/v1/boards/wide/mvps")
        teams = await get_ok(client, "/v1/boards/wide/leaderboard", scope="teams")
    assert ranking(teams["entries"], "team_id", "score") == [("blue", big - 1), ("red", big - 3)]
    assert ranking(body["entries"], "user_id", "team_id", "user_score", "team_score") == [
        ("u-2", "blue", big - 1, big - 1),
        ("u-1", "red", big - 3, big - 3),
    ]
    assert [e["share"] for e in body["entries"]] == [1.0, 1.0]


async def test_a_batch_larger_than_a_call_counts_as_its_events_one_by_one(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch goes in calls of a few events each (``CONTRIBUTE_STEP``, ``HOT_ADD_STEP``), the
    contributions of a call summed before they are written: the totals and latest teams still
    equal what the events give one by one in the order delivered, the hot set holds each event
    once, and a redelivery, whole or in part, adds nothing."""
    monkeypatch.setattr(live_tracker, "CONTRIBUTE_STEP", 7)
    monkeypatch.setattr(live_tracker, "HOT_ADD_STEP", 5)
    draw = random.Random(7)
    async with api_client(quiet) as client:
        for _ in range(60):
            team = draw.choice(("red", "blue", "green"))
            user = f"u-{draw.randrange(6)}"
            await post(client, user_id=user, value=draw.randint(1, 50), team_id=team)
    events = await outbox(redis, keys)
    draw.shuffle(events)
    record = recorder(redis, keys)
    await record(events)
    await record(events)
    await record(events[:25])
    sums: dict[tuple[str, str, str, str], float] = defaultdict(float)
    latest: dict[tuple[str, str, str], tuple[int, str]] = {}
    for event in events:  # in the order delivered: of equal times, the later one's team
        accepted = int(event.accepted_at.timestamp() * 1000)
        for period, result in event.periods.items():
            sums[(period, result.period_id, str(event.team_id), event.user_id)] += event.value
            at = (period, result.period_id, event.user_id)
            if at not in latest or latest[at][0] <= accepted:
                latest[at] = (accepted, str(event.team_id))
    for (period, period_id, team, user), total in sums.items():
        members = keys.team_members("main", period, period_id, team)
        assert await redis.zscore(members, user) == total
    for (period, period_id, user), (accepted, team) in latest.items():
        stored = await redis.hget(keys.member_team("main", period, period_id), user)
        assert stored == f"{accepted}|{team}"
    assert await redis.zcard(keys.hot_events("main")) == len(events)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("mysql_database")  # where board definitions are kept
async def test_bad_reads_answer_problems_and_change_nothing(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        put = await client.put("/v1/boards/speedrun", json={"operator": "best"}, headers=ADMIN)
        assert put.status_code == 201, put.text
        await post(client, user_id="u-1", value=5, team_id="red")
        before = await snapshot(redis, quiet.key_prefix)
        cases = [
            (HOT, {"window": 30}, 422),
            (HOT, {"window": 0}, 422),
            (HOT, {"window": "sixty"}, 422),
            (MVPS, {"period": "hourly"}, 422),
            (MVPS, {"period_id": "yesterday"}, 422),
            (MVPS, {"period": "daily", "period_id": "all"}, 422),
            ("/v1/boards/speedrun/mvps", {}, 422),  # a best board keeps no team totals
            ("/v1/boards/nope/hot", {}, 404),
            ("/v1/boards/nope/mvps", {}, 404),
        ]
        for path, params, status in cases:
            response = await client.get(path, params=params)
            assert response.status_code == status, (path, params, response.text)
            assert response.headers["content-type"].startswith(PROBLEM)
            body = response.json()
            assert body["status"] == status and body["detail"]
            if status == 422:
                assert body["errors"], body
        assert await snapshot(redis, quiet.key_prefix) == before


# --- pushes ------------------------------------------------------------------------------------


async def recv(ws: websockets.ClientConnection, within: float = 5.0) -> dict[str, Any]:
    async with asyncio.timeout(within):
        message: dict[str, Any] = json.loads(await ws.recv())
        return message


async def subscribe(ws: websockets.ClientConnection, topic: str) -> list[dict[str, Any]]:
    """Subscribe; what arrived before the answer to a ping sent after it."""
    return await until_pong(ws, {"op": "subscribe", "topic": topic})


async def test_live_topics_push_changes_and_send_the_current_view_on_subscribe(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    handler, live = consumer(redis, keys), LiveViews(redis, keys)
    async with serve(quiet) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        api = url.replace("ws://", "http://").removesuffix("/v1/ws")
        async with httpx.AsyncClient(base_url=api) as client:
            assert await subscribe(ws, "leaderboard:main:hot:10") == []  # nothing computed yet
            bad = await subscribe(ws, "leaderboard:main:hot:30")
            assert bad[0]["type"] == "error" and bad[0]["topic"] == "leaderboard:main:hot:30"

            await post(client, user_id="u-1", value=4, team_id="red")
            await handler(await outbox(redis, keys))
            assert await live.hot(MAIN_BOARD) == 2
            pushed = await recv(ws)
            await handler(await outbox(redis, keys))  # redelivered: nothing changes
            assert await live.hot(MAIN_BOARD) == 0
            await post(client, user_id="u-2", value=9, team_id="red")
            await handler(await outbox(redis, keys))
            assert await live.hot(MAIN_BOARD) == 2
            changed = await recv(ws)

            assert await live.mvps(MAIN_BOARD) == 4  # one view per period of the board
            assert await live.mvps(MAIN_BOARD) == 0  # nothing changed since
            mvp_current = await subscribe(ws, "leaderboard:main:mvps:weekly")
            hot_current = await subscribe(ws, "leaderboard:main:hot:60")
    assert {k: pushed[k] for k in ("type", "view", "scope", "board_id", "window")} == {
        "type": "leaderboard",
        "view": "hot",
        "scope": "hot",
        "board_id": "main",
        "window": 10,
    }
    assert ranking(pushed["entries"], "rank", "user_id", "score") == [(1, "u-1", 4.0)]
    assert ranking(changed["entries"], "user_id", "score") == [("u-2", 9.0), ("u-1", 4.0)]
    [mvp] = mvp_current
    assert (mvp["type"], mvp["view"], mvp["period"]) == ("leaderboard", "mvps", "weekly")
    assert ranking(mvp["entries"], "user_id", "share") == [("u-2", 9 / 13), ("u-1", 4 / 13)]
    [hot] = hot_current
    assert hot["window"] == 60 and hot["entries"] == changed["entries"]


@pytest.mark.stack
async def test_the_running_aggregator_pushes_hot_changes_and_counts_a_redelivery_once(
    stack: Stack,
) -> None:
    user, other = f"hot-{uuid.uuid4().hex[:6]}", f"mark-{uuid.uuid4().hex[:6]}"
    connection = await connect_broker(stack.settings.amqp_urls)
    async with (
        connection,
        websockets.connect(f"{stack.ws}?token={DEV_SERVER_KEY}") as ws,
        httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as client,
    ):
        channel = await connection.channel()
        exchange = await channel.get_exchange(f"{stack.settings.broker_prefix}.scores")
        # A tap of our own on the fanout sees exactly what the aggregator sees.
        tap = await channel.declare_queue(exclusive=True)
        await tap.bind(exchange)
        await subscribe(ws, "leaderboard:main:hot:10")

        async def score(who: str, value: int, team: str) -> None:
            body = {"user_id": who, "region": "eu", "value": value, "team_id": team}
            response = await client.post("/v1/boards/main/scores", json=body)
            assert response.status_code == 200, response.text

        await score(user, 12, "red")
        await score(user, 18, "red")

        async def pushed() -> dict[str, Any] | None:
            message = await recv(ws, 15)
            entries = message.get("entries", [])
            return message if entries and entries[0]["score"] == 15.0 else None

        message = await eventually(pushed, within=15)

        # Both events delivered to the aggregator again (the relay may have sent them as one
        # message or two) after a third, then a fresh event behind them: once it shows, they
        # were handled.
        seen: list[Any] = []
        while sum(m.body.decode().count(user) for m in seen) < 2:
            seen.append(await eventually(lambda: tap.get(no_ack=True, fail=False)))
        await score(user, 30, "red")  # so that counting the first two again would show
        for again in seen:
            await republish(exchange, again)
        await score(other, 5, "blue")

        async def read(path: str, size: int) -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(path)).json()
            return body if len(body["entries"]) == size else None

        hot = await eventually(lambda: read(HOT + "?window=10", 2), within=10)
        mvps = await eventually(lambda: read(MVPS, 2), within=10)
        metrics = (await client.get(stack.ops("aggregator") + "/metrics")).text
    handed = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('ladder_consumer_events_total{consumer="aggregator"}')
    )
    assert handed >= 6, "four events, and two of them delivered again"
    assert (message["view"], message["window"]) == ("hot", 10)
    assert ranking(message["entries"], "user_id", "score") == [(user, 15.0)]
    # (12 + 18 + 30) / 3; with the first two counted again it would be 90 / 5 = 18.
    assert ranking(hot["entries"], "user_id", "score") == [(user, 20.0), (other, 5.0)]
    assert ranking(mvps["entries"], "user_id", "team_id", "user_score", "share") == [
        (user, "red", 60, 1.0),  # equal shares: the larger user_score first
        (other, "blue", 5, 1.0),
    ]
