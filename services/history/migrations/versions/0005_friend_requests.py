"""friend_requests: a player's friend request, pending until the other side asks too

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 23:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types spelled out instead of taken from shared.db: a migration is a frozen record of one step.
ID_COLLATION = "utf8mb4_bin"


def upgrade() -> None:
    # A new table, empty: friendships stored before this step stay as they are (mutual). Ids
    # compare in binary, as in every other table ("Ab" and "ab" are two users).
    op.create_table(
        "friend_requests",
        # Who asked, and whom: a user's own requests are one primary-key range.
        sa.Column("user_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("friend_id", sa.String(64, collation=ID_COLLATION), nullable=False),
        sa.Column("created_at", mysql.DATETIME(fsp=6), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "friend_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    # The requests pending to one user, oldest first: the list it reads, and the order in
    # which the oldest are dropped past the cap, are one range of this index.
    op.create_index(
        "ix_friend_requests_friend_id_created_at",
        "friend_requests",
        ["friend_id", "created_at"],
    )


def downgrade() -> None:
    # Pending requests are lost: the release before has no place for them. Friendships stay.
    op.drop_index("ix_friend_requests_friend_id_created_at", table_name="friend_requests")
    op.drop_table("friend_requests")
