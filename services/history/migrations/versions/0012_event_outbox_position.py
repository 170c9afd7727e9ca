"""score_events.outbox_ms and outbox_seq: each event's position in its board's outbox stream,
the order the rebuild replays a board's events in

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-09 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Names spelled out instead of taken from shared.db: a migration is a frozen record of one step.
TABLE = "score_events"
INDEX = "ix_score_events_board_id_outbox_ms_outbox_seq_id"


def upgrade() -> None:
    # Nullable, without a default, added last: added in place. Every event stored before this
    # step reads NULL: its position was not kept, and the rebuild replays such events first, in
    # the order they were stored, as it did before. The index is built in place too (MariaDB
    # and MySQL 8 go on taking writes meanwhile), in a time that grows with the table.
    op.add_column(TABLE, sa.Column("outbox_ms", sa.BigInteger(), nullable=True))
    op.add_column(TABLE, sa.Column("outbox_seq", sa.BigInteger(), nullable=True))
    op.create_index(INDEX, TABLE, ["board_id", "outbox_ms", "outbox_seq", "id"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name=TABLE)
    op.drop_column(TABLE, "outbox_seq")
    op.drop_column(TABLE, "outbox_ms")
