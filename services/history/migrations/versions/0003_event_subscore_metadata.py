"""score_events.subscore and score_events.metadata: the wide scores' fields, kept with each event

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Types spelled out instead of taken from shared.db: a migration is a frozen record of one step.


def upgrade() -> None:
    # Both nullable, without a default, added last: MariaDB (10.3 and later) and MySQL 8 add such
    # a column in place, without copying the table, however many events it holds. Every event
    # stored before this step reads NULL in both, which is what it had: no subscore, no metadata.
    op.add_column("score_events", sa.Column("subscore", sa.BigInteger(), nullable=True))
    # The metadata object as compact JSON text, kept byte for byte for the rebuild. TEXT rather
    # than MariaDB's JSON, a LONGTEXT alias that autogenerate would report as a change on every
    # run (see 0002's boards.definition).
    op.add_column("score_events", sa.Column("metadata", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("score_events", "metadata")
    op.drop_column("score_events", "subscore")
