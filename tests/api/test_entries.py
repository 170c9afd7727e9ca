"""A page's or standing's entries (services/api/reads/entries.py ``entries_of``) are
``entry_of``'s, row by row, which ``entries_of`` builds without calling it for users' views:
boards of either order, with and without a subscore, rows with and without names and records,
every rank style, and team views."""

from __future__ import annotations

import random

import pytest

from services.api.reads.entries import entries_of, entry_of
from services.api.reads.styles import RankStyle, walk_ranks
from services.api.reads.views import Row, ScopeKind, View
from shared.boards import MAIN_BOARD
from shared.ranking import member, record, sub_part, tie_key, tie_width


@pytest.mark.parametrize("style", ["ordinal", "competition", "dense"])
@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("subscore_order", [None, "desc", "asc"])
@pytest.mark.parametrize("kind", ["users", "teams"])
def test_the_entries_are_entry_of_each_row(
    style: RankStyle, order: str, subscore_order: str | None, kind: ScopeKind
) -> None:
    rng = random.Random(f"{style}{order}{subscore_order}{kind}")
    board = MAIN_BOARD.model_copy(update={"order": order, "subscore_order": subscore_order})
    view = View(board, "teams" if kind == "teams" else "region:eu", "alltime", "all", "k", kind)
    scored = sorted(
        (
            (
                rng.choice([5, 5, -3, 0, 10**12]),
                member(
                    tie_key(rng.randrange(10**12), sub_part(rng.randrange(-9, 9), subscore_order)),
                    f"u-{i}",
                ),
            )
            for i in range(30)
        ),
        reverse=True,
    )
    rows: list[Row] = [(m, float(signed)) for signed, m in scored]
    names = [rng.choice([None, f"P{i}", "Zoë"]) for i in range(len(rows))]
    records = [
        rng.choice(
            [
                None,
                record(m[: tie_width(m)], int(c)),
                record(m[: tie_width(m)], int(c), '{"k":[1,"x"]}'),
            ]
        )
        for m, c in rows
    ]
    replies = [names, records, 7] if kind != "teams" else [7]
    found = entries_of(view, rows, 41, style, iter(replies))

    first = 41 if style == "ordinal" else 8
    ranks = walk_ranks(style, [view.rank_key(row) for row in rows], 41, first)
    if kind == "teams":
        names, records = [None] * len(rows), [None] * len(rows)
    assert found == [
        entry_of(view, m, c, rank, name, rec)
        for (m, c), rank, name, rec in zip(rows, ranks, names, records, strict=True)
    ]
    assert [list(entry) for entry in found] == [
        list(entry_of(view, m, c, 1, None)) for m, c in rows
    ]  # the same fields in the same order: the same JSON
