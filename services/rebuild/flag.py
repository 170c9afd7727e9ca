"""A board's ``rebuilding`` flag and journal, held by one rebuild through its token.

The token says whose flag it is: a second rebuild of the board at once is refused, and one whose
flag lapsed cannot finish over the next one's. The flag's TTL is a safety net (a rebuild that
dies leaves nothing behind for long); a working rebuild keeps it up with :meth:`BoardFlag.extend`.
"""

from __future__ import annotations

import uuid
from typing import Any

from redis.asyncio import Redis

from services.rebuild.keyspace import drop_staging
from shared.functions import (
    REBUILD_ABORT_FUNCTION,
    REBUILD_BEGIN_FUNCTION,
    REBUILD_EXTEND_FUNCTION,
)
from shared.keys import OUTBOX_GROUP, Keys
from shared.redis import ensure_group

FLAG_TTL_MS = 60_000


class FlagLost(Exception):
    """The rebuilding flag expired under a rebuild: journaling stopped, so it starts over."""


class BoardFlag:
    """One rebuild's hold on one board's flag and journal."""

    def __init__(self, redis: Redis, keys: Keys, board_id: str) -> None:
        self._redis = redis
        self._keys = keys
        self.board_id = board_id
        self.token = uuid.uuid4().hex
        self.flag = keys.rebuilding(board_id)
        self.journal = keys.rebuild_journal(board_id)

    async def begin(self) -> list[str] | None:
        """Raise the flag and start an empty journal. Returns the events in the outbox and the
        newest the write accepted, as ``shared.keys.event_ref`` names them (those MySQL must
        hold, and the aggregator have derived, before it is read), or ``None`` if another
        rebuild holds the flag."""
        bid = self.board_id
        begun: list[Any] = await self._redis.fcall(
            REBUILD_BEGIN_FUNCTION,
            4,
            self.flag,
            self.journal,
            self._keys.outbox(bid),
            self._keys.newest_event(bid),
            FLAG_TTL_MS,
            self.token,
        )
        if begun[0] != "ok":
            return None
        return list(begun[1:])

    async def extend(self) -> None:
        """Keep the flag up; raises :class:`FlagLost` if it lapsed."""
        kept = await self._redis.fcall(
            REBUILD_EXTEND_FUNCTION, 2, self.flag, self.journal, FLAG_TTL_MS, self.token
        )
        if not kept:
            raise FlagLost

    async def abort(self) -> None:
        """Staging, flag and journal dropped, while the flag is still this rebuild's."""
        if await self._redis.get(self.flag) == self.token:
            await drop_staging(self._redis, self._keys, self.board_id)
        await self._redis.fcall(REBUILD_ABORT_FUNCTION, 2, self.flag, self.journal, self.token)

    async def journaled(self) -> list[Any]:
        """The journal's entries (after its first, which marks its start)."""
        entries: list[Any] = await self._redis.lrange(self.journal, 1, -1)
        return entries


async def ensure_outbox_group(redis: Redis, keys: Keys, board_id: str) -> None:
    """The relay's consumer group on the outbox, made again if Redis lost it: the relays then
    publish what was accepted since (the rebuild waits for it), without a restart."""
    await ensure_group(redis, keys.outbox(board_id), OUTBOX_GROUP)
