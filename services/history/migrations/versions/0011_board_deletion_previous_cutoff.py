"""board_deletions.previous_cutoff: the cut-off of the deletion before, which a purge stops at

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types spelled out instead of taken from shared.db: a migration is a frozen record of one step.


def upgrade() -> None:
    # Nullable, without a default, added last: added in place. A board deleted before this step
    # reads NULL, as a board deleted once does: its purge, if one is still pending, takes its
    # snapshots up to its cut-off as before.
    op.add_column(
        "board_deletions", sa.Column("previous_cutoff", mysql.DATETIME(fsp=6), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("board_deletions", "previous_cutoff")
