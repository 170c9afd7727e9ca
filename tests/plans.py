"""The plans MySQL chooses for the statements a piece of code runs: each statement an engine runs
on a table is recorded as it goes, and EXPLAINed afterwards with its own parameters. A test of a
statement's cost asserts its plan, not its time: on a test's few hundred rows a full scan is as
quick as a range, and only the plan tells what it costs on a table of millions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

Statement = tuple[str, Any]


@contextlib.contextmanager
def recorded(engine: AsyncEngine, table: str) -> Iterator[list[Statement]]:
    """The SELECT, UPDATE and DELETE statements ``engine`` runs in the block that name
    ``table``, each with its parameters, in the order run."""
    seen: list[Statement] = []

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        verb = statement.split(None, 1)[0].upper()
        if verb in ("SELECT", "UPDATE", "DELETE") and f" {table}" in statement:
            seen.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def analyze(engine: AsyncEngine, *tables: str) -> None:
    """Fresh statistics for ``tables``: InnoDB recomputes them in the background after a load,
    and a plan read before that would be chosen on the empty table's."""
    async with engine.connect() as conn:
        await conn.execute(text(f"ANALYZE TABLE {', '.join(tables)}"))


async def plans(engine: AsyncEngine, table: str, statements: list[Statement]) -> list[Any]:
    """Each statement's plan for ``table`` (its row of EXPLAIN: ``type``, ``key``, ``rows``,
    ``Extra``), in order."""
    found: list[Any] = []
    async with engine.connect() as conn:
        for statement, parameters in statements:
            rows = (await conn.exec_driver_sql("EXPLAIN " + statement, parameters)).mappings()
            found.extend(row for row in rows if row["table"] == table)
    return found
