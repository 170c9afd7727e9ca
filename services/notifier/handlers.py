"""Turn accepted events into pushes on Redis Pub/Sub: rank messages and badge awards."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis

from services.notifier.rules import Written, crossings, earned
from shared.boards import Board, BoardCatalog
from shared.brackets import Crossing, rank_message
from shared.events import ScoreAccepted, rfc3339
from shared.functions import AWARD_FUNCTION, NOTIFY_FUNCTION, SEEN_FUNCTION
from shared.keys import Keys, seen_keys
from shared.periods import Period
from shared.ranking import parse_record, score_of

PUSHES = Counter("ladder_notifier_pushes_total", "Rank messages published", ["reason"])
for _reason in ("entered_top", "overtaken"):  # each series at 0 from the start
    PUSHES.labels(_reason)
SKIPPED = Counter("ladder_notifier_duplicates_total", "Events already handled, skipped")
AWARDS = Counter("ladder_notifier_badges_awarded_total", "Badges awarded (once per user and board)")

SEEN_TTL_SECONDS = 86_400


def _displaced(
    event: ScoreAccepted, crossing: Crossing, period: Period
) -> tuple[str, str, str, str, Period]:
    """A displaced user's score read for an event: the event (its board, user and id: an id
    belongs to its board and user), the displaced user and the period."""
    return (event.board_id, event.user_id, event.event_id, crossing.user_id, period)


class Notify:
    """Publishes ``rank`` messages and awards badges; skips events it has already handled
    (broker redelivery, the relay publishing an event again, another notifier on the queue).

    An event's rank messages are published, and the event marked handled, in one
    ``ladder_notify_v1`` call a board (shared/lua/badges.lua): the mark decides, atomically, so
    the messages go out exactly once however often the event is delivered, also to two
    notifiers at once, and a failure marks nothing whose messages did not go out. The mark is
    the notifier's bit in the event's record (``ladder_seen_v2`` reads it before a batch, to
    leave out what was handled), so a handled event keeps no key of its own
    (shared/lua/live.lua). The PUBLISHes are made from the board's node: on Redis Cluster they
    reach every node's subscribers from there, so the board's node is the only one involved.
    Badges never repeat: each award is one ``ladder_award_v1`` call whose ``HSETNX`` on the
    user's badges hash decides, in the same atomic step as the publish. The awards go in a
    round trip before the rank messages', so an event is marked only once its awards are made.
    """

    def __init__(self, redis: Redis, keys: Keys, catalog: BoardCatalog) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        seen = await self._seen(events)
        fresh: dict[tuple[str, str, str], ScoreAccepted] = {}
        for event, was_seen in zip(events, seen, strict=True):
            named = (event.board_id, event.user_id, event.event_id)
            # A message delivered twice within one batch counts once, too.
            if not was_seen and named not in fresh:
                fresh[named] = event
        skipped = len(events) - len(fresh)
        found: list[tuple[ScoreAccepted, bool, Period, Crossing]] = []
        awards: list[tuple[str, str, str, str, bytes]] = []
        boards: dict[str, Board | None] = {}  # looked up once a batch
        for event in fresh.values():
            if event.board_id in boards:
                board = boards[event.board_id]
            else:
                board = boards[event.board_id] = await self._catalog.get(event.board_id)
            if board is None:
                continue
            for period, result in event.periods.items():
                for crossing in crossings(event.user_id, result, board.notify_top):
                    found.append((event, board.descending, period, crossing))
            for badge in earned(event.value, board.badges, board.descending):
                awards.append(self._award(event, badge))
        if awards:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, badge, awarded_at, channel, message in awards:
                    pipe.fcall(AWARD_FUNCTION, 1, key, badge, awarded_at, channel, message)
                replies: list[Any] = await pipe.execute()
            AWARDS.inc(sum(int(reply) for reply in replies))
        messages: dict[tuple[str, str, str], list[dict[str, object]]] = defaultdict(list)
        for named, made in await self._messages(found, Written(events)):
            messages[named].append(made)
        skipped += await self._publish(list(fresh.values()), messages)
        SKIPPED.inc(skipped)

    async def _publish(
        self,
        events: list[ScoreAccepted],
        messages: dict[tuple[str, str, str], list[dict[str, object]]],
    ) -> int:
        """Publish the rank messages of ``events`` not handled yet and mark them handled, one
        ``ladder_notify_v1`` call a board; how many were handled already (by another notifier
        since they were read)."""
        by_board: dict[str, list[ScoreAccepted]] = defaultdict(list)
        for event in events:
            by_board[event.board_id].append(event)
        async with self._redis.pipeline(transaction=False) as pipe:
            for board_id, on_board in by_board.items():
                marks = self._seen_keys(on_board)[board_id]
                args: list[Any] = [SEEN_TTL_SECONDS]
                for event in on_board:
                    told = messages.get((event.board_id, event.user_id, event.event_id), [])
                    args.append(len(told))
                    for message in told:
                        channel = self._keys.user_channel(str(message["user_id"]))
                        args += [channel, orjson.dumps(message)]
                pipe.execute_command("FCALL", NOTIFY_FUNCTION, len(marks), *marks, *args)
            replies: list[Any] = await pipe.execute()
        skipped = 0
        for on_board, reply in zip(by_board.values(), replies, strict=True):
            for event, published in zip(on_board, reply, strict=True):
                if not published:
                    skipped += 1
                    continue
                for message in messages.get((event.board_id, event.user_id, event.event_id), []):
                    PUSHES.labels(message["reason"]).inc()
        return skipped

    def _seen_keys(self, events: list[ScoreAccepted]) -> dict[str, list[str]]:
        """The seen keys of ``events`` (three each: shared.keys.seen_keys), by board."""
        by_board: dict[str, list[str]] = defaultdict(list)
        for event in events:
            by_board[event.board_id] += seen_keys(
                self._keys, event.board_id, "notifier", event.event_id, event.user_id
            )
        return by_board

    async def _seen(self, events: list[ScoreAccepted]) -> list[bool]:
        """Whether the notifier marked each of ``events`` handled: one read a board."""
        by_board = self._seen_keys(events)
        async with self._redis.pipeline(transaction=False) as pipe:
            for marks in by_board.values():
                pipe.execute_command("FCALL", SEEN_FUNCTION, len(marks), *marks, "notifier")
            replies: list[Any] = await pipe.execute()
        found: dict[tuple[str, str], bool] = {}
        for board_id, marks in zip(by_board, replies, strict=True):
            keys = by_board[board_id][::3]
            for key, mark in zip(keys, marks, strict=True):
                found[(board_id, key)] = bool(mark)
        return [
            found[(e.board_id, self._keys.idempotency(e.board_id, e.event_id, e.user_id))]
            for e in events
        ]

    def _award(self, event: ScoreAccepted, badge: str) -> tuple[str, str, str, str, bytes]:
        """The arguments of one ``ladder_award_v1`` call."""
        message = {
            "type": "badge",
            "board_id": event.board_id,
            "user_id": event.user_id,
            "badge": badge,
        }
        return (
            self._keys.badges(event.board_id, event.user_id),
            badge,
            rfc3339(event.accepted_at),
            self._keys.user_channel(event.user_id),
            orjson.dumps(message),
        )

    async def _messages(
        self, found: list[tuple[ScoreAccepted, bool, Period, Crossing]], written: Written
    ) -> list[tuple[tuple[str, str, str], dict[str, object]]]:
        """The rank messages of ``found``, each with its event's board, user and id. A displaced
        user's score is the one it held when the event was written: as the batch's own writes
        tell it, or else read from its region's view, all of the batch's in one pipelined round
        trip."""
        scores: dict[tuple[str, str, str, str, Period], int | None] = {}
        others = []
        for event, descending, period, crossing in found:
            if crossing.user_id == event.user_id:
                continue
            held = written.held(event, period, crossing.user_id)
            if held is None:
                others.append((event, descending, period, crossing))
            else:
                scores[_displaced(event, crossing, period)] = held
        if others:
            async with self._redis.pipeline(transaction=False) as pipe:
                for event, _, period, crossing in others:
                    period_id = event.periods[period].period_id
                    key = self._keys.region_view(event.board_id, period, period_id, event.region)
                    # The user's record there (None if it has none).
                    pipe.hget(Keys.ties(key), crossing.user_id)
                found_entries: list[Any] = await pipe.execute()
            for (event, descending, period, crossing), raw in zip(
                others, found_entries, strict=True
            ):
                scores[_displaced(event, crossing, period)] = (
                    score_of(parse_record(raw)[1], descending) if raw is not None else None
                )
        out: list[tuple[tuple[str, str, str], dict[str, object]]] = []
        for event, _, period, crossing in found:
            result = event.periods[period]
            score = (
                result.score
                if crossing.user_id == event.user_id
                else scores[_displaced(event, crossing, period)]
            )
            out.append(
                (
                    (event.board_id, event.user_id, event.event_id),
                    rank_message(
                        crossing,
                        board_id=event.board_id,
                        scope=f"region:{event.region}",
                        period=period,
                        period_id=result.period_id,
                        score=score,
                    ),
                )
            )
        return out
