"""The ranking held against a plain model (docs/api.md section 3: operators, orders and ties).

Random sequences of writes go through the real write path (``services.api.write.submit``, one
Redis Function call each, no HTTP); the region's board read back with ``ZREVRANGE`` must hold the
same users, in the same order, with the same scores as a list kept by hand. Values are drawn
across the whole range, ±(2**53 - 1), with small ones and the edges often enough that equal
scores, ties, and totals that would leave the range (refused, writing nothing) happen.

Boards with a ``subscore_order`` (``best`` and ``set``) are held the same way against a model of
(score, subscore) pairs, subscores drawn like the values; the subscore is read back from the
member's tie key.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from services.api.errors import Invalid
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.periods import Period, window_at
from shared.ranking import MAX_SCORE, id_of, score_of, subscore_of
from shared.redis import open_redis
from shared.settings import LadderSettings
from tests.conftest import ON_CLUSTER
from tests.helpers import read_view

Operator = Literal["incr", "best", "set"]
Order = Literal["desc", "asc"]
PERIODS: tuple[Period, ...] = ("alltime", "daily")
REGION = "eu"
USERS = [f"u-{i}" for i in range(6)]
# The whole range, with small values and the edges often, so that equal scores, and so ties, and
# totals beyond the range actually happen.
_EDGES = st.sampled_from([MAX_SCORE, -MAX_SCORE, MAX_SCORE - 1, -MAX_SCORE + 1, 2**52, -(2**52)])
_WIDE = st.one_of(st.integers(-3, 3), _EDGES, st.integers(-MAX_SCORE, MAX_SCORE))
VALUES = {"incr": _WIDE, "best": _WIDE, "set": _WIDE}
# Scores for the subscore boards: fewer small ones, so that equal scores, and so their order by
# subscore, come up often.
_FEW = st.one_of(st.integers(-1, 1), _EDGES, st.integers(-MAX_SCORE, MAX_SCORE))
# And fewer users, so that a user's writes meet its own pair often.
PAIR_USERS = 3


@dataclass
class Standing:
    score: int
    reached: datetime


def model(
    operator: Operator, order: Order, writes: list[tuple[str, int, datetime]]
) -> tuple[list[tuple[str, int]], list[bool | None]]:
    """The board by hand: ``(user, score)`` best first, and whether each write changed a score
    (``None``: refused, its total beyond ±MAX_SCORE, nothing written).

    A score's time is when it was reached: for ``incr``, when its latest event happened (an
    increment of 0 included: the writes here come in the order they happened, and the write
    takes the later of the two times); for ``best``, when the best was first reached (an equal
    one later does not replace it); for ``set``, when the latest different value was set. Equal
    scores rank the earlier first.
    """
    better = (lambda a, b: a > b) if order == "desc" else (lambda a, b: a < b)
    board: dict[str, Standing] = {}
    changed: list[bool | None] = []
    for user, value, at in writes:
        old = board.get(user)
        if old is None:
            new = value
        elif operator == "incr":
            new = old.score + value
        elif operator == "best":
            new = value if better(value, old.score) else old.score
        else:
            new = value
        if abs(new) > MAX_SCORE:
            changed.append(None)
            continue
        moved = old is None or new != old.score
        if moved or operator == "incr":
            board[user] = Standing(new, at)
        changed.append(moved)
    sign = -1 if order == "desc" else 1
    ranked = sorted(board.items(), key=lambda kv: (sign * kv[1].score, kv[1].reached))
    return [(user, s.score) for user, s in ranked], changed


def ladder_settings(prefix: str, redis_url: str) -> LadderSettings:
    return LadderSettings(
        _env_file=None,  # type: ignore[call-arg]
        redis_url=redis_url,
        redis_cluster=ON_CLUSTER,
        key_prefix=prefix,
        user_rate=1e6,
        key_rate=1e6,
    )


async def read_board(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str
) -> list[tuple[str, int]]:
    view = keys.region_view(board.board_id, period, period_id, REGION)
    return await read_view(redis, view, board.descending)


async def drop_prefix(redis: Redis, prefix: str) -> None:
    for pattern in (f"{prefix}:*", "{" + prefix + ":*"):
        found = [key async for key in redis.scan_iter(match=pattern, count=1000)]
        if found:
            await redis.delete(*found)


async def scenario(
    operator: Operator, order: Order, plays: list[tuple[int, int]], redis_url: str
) -> None:
    prefix = "lm-" + uuid.uuid4().hex[:12]
    config = ladder_settings(prefix, redis_url)
    keys = Keys(prefix)
    board = Board(
        board_id="model",
        operator=operator,
        order=order,
        periods=PERIODS,
        min_value=-MAX_SCORE,
        max_value=MAX_SCORE,
    )
    # Distinct milliseconds, 1 ms apart: ties go to the earlier to the millisecond, all-time too.
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=500)
    writes = [
        (USERS[who], value, start + timedelta(milliseconds=i))
        for i, (who, value) in enumerate(plays)
    ]
    async with open_redis(
        config.redis_url, load_functions=True, cluster=config.redis_cluster
    ) as redis:
        try:
            answers: list[dict[str, Any] | None] = []
            for i, (user, value, at) in enumerate(writes):
                score = ScoreIn(user_id=user, region=REGION, value=value, occurred_at=at)
                try:
                    answers.append(await submit(redis, keys, config, board, score, f"e{i}"))
                except Invalid:
                    answers.append(None)  # refused: a total beyond the range

            expected, changed = model(operator, order, writes)
            got = await read_board(redis, keys, board, "alltime", "all")
            assert got == expected
            assert [a and a["periods"]["alltime"]["improved"] for a in answers] == changed
            # The rank each write read in its atomic step is the model's after that write.
            for i, answer in enumerate(answers):
                if answer is None:
                    continue
                so_far, _ = model(operator, order, writes[: i + 1])
                user = writes[i][0]
                rank = [u for u, _ in so_far].index(user) + 1
                standing = answer["periods"]["alltime"]
                assert (standing["rank"], standing["score"]) == (rank, so_far[rank - 1][1])

            # Daily: the same rules within each day the writes fell in (a run may span midnight).
            days: dict[str, list[tuple[str, int, datetime]]] = {}
            for write in writes:
                days.setdefault(window_at("daily", write[2], board.timezone).period_id, []).append(
                    write
                )
            for day, within in days.items():
                expected_day, _ = model(operator, order, within)
                assert await read_board(redis, keys, board, "daily", day) == expected_day
        finally:
            await drop_prefix(redis, prefix)


@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("operator", ["incr", "best", "set"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_board_holds_the_model(
    operator: Operator, order: Order, data: st.DataObject, redis_url: str
) -> None:
    plays = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(USERS) - 1), VALUES[operator]), min_size=1, max_size=25
        ),
        label="plays (user index, value)",
    )
    asyncio.run(scenario(operator, order, plays, redis_url))


def test_the_model_knows_its_rules() -> None:
    t = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i) for i in range(4)]
    # best: an equal score later keeps the earlier time, so u-0 stays ahead of u-1.
    writes = [("u-0", 3, t[0]), ("u-1", 3, t[1]), ("u-0", 3, t[2])]
    assert model("best", "desc", writes) == ([("u-0", 3), ("u-1", 3)], [True, True, False])
    # set: a new equal value keeps the time; a different one moves it.
    writes = [("u-0", 2, t[0]), ("u-1", 2, t[1]), ("u-0", 1, t[2]), ("u-0", 2, t[3])]
    assert model("set", "asc", writes)[0] == [("u-1", 2), ("u-0", 2)]
    # incr: adding zero changes no score, but the total is reached at its latest event (so that
    # the order late events come in, a rebuild's included, never decides a tie).
    writes = [("u-0", 1, t[0]), ("u-1", 1, t[1]), ("u-0", 0, t[2])]
    assert model("incr", "desc", writes) == ([("u-1", 1), ("u-0", 1)], [True, True, False])


# --- subscores -------------------------------------------------------------------------------

Pair = tuple[int, int]


@dataclass
class PairStanding:
    pair: Pair
    reached: datetime


def pair_model(
    operator: Operator, order: Order, sub_order: Order, writes: list[tuple[str, Pair, datetime]]
) -> tuple[list[tuple[str, int, int]], list[bool]]:
    """A subscore board by hand: ``(user, score, subscore)`` best first, and whether each write
    changed the entry. Pairs compare by score in ``order``, then subscore in ``sub_order``;
    ``best`` keeps the better pair (an equal one later changes nothing), ``set`` the latest, and
    a pair's time is when it was reached (the same pair again keeps it). Equal pairs rank the
    earlier first."""
    sign, sub_sign = (1 if order == "desc" else -1), (1 if sub_order == "desc" else -1)

    def key(pair: Pair) -> Pair:
        return sign * pair[0], sub_sign * pair[1]

    board: dict[str, PairStanding] = {}
    changed: list[bool] = []
    for user, pair, at in writes:
        old = board.get(user)
        if old is None:
            moved = True
        elif operator == "best":
            moved = key(pair) > key(old.pair)
        else:
            moved = pair != old.pair
        if moved:
            board[user] = PairStanding(pair, at)
        changed.append(moved)
    # Best first: the greater key, then the earlier.
    ranked = sorted(
        board.items(), key=lambda kv: (-key(kv[1].pair)[0], -key(kv[1].pair)[1], kv[1].reached)
    )
    return [(user, s.pair[0], s.pair[1]) for user, s in ranked], changed


async def read_pairs(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str
) -> list[tuple[str, int, int]]:
    """A region's board read back as ``(id, score, subscore)`` (the layout of shared/ranking.py:
    the subscore is in the member's tie key)."""
    assert board.subscore_order is not None
    view = keys.region_view(board.board_id, period, period_id, REGION)
    rows = cast(list[tuple[str, float]], await redis.zrevrange(view, 0, -1, withscores=True))
    return [
        (id_of(m), score_of(s, board.descending), subscore_of(m, board.subscore_order))
        for m, s in rows
    ]


