"""A season's close is named by its bounds, not its id alone (docs/api.md 8b, section 3).

A changed schedule starts its own seasons at once, and one of them may start at the same minute
as a season of the schedule before, so carry the same id: it is still a period of its own,
announced once with a ``message_id`` of its own. No consumer runs here: the close's last merge
makes the global board from the regional ones, as in test_period_close.py, and its wait for the
derive step (the teams scope) is taken as run out at once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from redis.asyncio import Redis

from services.aggregator import closer as closer_module
from services.aggregator.closer import Closer
from services.aggregator.merge import Merger
from services.aggregator.period_relay import message_id
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.functions import CLOSE_PERIOD_FUNCTION
from shared.keys import Keys
from shared.periods import PeriodWindow, close_name, window_at
from shared.settings import LadderSettings
from tests.helpers import catalog_of


@pytest.fixture(autouse=True)
async def no_derive_wait(monkeypatch: pytest.MonkeyPatch, redis: Redis, keys: Keys) -> None:
    """No consumer runs: the close's wait for the derive step taken as run out at once; and
    the board is defined, as a close writes only for a board whose definition is stored."""
    monkeypatch.setattr(closer_module, "DERIVE_WAIT", 0.0)
    await catalog_of(redis, keys, ["cup"])


MINUTES = Board(board_id="cup", periods=("alltime",), schedule="* * * * *", regions=("eu",))
FIVES = MINUTES.model_copy(update={"schedule": "*/5 * * * *"})


async def close_until_claimed(closer: Closer, merger: Merger, board: Board, now: datetime) -> None:
    """Tick the closer (and the merge between its ticks) often enough to claim what is due."""
    for _ in range(6):
        await closer.close_board(board, now)
        await merger.merge_board(board)


async def season_messages(redis: Redis, keys: Keys) -> list[tuple[str, dict]]:
    """The outbox's season messages, oldest first, each with the message id it goes out with."""
    entries = await redis.xrange(keys.periods_outbox("cup"))
    found = [(message_id(fields), orjson.loads(fields["m"])) for _, fields in entries]
    return [(mid, body) for mid, body in found if body["period"] == "season"]


async def test_a_new_schedules_season_with_a_closed_seasons_id_is_announced(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    # The five minutes before the current block of five: both seasons named ``start`` (the
    # minute's and the five minutes') lie wholly in the past, within the writes' lateness.
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 5 + 5)
    late_ok = settings.model_copy(update={"allowed_lateness": 900.0})
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    merger = Merger(redis, keys)
    after = timedelta(seconds=5)  # past the close's delay, 3.2 s

    a = ScoreIn(user_id="a", region="eu", value=1, occurred_at=start + timedelta(seconds=10))
    await submit(redis, keys, late_ok, MINUTES, a, "e-a")
    minute = window_at("season", start, "UTC", MINUTES.schedule)
    assert minute.end is not None
    await close_until_claimed(closer, merger, MINUTES, minute.end + after)
    [(first_id, first)] = await season_messages(redis, keys)
    assert [(e["user_id"], e["score"]) for e in first["scopes"]["global"]] == [("a", 1)]

    # The schedule changes; ``b`` scores three minutes into the season of five minutes that
    # starts at the same minute, so has the same id.
    b = ScoreIn(user_id="b", region="eu", value=9, occurred_at=start + timedelta(minutes=3))
    answer = await submit(redis, keys, late_ok, FIVES, b, "e-b")
    season = window_at("season", start, "UTC", FIVES.schedule)
    assert season.end is not None
    assert answer["periods"]["season"]["period_id"] == season.period_id == minute.period_id
    await close_until_claimed(closer, merger, FIVES, season.end + after)
    await close_until_claimed(closer, merger, FIVES, season.end + timedelta(minutes=5) + after)

    messages = await season_messages(redis, keys)
    assert len(messages) == 2
    (_, old), (second_id, new) = messages
    assert old == first
    assert new["period_id"] == season.period_id
    assert new["scopes"]["global"][0]["user_id"] == "b"
    assert new["scopes"]["global"][0]["score"] == 9
    # Two periods, two message ids: a consumer deduplicating on it keeps both.
    assert first_id == f"cup:season:{close_name(minute)}"
    assert second_id == f"cup:season:{close_name(season)}"
    assert first_id != second_id
    # Each is claimed once: ticks later close neither again.
    await close_until_claimed(closer, merger, FIVES, season.end + timedelta(minutes=6) + after)
    assert len(await season_messages(redis, keys)) == 2


