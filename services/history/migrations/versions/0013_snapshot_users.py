"""snapshot_users: who each snapshot holds, a row a user, so that an erasure finds a user's
snapshots by key instead of reading every snapshot ever stored

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Names spelled out instead of taken from shared.db: a migration is a frozen record of one step.
TABLE = "snapshot_users"
SNAPSHOTS = "snapshots"
COLLATION = "utf8mb4_bin"
# Snapshots read a statement while the rows of those stored before are made.
PAGE = 500


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("user_id", sa.String(64, collation=COLLATION), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "snapshot_id"),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            [f"{SNAPSHOTS}.id"],
            name=f"fk_{TABLE}_snapshot_id",
            ondelete="CASCADE",
        ),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(f"ix_{TABLE}_snapshot_id", TABLE, ["snapshot_id"])
    _fill(op.get_bind())


def _fill(conn: sa.Connection) -> None:
    """The users of every snapshot stored before this step, read a page of snapshots at a time
    (a time that grows with the table; the services are stopped for a migration)."""
    after = 0
    while True:
        rows = conn.execute(
            sa.text(
                f"SELECT id, entries FROM `{SNAPSHOTS}` WHERE id > :after ORDER BY id LIMIT {PAGE}"
            ),
            {"after": after},
        ).all()
        users = [
            {"user_id": entry["user_id"], "snapshot_id": row.id}
            for row in rows
            for entry in json.loads(row.entries)
            if isinstance(entry, dict) and isinstance(entry.get("user_id"), str)
        ]
        if users:
            conn.execute(
                sa.text(
                    f"INSERT IGNORE INTO `{TABLE}` (user_id, snapshot_id) "
                    "VALUES (:user_id, :snapshot_id)"
                ),
                users,
            )
        if len(rows) < PAGE:
            return
        after = rows[-1].id


def downgrade() -> None:
    # The release before finds a user's snapshots by reading them all: nothing of this is used.
    op.drop_table(TABLE)