async def pair_scenario(
    operator: Operator,
    order: Order,
    sub_order: Order,
    plays: list[tuple[int, int, int]],
    redis_url: str,
) -> None:
    prefix = "lm-" + uuid.uuid4().hex[:12]
    config = ladder_settings(prefix, redis_url)
    keys = Keys(prefix)
    board = Board(
        board_id="pairs",
        operator=operator,
        order=order,
        subscore_order=sub_order,
        periods=PERIODS,
        min_value=-MAX_SCORE,
        max_value=MAX_SCORE,
    )
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=500)
    writes = [
        (USERS[who], (value, sub), start + timedelta(milliseconds=i))
        for i, (who, value, sub) in enumerate(plays)
    ]
    async with open_redis(
        config.redis_url, load_functions=True, cluster=config.redis_cluster
    ) as redis:
        try:
            answers: list[dict[str, Any]] = []
            for i, (user, (value, sub), at) in enumerate(writes):
                body = {"user_id": user, "region": REGION, "value": value, "subscore": sub}
                score = ScoreIn.model_validate(body | {"occurred_at": at})
                answers.append(await submit(redis, keys, config, board, score, f"e{i}"))

            expected, changed = pair_model(operator, order, sub_order, writes)
            assert await read_pairs(redis, keys, board, "alltime", "all") == expected
            assert [a["periods"]["alltime"]["improved"] for a in answers] == changed
            for i, answer in enumerate(answers):
                so_far, _ = pair_model(operator, order, sub_order, writes[: i + 1])
                rank = [u for u, _, _ in so_far].index(writes[i][0]) + 1
                standing = answer["periods"]["alltime"]
                assert (standing["rank"], standing["score"]) == (rank, so_far[rank - 1][1])
            days: dict[str, list[tuple[str, Pair, datetime]]] = {}
            for write in writes:
                day = window_at("daily", write[2], board.timezone).period_id
                days.setdefault(day, []).append(write)
            for day, within in days.items():
                expected_day, _ = pair_model(operator, order, sub_order, within)
                assert await read_pairs(redis, keys, board, "daily", day) == expected_day
        finally:
            await drop_prefix(redis, prefix)


