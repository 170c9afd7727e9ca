"""hidden_users: users hidden on a board (a shadow ban)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 00:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types spelled out instead of taken from shared.db: a migration is a frozen record of one step.
ID_COLLATION = "utf8mb4_bin"


def upgrade() -> None:
    # A new table, empty: nobody was hidden before. A board's hidden users are one primary-key
    # range (the rebuild reads them so).
    op.create_table(
        "hidden_users",
        sa.Column("board_id", sa.String(32, collation=ID_COLLATION), nullable=False),
        sa.Column("user_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("hidden_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.PrimaryKeyConstraint("board_id", "user_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    # Who was hidden is lost: the release before shows everyone.
    op.drop_table("hidden_users")
