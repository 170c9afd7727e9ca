"""score_events.periods: the periods the write put each event in, which the rebuild replays it
into

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types spelled out instead of taken from shared.db: a migration is a frozen record of one step.


def upgrade() -> None:
    # Nullable, without a default, added last: MariaDB (10.3 and later) and MySQL 8 add such a
    # column in place, without copying the table. Every event stored before this step reads
    # NULL: its periods were not kept, and the rebuild works them out from the board's
    # definition as it is then, as it did before.
    op.add_column("score_events", sa.Column("periods", sa.String(120), nullable=True))


def downgrade() -> None:
    op.drop_column("score_events", "periods")
