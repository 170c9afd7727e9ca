"""A read's current period is kept while it is current (services/api/reads/views.py,
``current_window``): whatever the moment, forwards or backwards, it is the window
``window_at`` finds, across days, weeks, months, seasons and changes of offset."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from services.api.reads import views
from shared.periods import Period, window_at

STEPS = [1, 59, 600, 3600, 8 * 3600, 86400, 7 * 86400 // 5, 3 * 86400]


@pytest.mark.parametrize("timezone", ["UTC", "America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize(
    ("period", "schedule"),
    [
        ("daily", None),
        ("weekly", None),
        ("monthly", None),
        ("alltime", None),
        ("season", "0 18 * * 5"),
        ("season", "30 */6 * * *"),
    ],
)
def test_the_kept_window_is_the_one_window_at_finds(
    period: Period, schedule: str | None, timezone: str
) -> None:
    rng = random.Random(f"{period}{schedule}{timezone}")
    views._CURRENT.clear()
    moment = datetime(2026, 3, 1, tzinfo=UTC)  # both of New York's and Lord Howe's changes ahead
    for _ in range(600):
        step = timedelta(seconds=rng.choice(STEPS))
        moment += step if rng.random() > 0.1 else -step
        found = views.current_window(period, moment, timezone, schedule)
        assert found == window_at(period, moment, timezone, schedule), moment
    assert len(views._CURRENT) == 1
