"""erasures and board_deletions: erased users' tombstones and deleted boards' cut-offs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 00:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types spelled out instead of taken from shared.db: a migration is a frozen record of one step.
ID_COLLATION = "utf8mb4_bin"


def upgrade() -> None:
    # New tables, empty: nothing stored before this step is touched.
    op.create_table(
        "erasures",
        # HMAC-SHA-256 of the user id (hex): the tombstone names no user.
        sa.Column("user_hash", sa.String(64, collation=ID_COLLATION), nullable=False),
        # The user id in clear only while the erasure is pending; NULL once it is done.
        sa.Column("user_id", sa.String(64, collation=ID_COLLATION), nullable=True),
        # Events accepted up to here are the erased user's.
        sa.Column("cutoff", mysql.DATETIME(fsp=6), nullable=False),
        sa.Column("done_at", mysql.DATETIME(fsp=6), nullable=True),
        sa.PrimaryKeyConstraint("user_hash"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    # The worker's poll for pending jobs (done_at NULL) is one range of this index however many
    # tombstones are kept.
    op.create_index("ix_erasures_done_at", "erasures", ["done_at"])
    op.create_table(
        "board_deletions",
        sa.Column("board_id", sa.String(32, collation=ID_COLLATION), nullable=False),
        # Events accepted up to here, and snapshots taken, are the deleted board's.
        sa.Column("cutoff", mysql.DATETIME(fsp=6), nullable=False),
        sa.Column("purge", sa.Boolean(), nullable=False),
        sa.Column("done_at", mysql.DATETIME(fsp=6), nullable=True),
        sa.PrimaryKeyConstraint("board_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_board_deletions_done_at", "board_deletions", ["done_at"])


def downgrade() -> None:
    # The tombstones and cut-offs are lost: the release before has no place for them (erased
    # rows stay erased; a deleted board's kept history shows again under its name).
    op.drop_table("board_deletions")
    op.drop_table("erasures")
