"""Whether the board a topic names exists, asked of the catalog by many sockets at once.

A burst of subscribes (every client of a restarted process coming back, or a flood of topics of
made-up boards) must not become a burst of Redis calls: concurrent lookups of one board share a
single call, and at most ``MOST_AT_ONCE`` distinct lookups are in flight, so that sockets can
never take every connection of the process's Redis pool from the reads and writes.
"""

from __future__ import annotations

import asyncio

from shared.boards import Board, BoardCatalog

MOST_AT_ONCE = 16


class BoardLookups:
    def __init__(self, most_at_once: int = MOST_AT_ONCE) -> None:
        self._slots = asyncio.Semaphore(most_at_once)
        self._in_flight: dict[str, asyncio.Future[Board | None]] = {}

    async def get(self, catalog: BoardCatalog, board_id: str) -> Board | None:
        """``catalog.get(board_id)``, shared with every caller asking for it meanwhile."""
        future = self._in_flight.get(board_id)
        if future is None:
            future = asyncio.ensure_future(self._look_up(catalog, board_id))
            self._in_flight[board_id] = future
            future.add_done_callback(lambda _: self._in_flight.pop(board_id, None))
        # One caller going away (its socket closed) does not cancel the others' answer.
        return await asyncio.shield(future)

    async def _look_up(self, catalog: BoardCatalog, board_id: str) -> Board | None:
        async with self._slots:
            return await catalog.get(board_id)
