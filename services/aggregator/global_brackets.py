"""Bracket notifications of the global scope (docs/api.md section 9), judged on the merged board.

The region scope is judged by the notifier on each update, from what the atomic write saw. The
global view is written by the merge, many users at a time, so its brackets are judged on the
merge instead: the top ``max(notify_top)`` of a view is read before and after each period's
merge, and

- a user who is now in a top T it was not in before gets ``entered_top``, naming the smallest
  such T: one the merge wrote (its own global entry rose), or one the merge did not write but
  moved up, whoever was above it having fallen below it (a lower score on a `set` board, a
  negative increment);
- a user who held a top T before and does not now, while its own score did not get worse, was
  pushed out by someone else and gets ``overtaken``, naming the smallest T it left.

``previous_rank`` of an ``entered_top`` is ``null`` when the user was below the largest bracket
before the merge (its exact rank there is not read: the top before holds the largest bracket's
users only, and a user absent from it was outside every bracket). The messages go to each
user's Pub/Sub channel, with ``"scope": "global"``, in the shape the notifier uses for regions.
A message whose PUBLISH fails is published again before the board's next pass
(services/aggregator/pass_pushes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.boards import Board
from shared.brackets import Crossing, rank_message, smallest_entered
from shared.functions import STANDING_FUNCTION
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import id_of, score_of

# Where a user stands: its rank, and its entry's place in rank order (score, then member: the
# greater, the better).
Place = tuple[int, tuple[float, str]]

PUSHES = Counter(
    "ladder_aggregator_rank_pushes_total", "Global-scope rank messages published", ["reason"]
)
for _reason in ("entered_top", "overtaken"):  # each series at 0 from the start
    PUSHES.labels(_reason)


@dataclass(frozen=True, slots=True)
class RankMessage:
    """A ``rank`` message of the global scope, to publish on a user's channel."""

    channel: str
    body: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Standing:
    """The top of one global view at one moment: user → (rank, (score, member))."""

    entries: dict[str, Place]

    @classmethod
    def of(cls, rows: list[tuple[str, float]]) -> Standing:
        return cls({id_of(m): (i + 1, (score, m)) for i, (m, score) in enumerate(rows)})


def judge(
    before: Standing,
    after: Standing,
    fallen: dict[str, Place],
    brackets: tuple[int, ...],
) -> list[Crossing]:
    """The crossings one merge caused; ``fallen`` holds the current place of the users who were
    in ``before`` and are no longer in ``after``."""
    out: list[Crossing] = []
    for user, (rank, _) in after.entries.items():
        previous = before.entries.get(user)
        previous_rank = previous[0] if previous else None
        top = smallest_entered(rank, previous_rank, brackets)
        if top is not None:
            out.append(Crossing(user, "entered_top", top, rank, previous_rank))
    for user, (previous_rank, previous_entry) in before.entries.items():
        now = after.entries.get(user) or fallen.get(user)
        if now is None:
            continue  # gone from the view altogether (erased or out of range): nobody overtook
        rank, entry = now
        if entry < previous_entry:
            continue  # its own score got worse (a `set` board): not overtaken
        left = [t for t in brackets if previous_rank <= t < rank]
        if left:
            out.append(Crossing(user, "overtaken", min(left), rank, previous_rank))
    return out


class GlobalBrackets:
    """Reads a view's top around a merge and makes the crossings' messages."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def standing(self, board: Board, period: Period, period_id: str) -> Standing | None:
        """The view's top ``max(notify_top)`` now; ``None`` when the board notifies nothing."""
        if not board.notify_top:
            return None
        key = self._keys.global_view(board.board_id, period, period_id)
        rows: list[Any] = await self._redis.zrevrange(key, 0, max(board.notify_top) - 1, True)
        return Standing.of([(str(m), float(score)) for m, score in rows])

    async def crossings(
        self,
        board: Board,
        period: Period,
        period_id: str,
        before: Standing | None,
    ) -> list[RankMessage]:
        """The rank messages of what the merge since ``before`` changed (published by the
        caller: services/aggregator/pass_pushes.py)."""
        if before is None:
            return []
        after = await self.standing(board, period, period_id)
        assert after is not None
        key = self._keys.global_view(board.board_id, period, period_id)
        gone = [user for user in before.entries if user not in after.entries]
        fallen: dict[str, Place] = {}
        if gone:
            view_keys = (key, Keys.ties(key), self._keys.names(board.board_id))
            async with self._redis.pipeline(transaction=False) as pipe:
                for user in gone:
                    # Its position, score and entry (no neighbours); {} if it has none.
                    pipe.fcall_ro(STANDING_FUNCTION, 3, *view_keys, user, 0)
                replies = await pipe.execute()
            for user, reply in zip(gone, replies, strict=True):
                if reply:
                    fallen[user] = (int(reply[0]) + 1, (float(reply[1]), str(reply[3][0])))
        current = {**fallen, **after.entries}
        messages: list[RankMessage] = []
        for crossing in judge(before, after, fallen, board.notify_top):
            score = score_of(current[crossing.user_id][1][0], board.descending)
            message = rank_message(
                crossing,
                board_id=board.board_id,
                scope="global",
                period=period,
                period_id=period_id,
                score=score,
            )
            channel = self._keys.user_channel(crossing.user_id)
            messages.append(RankMessage(channel, orjson.dumps(message), crossing.reason))
        return messages


async def publish_each(redis: Redis, messages: list[RankMessage]) -> list[RankMessage]:
    """Publish ``messages`` in one round trip; returns those refused (on Redis Cluster a user's
    channel lies in a slot of its own, whose primary may be failing over while others answer),
    or all of them if the round trip itself failed."""
    if not messages:
        return []
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for message in messages:
                pipe.publish(message.channel, message.body)
            replies = await pipe.execute(raise_on_error=False)
    except Exception:
        return messages
    unsent: list[RankMessage] = []
    for message, reply in zip(messages, replies, strict=True):
        if isinstance(reply, Exception):
            unsent.append(message)
        else:
            PUSHES.labels(message.reason).inc()
    return unsent
