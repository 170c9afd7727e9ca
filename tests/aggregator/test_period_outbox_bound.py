"""A board's period outbox keeps its newest ``LADDER_PERIODS_OUTBOX_MAX`` messages (docs/
operations.md, "Seasons and period ends"): while none goes out (no queue bound to
``ladder.periods``, the broker away), a close past the bound drops the oldest, counts it in
``ladder_periods_dropped_total`` and says so. Before, the outbox grew by a message a close for as
long as nothing took them. No consumer and no relay run here, as in test_season_identity.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from structlog.testing import capture_logs

from services.aggregator import closer as closer_module
from services.aggregator.closer import Closer
from services.aggregator.merge import Merger
from services.aggregator.period_relay import message_id
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.periods import close_name, window_at
from shared.settings import LadderSettings
from tests.helpers import catalog_of

MINUTES = Board(board_id="cup", periods=("alltime",), schedule="* * * * *", regions=("eu",))


@pytest.fixture(autouse=True)
async def no_derive_wait(monkeypatch: pytest.MonkeyPatch, redis: Redis, keys: Keys) -> None:
    """No consumer runs (the close's wait for the derive step taken as run out), and the board
    is defined, as a close writes only for a board whose definition is stored."""
    monkeypatch.setattr(closer_module, "DERIVE_WAIT", 0.0)
    await catalog_of(redis, keys, ["cup"])


def dropped() -> float:
    return REGISTRY.get_sample_value("ladder_periods_dropped_total") or 0.0


async def test_a_full_period_outbox_keeps_the_newest_closes_and_counts_what_it_drops(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=6)
    late_ok = settings.model_copy(update={"allowed_lateness": 900.0})
    closer = Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=2)
    merger = Merger(redis, keys)
    before = dropped()
    names = []
    with capture_logs() as logs:
        for minute in range(4):
            at = start + timedelta(minutes=minute, seconds=10)
            score = ScoreIn(user_id="a", region="eu", value=minute + 1, occurred_at=at)
            await submit(redis, keys, late_ok, MINUTES, score, f"e-{minute}")
            season = window_at("season", at, "UTC", MINUTES.schedule)
            assert season.end is not None
            for _ in range(6):  # its marks, their merge, its claim
                await closer.close_board(MINUTES, season.end + timedelta(seconds=5))
                await merger.merge_board(MINUTES)
            names.append(f"cup:season:{close_name(season)}")

    entries = await redis.xrange(keys.periods_outbox("cup"))
    assert [message_id(fields) for _, fields in entries] == names[2:]
    assert dropped() - before == 2
    said = [e for e in logs if e["event"].startswith("period outbox full")]
    assert [(e["board_id"], e["dropped"], e["kept"]) for e in said] == [("cup", 1, 2)] * 2
