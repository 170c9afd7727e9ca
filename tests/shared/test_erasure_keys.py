"""The key layout's parsers the erasure worker relies on (shared/keys.py): a view's board, period
and region, and the user an event record names, whatever ``:`` the ids around them hold."""

from __future__ import annotations

import pytest

from shared.erasure import user_hash
from shared.keys import Keys, parse_view

KEYS = Keys("p")


def test_a_view_is_told_from_its_companions_and_other_keys() -> None:
    view = KEYS.region_view("arena", "season", "2026-12-04T18:00", "eu")
    assert KEYS.view_of(view) == ("arena", "season", "2026-12-04T18:00", "eu")
    na = KEYS.region_view("b", "alltime", "all", "na")
    assert KEYS.view_of(na) == ("b", "alltime", "all", "na")
    assert KEYS.view_of(KEYS.global_view("b", "daily", "2026-12-01")) == (
        "b",
        "daily",
        "2026-12-01",
        None,
    )
    for other in (
        Keys.ties(view),
        Keys.distinct(view),
        Keys.distinct_building(view),
        KEYS.teams_view("arena", "alltime", "all"),
        KEYS.regions("arena", "alltime", "all"),
        Keys("q").region_view("arena", "alltime", "all", "eu"),
    ):
        assert KEYS.view_of(other) is None, other


def test_a_record_names_its_user_even_one_whose_id_holds_colons() -> None:
    assert KEYS.record_user(KEYS.idempotency("b", "e-1", "u:42")) == "u:42"
    assert KEYS.record_user(KEYS.idempotency("b", "e-1", "42")) == "42"
    assert KEYS.record_user(KEYS.legacy_idempotency("b", "e-1")) is None
    assert KEYS.record_user(KEYS.feed("b")) is None


def test_the_tombstone_key_is_keyed_by_the_secret_and_names_nobody() -> None:
    one = user_hash("u-42", "secret-a")
    assert one == user_hash("u-42", "secret-a")
    assert one != user_hash("u-42", "secret-b") and one != user_hash("u-43", "secret-a")
    assert len(one) == 64 and "u-42" not in one


@pytest.mark.parametrize(
    ("suffix", "parsed"),
    [
        ("lb:daily:2026-12-01:global", ("daily", "2026-12-01", None)),
        ("lb:season:2026-12-04T18:00:region:eu", ("season", "2026-12-04T18:00", "eu")),
        ("lb:season:2026-12-04T18:00:global", ("season", "2026-12-04T18:00", None)),
        ("lb:alltime:all:region:eu:ties", None),
        ("lb:weekly:2026-W48:teams", None),
    ],
)
def test_a_view_key_names_its_period_id_even_a_season_s(
    suffix: str, parsed: tuple[str, str, str | None] | None
) -> None:
    assert parse_view(suffix) == parsed
