"""snapshots: a view's snapshot of one take stored once, unique on (board_id, scope, period,
period_id, taken_at)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Names spelled out instead of taken from shared.db: a migration is a frozen record of one step.
TABLE = "snapshots"
KEY = "uq_snapshots_board_id_scope_period_period_id_taken_at"


def upgrade() -> None:
    # Rows of one view under one time, which the key refuses. Before, each pass stored its
    # snapshots under its own time, so two rows share one only by chance (two passes in the same
    # millisecond). A read "at" that time answers the one of highest id (shared/db_boards.py
    # snapshot_at): the others are never shown, and go.
    op.execute(
        f"DELETE s FROM `{TABLE}` s JOIN `{TABLE}` t "
        "ON t.board_id = s.board_id AND t.scope = s.scope AND t.period = s.period "
        "AND t.taken_at = s.taken_at AND t.period_id = s.period_id AND t.id > s.id"
    )
    # A key added in place, without copying the table or locking out writes (MariaDB 10.0 and
    # later, MySQL 8), beside the index the reads scan, which stays as it is.
    op.execute(
        f"ALTER TABLE `{TABLE}` ADD CONSTRAINT `{KEY}` "
        "UNIQUE (board_id, scope, period, period_id, taken_at), ALGORITHM=INPLACE, LOCK=NONE"
    )


def downgrade() -> None:
    # The release before stores a view's snapshot under each pass's own time: nothing refuses.
    op.execute(f"ALTER TABLE `{TABLE}` DROP INDEX `{KEY}`, ALGORITHM=INPLACE, LOCK=NONE")