async def test_a_season_claimed_by_the_version_before_is_not_claimed_again(
    redis: Redis, keys: Keys
) -> None:
    """Upgrading from claims named by the season id alone: an aggregator of the version before
    claims a season under that name, moving the watermark to its end in the same step, while
    one of this version is closing it (past its look at the claim). No claim of this version's
    name is set, yet the close function refuses the season: the watermark reached its end. The
    next season, which ends after the watermark, is claimed."""
    now = datetime.now(UTC)
    season = window_at("season", now - timedelta(minutes=2), "UTC", MINUTES.schedule)
    following = window_at("season", now - timedelta(minutes=1), "UTC", MINUTES.schedule)
    assert season.end is not None and following.end is not None
    await redis.set(keys.period_closed("cup", "season", season.period_id), "2026-12-05T20:46Z")
    await redis.set(keys.period_watermark("cup", "season"), int(season.end.timestamp()))

    async def close(window: PeriodWindow) -> int:
        assert window.end is not None
        name = close_name(window)
        call_keys = [
            keys.period_closed("cup", "season", name),
            keys.period_watermark("cup", "season"),
            keys.periods_outbox("cup"),
        ]
        body = orjson.dumps({"board_id": "cup", "period_id": window.period_id}).decode()
        args = ["2026-12-05T20:46:03Z", 0, int(window.end.timestamp()), 100, f"cup:season:{name}"]
        closed, _ = await redis.fcall(CLOSE_PERIOD_FUNCTION, 3, *call_keys, *args, body)
        return int(closed)

    assert await close(season) == 0
    assert await redis.xlen(keys.periods_outbox("cup")) == 0
    assert await close(following) == 1
    [(_, entry)] = await redis.xrange(keys.periods_outbox("cup"))
    assert message_id(entry) == f"cup:season:{close_name(following)}"


async def test_a_season_ended_but_not_closed_when_its_schedule_changes_is_not_closed(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The limit docs/api.md section 3 states: the closer knows the schedule in force only, so
    a season of the old schedule that ended within its close's delay before the change (the
    lateness, here 2 s, and a merge interval and a second) is never announced."""
    now = datetime.now(UTC)
    late_ok = settings.model_copy(update={"allowed_lateness": 900.0})
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100)
    merger = Merger(redis, keys)
    after = timedelta(seconds=5)  # past the close's delay, 3.2 s
    first = window_at("season", now - timedelta(minutes=4), "UTC", MINUTES.schedule)
    assert first.end is not None
    a = ScoreIn(user_id="a", region="eu", value=1, occurred_at=first.start)
    await submit(redis, keys, late_ok, MINUTES, a, "e-a")
    await close_until_claimed(closer, merger, MINUTES, first.end + after)
    # The next minute season ends; the schedule changes before its close is due.
    second = window_at("season", first.end, "UTC", MINUTES.schedule)
    assert second.end is not None
    b = ScoreIn(user_id="b", region="eu", value=5, occurred_at=second.start)
    await submit(redis, keys, late_ok, MINUTES, b, "e-b")
    await close_until_claimed(closer, merger, MINUTES, second.end + timedelta(seconds=1))
    hours = MINUTES.model_copy(update={"schedule": "0 * * * *"})
    await close_until_claimed(closer, merger, hours, second.end + after)
    await close_until_claimed(closer, merger, hours, second.end + 3 * after)

    assert [body["period_id"] for _, body in await season_messages(redis, keys)] == [
        first.period_id
    ]
