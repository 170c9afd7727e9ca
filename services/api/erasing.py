"""The users whose erasure is pending, whose score writes wait (docs/api.md section 8b).

The erasure's Redis pass removes everything under the user id, whenever it was written; so no
event of the user may be accepted from the request until that pass is done, or the pass would
take a fresh user's first events with it while the history database keeps them. A write of such
a user answers 503 with Retry-After and writes nothing.

Every API process reads the pending erasures (``Keys.erasing``, hashes of user ids) at most
``READ_SECONDS`` apart, when a write comes: a process learns of a request that much after it at
the latest, well before its cut-off (``USER_SETTLE_SECONDS``, 2 s), so that the events it accepted
meanwhile are accepted by the cut-off, and erased with the rest. The hash is written at the
request (after MySQL) and kept to the pending erasures by the worker, which removes a user's
entry once its erasure is done (services/api/eraser.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from redis.asyncio import Redis

from services.api.errors import Unavailable
from shared.erasure import USER_SETTLE_SECONDS, user_hash
from shared.keys import Keys

READ_SECONDS = 0.5
"""How long a process keeps what it read of the pending erasures."""
assert READ_SECONDS < USER_SETTLE_SECONDS / 2, (
    "a process must learn of a request before its cut-off"
)


class ErasingUsers:
    """One API process's view of the pending erasures, read again when older than
    ``READ_SECONDS`` (one ``HKEYS`` at a time, however many writes wait for it)."""

    def __init__(self, redis: Redis, keys: Keys, secret: str) -> None:
        self._redis = redis
        self._keys = keys
        self._secret = secret
        self._hashes: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._reading = asyncio.Lock()

    async def _pending(self) -> frozenset[str]:
        if time.monotonic() - self._read_at > READ_SECONDS:
            async with self._reading:
                if time.monotonic() - self._read_at > READ_SECONDS:
                    started = time.monotonic()
                    found = await self._redis.hkeys(self._keys.erasing)
                    self._hashes = frozenset(
                        h.decode() if isinstance(h, bytes) else h for h in found
                    )
                    self._read_at = started
        return self._hashes

    async def erasing(self, user_ids: Iterable[str]) -> set[str]:
        """Those of ``user_ids`` whose erasure is pending. What was read may be up to
        ``READ_SECONDS`` old: a user found in it is looked up again (one ``HMGET``, on the rare
        path of a refusal), so that a write after its erasure is done is not refused."""
        pending = await self._pending()
        if not pending:
            return set()
        hashes = {u: user_hash(u, self._secret) for u in user_ids}
        found = [u for u, h in hashes.items() if h in pending]
        if not found:
            return set()
        still = await self._redis.hmget(self._keys.erasing, [hashes[u] for u in found])
        return {u for u, cutoff in zip(found, still, strict=True) if cutoff is not None}

    async def check(self, user_id: str) -> None:
        """Raise the 503 of a write of ``user_id`` while its erasure is pending."""
        if await self.erasing([user_id]):
            raise refusal(user_id)


def refusal(user_id: str) -> Unavailable:
    return Unavailable(
        f"User {user_id!r} is being erased; its scores are taken again once the erasure is done.",
        retry_after=2,
    )
