"""score_events: the events a deleted board kept apart from a board made later under its name,
unique on (board_id, board_epoch, user_id, event_id)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Names spelled out instead of taken from shared.db: a migration is a frozen record of one step.
TABLE = "score_events"
OLD_KEY = "uq_score_events_board_id_user_id_event_id"
NEW_KEY = "uq_score_events_board_id_board_epoch_user_id_event_id"


def upgrade() -> None:
    # 0: the board as it is. A deleted board's events, kept (a deletion without purge), take the
    # deletion's cut-off in ms, so that a board made afterwards under the name may use the same
    # event ids: under the old key the history consumer took them for redeliveries and stored
    # nothing. The column and the key in one ALTER TABLE, in place.
    op.execute(
        f"ALTER TABLE `{TABLE}` ADD COLUMN board_epoch BIGINT NOT NULL DEFAULT 0, "
        f"ADD CONSTRAINT `{NEW_KEY}` UNIQUE (board_id, board_epoch, user_id, event_id), "
        f"DROP INDEX `{OLD_KEY}`"
    )
    # The events of boards deleted before this revision. A board deleted more than once keeps
    # one row in board_deletions, its last: every event of its earlier lives takes that
    # cut-off. They are unique among themselves, since the old key refused a repeated id.
    op.execute(
        f"UPDATE `{TABLE}` e JOIN board_deletions d ON e.board_id = d.board_id "
        # The cut-off is naive UTC: counted from 1970 as it is, whatever the session's zone.
        "SET e.board_epoch = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', d.cutoff) DIV 1000 "
        "WHERE d.done_at IS NOT NULL AND e.accepted_at <= d.cutoff"
    )


def downgrade() -> None:
    # Back to (board_id, user_id, event_id): refused while a kept event of a deleted board and
    # one of the board made after it share an id, which the old key cannot hold.
    shared = (
        op.get_bind()
        .exec_driver_sql(
            f"SELECT board_id, user_id, event_id FROM `{TABLE}` "
            "GROUP BY board_id, user_id, event_id HAVING COUNT(*) > 1 LIMIT 5"
        )
        .all()
    )
    if shared:
        examples = ", ".join(f"{r.board_id}/{r.user_id}/{r.event_id}" for r in shared)
        raise RuntimeError(
            f"cannot downgrade below 0008: a deleted board's kept events and its successor's "
            f"share event ids (e.g. {examples})"
        )
    op.execute(
        f"ALTER TABLE `{TABLE}` ADD CONSTRAINT `{OLD_KEY}` UNIQUE (board_id, user_id, event_id), "
        f"DROP INDEX `{NEW_KEY}`, DROP COLUMN board_epoch"
    )
