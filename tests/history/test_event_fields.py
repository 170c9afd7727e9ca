"""The wide scores' fields in the event log (docs/api.md sections 4 and 7): each event's
``subscore`` and ``metadata`` are stored with it, the metadata as the compact JSON text the
write function was given, and the events read shows both, null when the event had none."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import HistoryHandler
from shared.db import score_events, user_events
from shared.events import (
    ScoreAccepted,
    ScoreMessage,
    message_body,
    parse_period_ids,
    with_outbox_id,
)
from shared.ranking import MAX_SCORE
from tests.helpers import T0, accepted_event

# Key order, nesting, every JSON type, text that needs escaping in JSON and in SQL, and
# characters outside the BMP: each must come back as it went in.
METADATA: dict[str, Any] = {
    "weapon": "bow",
    "z-first": {"nested": [1, -2.5, True, False, None, "ü"]},
    "a-last": "50% %s 'q' \\ \"d\" 😀",
    "big": MAX_SCORE,
}


def wide(event_id: str, subscore: int | None, metadata: dict[str, Any] | None) -> ScoreAccepted:
    """An accepted event with the given subscore and metadata, accepted a second after ``T0``
    per number in its id, so that the events read lists them newest first."""
    at = T0 + timedelta(seconds=int(event_id.rpartition("-")[2]))
    return accepted_event(event_id, accepted_at=at).model_copy(
        update={"subscore": subscore, "metadata": metadata}
    )


async def stored(db: AsyncEngine) -> dict[str, tuple[int | None, str | None]]:
    """Each stored event's subscore and metadata text, as the columns hold them."""
    t = score_events.c
    async with db.connect() as conn:
        rows = (await conn.execute(select(t.event_id, t.subscore, t.metadata))).all()
    return {row.event_id: (row.subscore, row.metadata) for row in rows}


async def test_subscore_and_metadata_are_stored_with_each_event(db: AsyncEngine) -> None:
    await HistoryHandler(db)(
        [
            wide("e-1", 7, METADATA),
            wide("e-2", -MAX_SCORE, None),
            wide("e-3", None, {}),
            wide("e-4", None, None),
        ]
    )

    assert await stored(db) == {
        # The compact text orjson makes: what the write function was given (shared/submit.py).
        "e-1": (7, orjson.dumps(METADATA).decode()),
        "e-2": (-MAX_SCORE, None),
        # An empty object is metadata all the same, not none.
        "e-3": (None, "{}"),
        "e-4": (None, None),
    }


async def test_a_redelivered_event_keeps_its_first_fields(db: AsyncEngine) -> None:
    handler = HistoryHandler(db)
    await handler([wide("e-1", 7, {"run": 1})])

    # The same event again, as a redelivery that somehow differs: the first copy wins.
    await handler([wide("e-1", 8, {"run": 2}), wide("e-2", None, {"run": 3})])

    assert await stored(db) == {"e-1": (7, '{"run":1}'), "e-2": (None, '{"run":3}')}


async def test_the_events_read_shows_subscore_and_metadata(db: AsyncEngine) -> None:
    await HistoryHandler(db)(
        [wide("e-1", 7, METADATA), wide("e-2", None, None), wide("e-3", 0, {"k": []})]
    )

    events, cursor = await user_events(db, "main", "u-1", 10, None)

    assert cursor is None
    assert [(e["event_id"], e["subscore"], e["metadata"]) for e in events] == [
        ("e-3", 0, {"k": []}),
        ("e-2", None, None),
        ("e-1", 7, METADATA),
    ]
    # The object read back is the one stored, its keys in the order they were sent.
    assert orjson.dumps(events[2]["metadata"]) == orjson.dumps(METADATA)
    assert list(events[0]) == [
        "event_id",
        "user_id",
        "region",
        "team_id",
        "value",
        "subscore",
        "metadata",
        "occurred_at",
        "accepted_at",
    ]


async def test_the_periods_each_event_was_written_to_are_stored(db: AsyncEngine) -> None:
    """The periods and ids of the event's write, in its order: what the rebuild replays it into,
    whatever the board's definition says by then (shared/events.py period_ids_text)."""
    result = {"score": 5, "rank": 1, "previous_rank": None, "improved": True}
    written = {
        "daily": {**result, "period_id": "2026-11-29"},
        "alltime": {**result, "period_id": "all"},
        "season": {**result, "period_id": "2026-11-27T18:00"},
    }
    event = ScoreAccepted.model_validate(
        {**wide("e-1", None, None).model_dump(), "periods": written}
    )
    await HistoryHandler(db)([event, wide("e-2", None, None)])

    t = score_events.c
    async with db.connect() as conn:
        rows = (await conn.execute(select(t.event_id, t.periods).order_by(t.event_id))).all()
    assert [tuple(row) for row in rows] == [
        ("e-1", "daily=2026-11-29,alltime=all,season=2026-11-27T18:00"),
        ("e-2", "alltime=all"),
    ]
    assert parse_period_ids(rows[0].periods) == [
        ("daily", "2026-11-29"),
        ("alltime", "all"),
        ("season", "2026-11-27T18:00"),
    ]


async def test_the_outbox_position_of_each_event_is_stored_from_its_message(
    db: AsyncEngine,
) -> None:
    """A message as the relay makes it, each outbox entry's text with its stream id spliced in:
    history stores the id's two numbers, which the rebuild replays the board's events by. An
    event published without one (by a relay of the release before) stores NULL in both."""
    entries = [wide(f"e-{i}", None, None).model_dump_json(exclude={"outbox_id"}) for i in (1, 2, 3)]
    body = message_body(
        [
            with_outbox_id("1764435600123-11", entries[0]),
            with_outbox_id("1764435600999-0", entries[1]),
            entries[2],
        ]
    )
    events = ScoreMessage.model_validate_json(body).events
    assert [e.outbox_id for e in events] == ["1764435600123-11", "1764435600999-0", None]

    await HistoryHandler(db)(events)

    t = score_events.c
    async with db.connect() as conn:
        rows = await conn.execute(select(t.event_id, t.outbox_ms, t.outbox_seq).order_by(t.id))
        assert [tuple(row) for row in rows] == [
            ("e-1", 1764435600123, 11),
            ("e-2", 1764435600999, 0),
            ("e-3", None, None),
        ]


@pytest.mark.parametrize(
    "outbox_id", ["1764435600123", "1764435600123-", "a-1", "-1", "1-2-3", "9223372036854775808-0"]
)
def test_an_outbox_id_that_is_no_stream_id_is_refused(outbox_id: str) -> None:
    """Not ``<ms>-<seq>``, or a part beyond the event log's BIGINT: the message is refused (the
    consumers dead-letter it as poison) rather than stored out of order."""
    text = with_outbox_id(outbox_id, wide("e-1", None, None).model_dump_json(exclude={"outbox_id"}))
    with pytest.raises(ValidationError, match="outbox_id"):
        ScoreAccepted.model_validate_json(text)
