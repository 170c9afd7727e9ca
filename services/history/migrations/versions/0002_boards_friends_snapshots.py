"""boards, friendships, snapshots: board definitions, mutual friendships, top-N snapshots

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out instead of imported from shared.db: a migration is a frozen record of one step.
ID_COLLATION = "utf8mb4_bin"


def upgrade() -> None:
    op.create_table(
        "boards",
        sa.Column("board_id", sa.String(32, collation=ID_COLLATION), nullable=False),
        # The definition as JSON text. MEDIUMTEXT rather than MariaDB's JSON, which is a
        # LONGTEXT alias that autogenerate would report as a change on every run.
        sa.Column("definition", mysql.MEDIUMTEXT(), nullable=False),
        sa.Column("created_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.Column("updated_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.PrimaryKeyConstraint("board_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_table(
        "friendships",
        sa.Column("user_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("friend_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("created_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "friend_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("board_id", sa.String(32, collation=ID_COLLATION), nullable=False),
        sa.Column("scope", sa.String(80, collation=ID_COLLATION), nullable=False),
        sa.Column("period", sa.String(8, collation=ID_COLLATION), nullable=False),
        sa.Column("period_id", sa.String(16, collation=ID_COLLATION), nullable=False),
        sa.Column("taken_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.Column("entries", mysql.MEDIUMTEXT(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_snapshots_board_id_scope_period_taken_at",
        "snapshots",
        ["board_id", "scope", "period", "taken_at"],
    )


def downgrade() -> None:
    op.drop_table("snapshots")
    op.drop_table("friendships")
    op.drop_table("boards")