@pytest.mark.parametrize("sub_order", ["desc", "asc"])
@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("operator", ["best", "set"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_subscore_board_holds_the_model(
    operator: Operator, order: Order, sub_order: Order, data: st.DataObject, redis_url: str
) -> None:
    plays = data.draw(
        st.lists(st.tuples(st.integers(0, PAIR_USERS - 1), _FEW, _WIDE), min_size=1, max_size=25),
        label="plays (user index, value, subscore)",
    )
    asyncio.run(pair_scenario(operator, order, sub_order, plays, redis_url))


def test_the_pair_model_knows_its_rules() -> None:
    t = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=i) for i in range(5)]
    # best, desc, subscore asc: (3, 1) beats (3, 2); an equal pair later keeps the earlier time.
    writes = [("u-0", (3, 2), t[0]), ("u-1", (3, 1), t[1]), ("u-0", (3, 1), t[2])]
    writes += [("u-1", (3, 1), t[3]), ("u-0", (2, -9), t[4])]
    assert pair_model("best", "desc", "asc", writes) == (
        [("u-1", 3, 1), ("u-0", 3, 1)],
        [True, True, True, False, False],
    )
    # set, asc, subscore desc: every other pair replaces; the same pair again keeps the time.
    writes = [("u-0", (3, 2), t[0]), ("u-1", (3, 2), t[1]), ("u-0", (3, 2), t[2])]
    writes += [("u-1", (3, 5), t[3]), ("u-0", (4, 9), t[4])]
    assert pair_model("set", "asc", "desc", writes) == (
        [("u-1", 3, 5), ("u-0", 4, 9)],
        [True, True, False, True, True],
    )


