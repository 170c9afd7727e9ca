"""score_events: an event id belongs to its board and user, unique on (board_id, user_id,
event_id)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 23:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Names spelled out instead of taken from shared.db: a migration is a frozen record of one step.
TABLE = "score_events"
OLD_KEY = "uq_score_events_board_id_event_id"
NEW_KEY = "uq_score_events_board_id_user_id_event_id"


def upgrade() -> None:
    # One ALTER TABLE that adds the new key and drops the old one: MariaDB (10.0 and later) and
    # MySQL 8 build a secondary index in place, without copying the table and without locking
    # out writes, however many events it holds; the table is never without a unique key. Every
    # row already stored is unique on the new key, which holds the old one's columns and more,
    # so the step cannot fail on the data.
    op.execute(
        f"ALTER TABLE `{TABLE}` ADD CONSTRAINT `{NEW_KEY}` UNIQUE (board_id, user_id, event_id), "
        f"DROP INDEX `{OLD_KEY}`, ALGORITHM=INPLACE, LOCK=NONE"
    )


def downgrade() -> None:
    # The way back to (board_id, event_id) holds only while no two users' events of a board
    # share an id, which this revision allows. Rather than drop such events (the history is
    # the source of truth) or let MariaDB fail half way, it refuses, naming them, and changes
    # nothing: an operator decides what to do with them first.
    shared = (
        op.get_bind()
        .execute(
            sa.text(
                f"SELECT board_id, event_id, COUNT(*) AS users FROM `{TABLE}` "
                "GROUP BY board_id, event_id HAVING COUNT(*) > 1 ORDER BY board_id, event_id "
                "LIMIT 5"
            )
        )
        .all()
    )
    if shared:
        examples = ", ".join(f"{r.board_id}/{r.event_id} ({r.users} users)" for r in shared)
        raise RuntimeError(
            f"cannot downgrade below 0004: events of different users share an event id on a "
            f"board (e.g. {examples}); the key (board_id, event_id) would refuse them"
        )
    op.execute(
        f"ALTER TABLE `{TABLE}` ADD CONSTRAINT `{OLD_KEY}` UNIQUE (board_id, event_id), "
        f"DROP INDEX `{NEW_KEY}`, ALGORITHM=INPLACE, LOCK=NONE"
    )
