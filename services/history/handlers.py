"""Writes accepted score events into the event log, each (board_id, event_id) exactly once."""

from __future__ import annotations

from typing import Any

import structlog
from prometheus_client import Counter
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import score_events, to_db_time
from shared.events import ScoreAccepted

log = structlog.get_logger(__name__)

ROWS = Counter(
    "ladder_history_events_total",
    "Events offered to the event log, by whether they were new or already stored",
    ["outcome"],
)

# Bounds one statement's size well under MariaDB's default 16 MiB max_allowed_packet, whatever
# LADDER_HISTORY_BATCH says (a row is well under 1 KiB).
CHUNK_ROWS = 1000


def _row(event: ScoreAccepted) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "board_id": event.board_id,
        "user_id": event.user_id,
        "region": event.region,
        "team_id": event.team_id,
        "display_name": event.display_name,
        "value": event.value,
        "occurred_at": to_db_time(event.occurred_at),
        "accepted_at": to_db_time(event.accepted_at),
    }


class HistoryHandler:
    """The history consumer's handler: one multi-row upsert a batch, in one transaction.

    The unique key on (board_id, event_id) makes the write idempotent, so a batch the broker
    delivers again after a crash before the ack stores nothing twice. ``ON DUPLICATE KEY UPDATE
    id = id`` rather than ``INSERT IGNORE``: IGNORE also swallows genuine errors (a value out of
    range would be stored clipped), and every warning it raises costs asyncmy a ``SHOW
    WARNINGS`` round trip. Give it an engine made with ``changed_rows=True`` for honest
    inserted / duplicate counts; with any other the events are stored just the same.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        if not events:
            return
        rows = [_row(event) for event in events]
        inserted = 0
        async with self.engine.begin() as conn:
            for start in range(0, len(rows), CHUNK_ROWS):
                statement = insert(score_events).values(rows[start : start + CHUNK_ROWS])
                # MySQL reports 1 for an inserted row and 0 for a duplicate left as it was.
                statement = statement.on_duplicate_key_update(id=score_events.c.id)
                inserted += (await conn.execute(statement)).rowcount
        duplicates = len(rows) - inserted
        ROWS.labels("inserted").inc(inserted)
        ROWS.labels("duplicate").inc(duplicates)
        log.debug("events stored", inserted=inserted, duplicates=duplicates)
