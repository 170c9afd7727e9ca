"""The pushes that follow a merge pass (services/aggregator/merge.py): the ``rank`` messages of the
global scope's brackets (:mod:`services.aggregator.global_brackets`) and the top-10 pushes of the
views the pass touched, the global view's and the regions' (:mod:`services.aggregator.tops`).

What does not go out is kept, and sent again before the board's next pass (:meth:`PassPushes.again`,
from main.py's merge ticker), whether or not a merge touches that view again:

- a view whose top-10 push failed (the board's node out of reach), or that other aggregators'
  pushes kept reaching first, is looked at again: its push compares with the fingerprint of the
  last one that went out, so its top is pushed once, as it is then;
- a rank message whose PUBLISH was refused (on Redis Cluster a user's channel lies in a slot of
  its own, whose primary may be failing over while the board's answers) is published again as
  it was, for up to ``RANK_RETRY_SECONDS`` after its merge, then dropped and counted: by then
  the crossing it names is long past (the user's standing has moved on, or its next crossing
  said so).

What is kept lives in the process: an aggregator that stops or dies with some kept loses them, as
it loses the pushes of a pass it had not finished.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from services.aggregator.fresh import FreshRegions
from services.aggregator.global_brackets import GlobalBrackets, RankMessage, Standing, publish_each
from shared.boards import Board
from shared.keys import Keys
from shared.periods import Period

log = structlog.get_logger(__name__)

DROPPED = Counter(
    "ladder_aggregator_rank_pushes_dropped_total",
    "Global-scope rank messages given up after RANK_RETRY_SECONDS of refused publishes",
)

RANK_RETRY_SECONDS = 60.0


@dataclass(slots=True)
class Touched:
    """What one merge pass did to one period of a board: the global top before it (read before
    the pass's first write to the period), and the regions whose marks it merged."""

    before: Standing | None = None
    read: bool = False
    regions: set[str] = field(default_factory=set)


class PassPushes:
    """The pushes of a merger's passes, and those of them kept for later (see the module)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self.brackets = GlobalBrackets(redis, keys)
        self._views = FreshRegions()
        """Views whose top 10 is to be looked at again, by board."""
        self._messages: dict[str, list[tuple[float, RankMessage]]] = defaultdict(list)
        """Rank messages not yet published, by board, each with the time of its merge."""

    def keep_only(self, board_ids: set[str]) -> None:
        """Forget what is kept of every board but ``board_ids`` (those defined now)."""
        self._messages = defaultdict(
            list, {bid: kept for bid, kept in self._messages.items() if bid in board_ids}
        )
        self._views.keep_only(board_ids)

    async def after(self, board: Board, periods: dict[tuple[Period, str], Touched]) -> None:
        """After a pass of ``board``: for each period it changed, the rank messages of the
        crossings, then the top-10 pushes of the views it wrote (the global one and its
        regions'). What does not go out is kept for :meth:`again`; a failure is logged, not
        raised (the pass's merge is done)."""
        bid, at = board.board_id, time.monotonic()
        for (period, period_id), touched in periods.items():
            for scope in ["global", *(f"region:{r}" for r in touched.regions)]:
                self._views.add_view(bid, period, period_id, scope)
            try:
                messages = await self.brackets.crossings(board, period, period_id, touched.before)
            except Exception:
                # The top after the merge is unread: its crossings cannot be judged (later, the
                # view holds other passes' merges too).
                log.exception("global brackets not judged", board_id=bid, period=period)
                continue
            self._messages[bid] += [(at, message) for message in messages]
        await self.again(board)

    async def again(self, board: Board) -> None:
        """Push what was kept of ``board``: its rank messages, oldest first, then its views'
        tops; what does not go out is kept again. Never raises: logged, tried again next pass."""
        bid = board.board_id
        kept = self._messages.pop(bid, [])
        if kept:
            horizon = time.monotonic() - RANK_RETRY_SECONDS
            current = [(at, message) for at, message in kept if at >= horizon]
            if len(current) < len(kept):
                DROPPED.inc(len(kept) - len(current))
                log.warning("rank messages given up", board_id=bid, count=len(kept) - len(current))
            unsent = {id(m) for m in await publish_each(self._redis, [m for _, m in current])}
            if unsent:
                self._messages[bid] = [(at, m) for at, m in current if id(m) in unsent]
                log.warning("rank messages not published; again next pass", board_id=bid)
        if bid in self._views:
            try:
                await self._views.push(self._redis, self._keys, board)
            except Exception as error:
                log.warning("top-10 pushes failed; again next pass", board_id=bid, error=str(error))