# --- concurrency -----------------------------------------------------------------------------

THREADS = 8
WRITES_PER_THREAD = 40
RACERS = [f"r-{i}" for i in range(4)]


async def race(board: Board, config: LadderSettings, thread: int) -> dict[str, list[int]]:
    """One thread's writes, on its own event loop and connection; what it sent, by user."""
    rng = random.Random(thread)
    sent: dict[str, list[int]] = {}
    keys = Keys(config.key_prefix)
    async with open_redis(config.redis_url, cluster=config.redis_cluster) as redis:
        for i in range(WRITES_PER_THREAD):
            user, value = rng.choice(RACERS), rng.randint(-1000, 1000)
            score = ScoreIn(user_id=user, region=REGION, value=value)
            await submit(redis, keys, config, board, score, f"t{thread}-{i}")
            sent.setdefault(user, []).append(value)
    return sent


@pytest.mark.parametrize("order", ["desc", "asc"])
async def test_8_threads_racing_on_one_best_board_keep_each_users_best(
    order: Order, redis_url: str
) -> None:
    prefix = "lr-" + uuid.uuid4().hex[:12]
    config = ladder_settings(prefix, redis_url)
    board = Board(board_id="race", operator="best", order=order, periods=PERIODS)
    async with open_redis(
        config.redis_url, load_functions=True, cluster=config.redis_cluster
    ) as redis:
        try:
            with ThreadPoolExecutor(max_workers=THREADS) as pool:
                futures = [
                    pool.submit(asyncio.run, race(board, config, thread))
                    for thread in range(THREADS)
                ]
                # The threads block; this loop waits for them without blocking itself.
                sent = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
            keep = max if order == "desc" else min
            best = {user: keep(v for s in sent for v in s.get(user, [])) for user in RACERS}
            keys = Keys(prefix)
            stored = dict(await read_board(redis, keys, board, "alltime", "all"))
            assert stored == best
            assert sum(len(values) for s in sent for values in s.values()) == (
                THREADS * WRITES_PER_THREAD
            )
        finally:
            await drop_prefix(redis, prefix)
