"""score_events: the event log, one row per accepted (board_id, event_id)

Revision ID: 0001
Revises:
Create Date: 2026-11-29 18:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out instead of imported from shared.db: a migration is a frozen record of one step,
# and must not change when the current model does.
ID_COLLATION = "utf8mb4_bin"


def upgrade() -> None:
    op.create_table(
        "score_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("board_id", sa.String(32, collation=ID_COLLATION), nullable=False),
        sa.Column("user_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("region", sa.String(32, collation=ID_COLLATION), nullable=False),
        sa.Column("team_id", sa.String(32, collation=ID_COLLATION), nullable=True),
        sa.Column("display_name", sa.String(64), nullable=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("occurred_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.Column("accepted_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("board_id", "event_id", name="uq_score_events_board_id_event_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_score_events_board_id_user_id_accepted_at_id",
        "score_events",
        ["board_id", "user_id", "accepted_at", "id"],
    )


def downgrade() -> None:
    op.drop_table("score_events")
