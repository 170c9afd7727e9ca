"""A board's leases: one process at a time does a kind of a board's work (shared/lua/lease.lua).

Several processes of a service may run (more consumers of a queue, or a restart that overlaps the
process it replaces). A lease is a string "<fence>|<owner>" under the board's hash tag that
expires after ``ttl`` seconds unless renewed, so that the boards of a process that died are
taken over by another within that. Each new holder gets a token, a higher fence and its owner
name. The kinds:

- the merge lease (the default): the aggregator that holds it merges the board, from taking the
  dirty set to draining it, and its dense builds; the merge's writes check the token in Redis, so
  a holder that lost the lease writes nothing more;
- ``live``: the aggregator that computes and pushes the board's live views (hot streaks, MVPs).
  Those writes are not fenced: a holder paused past its lease may store one pass's views after
  its successor's, which the successor's next pass replaces;
- ``snap``: the history process that takes the board's snapshots; the pass's first and last
  steps check the token, and its MySQL writes are idempotent for a pass that lost the lease
  between its checks (services/history/snapshotter.py);
- ``trim``: the aggregator that trims the board's users' hashes (services/aggregator/trim.py),
  held from one sweep to the next. Its deletes are not fenced: each decides in one call, so two
  holders at once (one paused past its lease) only repeat each other's work.

A process that stops cleanly gives up every lease it holds (:func:`give_up`, at the end of its
tickers), each only while it is still held with this process's token, so that the boards are
taken over at once (by another process, or this one restarted under a new owner name) rather
than after the lease runs out.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable

import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared.functions import LEASE_HOLD_FUNCTION, LEASE_RELEASE_FUNCTION
from shared.keys import Keys

log = structlog.get_logger(__name__)


class LeaseLost(Exception):
    """The board's lease is held by another process now: stop the board's work."""


def lost(error: ResponseError) -> bool:
    """Whether a merge call was refused because the caller no longer holds the lease."""
    return str(error).startswith("FENCED")


class Lease:
    """The leases of one process (``owner``), board by board: merge leases, or with ``kind``
    those of another kind of the board's work (``Keys.lease``: ``live``, ``snap``, ``trim``)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        ttl: float,
        owner: str | None = None,
        kind: str | None = None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self.ttl = ttl
        self._ttl_ms = max(1, round(ttl * 1000))
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._tokens: dict[str, str] = {}
        self._kind = kind

    @property
    def kind(self) -> str:
        """``merge``, ``live``, ``snap`` or ``trim``."""
        return self._kind or "merge"

    def _key(self, board_id: str, *, fence: bool = False) -> str:
        if self._kind is not None:
            return self._keys.lease(board_id, self._kind, fence=fence)
        return self._keys.merge_fence(board_id) if fence else self._keys.merge_lease(board_id)

    def token(self, board_id: str) -> str:
        """The token this process holds ``board_id``'s lease with (after :meth:`hold`)."""
        return self._tokens[board_id]

    async def hold(self, board_id: str) -> bool:
        """Take or renew the lease of ``board_id``; ``False`` while another process holds it.
        A holder whose lease expired unnoticed and was taken by no one gets a new token."""
        token = await self._redis.fcall(
            LEASE_HOLD_FUNCTION,
            2,
            self._key(board_id),
            self._key(board_id, fence=True),
            self.owner,
            self._ttl_ms,
        )
        if not token:
            self._tokens.pop(board_id, None)
            return False
        self._tokens[board_id] = str(token)
        return True

    async def renew(self, board_id: str) -> None:
        """Renew a lease held since :meth:`hold`; raises :class:`LeaseLost` if another took it
        meanwhile (a new token of our own is not the one the work began with, either)."""
        held = self._tokens.get(board_id)
        if not await self.hold(board_id) or self._tokens[board_id] != held:
            raise LeaseLost(board_id)

    async def release(self, board_id: str) -> bool:
        """Give the lease of ``board_id`` up, if this process still holds it (compare and
        delete, in one step: a lease that lapsed and was taken by another stays the other's);
        whether it was given up."""
        token = self._tokens.pop(board_id, None)
        if token is None:
            return False
        return bool(await self._redis.fcall(LEASE_RELEASE_FUNCTION, 1, self._key(board_id), token))

    def forget(self, board_id: str) -> None:
        """The lease of ``board_id`` was given up by another call (``ladder_snapshot_done_v2``
        deletes it in its own step): no token to give up any more."""
        self._tokens.pop(board_id, None)

    def keep_only(self, board_ids: Iterable[str]) -> None:
        """Forget the tokens of every board but ``board_ids`` (those defined now): a deleted
        board's lease went with its keys, and its token would stay for the life of the process."""
        kept = set(board_ids)
        self._tokens = {bid: token for bid, token in self._tokens.items() if bid in kept}

    async def release_all(self) -> int:
        """Give up every lease this process holds, each as :meth:`release`; how many were."""
        released = 0
        for board_id in sorted(self._tokens):
            released += await self.release(board_id)
        return released


async def give_up(*leases: Lease) -> None:
    """On the way out of a clean stop, after the process's last pass: every lease of ``leases``
    given up (:meth:`Lease.release_all`). One that cannot be (Redis out of reach) lapses as a
    dead process's does: logged, and the others are given up all the same."""
    for lease in leases:
        try:
            released = await lease.release_all()
        except Exception as error:
            log.warning("leases not given up; they lapse", kind=lease.kind, error=str(error))
            continue
        if released:
            log.info("leases given up", kind=lease.kind, boards=released)
