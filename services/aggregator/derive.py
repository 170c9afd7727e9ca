"""The views derived from accepted events, kept by the aggregator rather than the atomic write
(docs/architecture.md, "The aggregator"): the team boards (incr boards), the feed, each period's
players, event count and regions, and each user's regions and latest team; and the regional
boards' distinct-score sets where dense reads asked for them (docs/architecture.md, "Dense ranks
on demand"): each pair an event's entry took or left is synced to whether the view still holds
it, which is right in any order and on any redelivery.

One ``ladder_derive_v5`` call per board and up to ``CHUNK`` events of a batch
(shared/lua/derive.lua), the events in the order the stream delivered them (the order the write
accepted them: the outbox's), applies each event whose record still has its derive-pending bit
and clears the bit in the same atomic step, so that a redelivered batch derives nothing twice;
an event whose record expired before it came is applied too, and gets a record without the bit.
The call also sets the board's ``as_of`` field ``derived``: the reads of these views say how far
behind they may trail with it.

A team sum the write used to refuse (a 422 ``range``: beyond ±(2**53 - 1)) the aggregator cannot
refuse, the event being accepted already: the event is left out of that team's sum, which stays
at its last exact total, and the aggregator logs it and counts it
(``ladder_aggregator_team_sums_left_out_total``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.boards import Board, BoardCatalog
from shared.events import ScoreAccepted, rfc3339
from shared.functions import DERIVE_FUNCTION, SYNC_DROPPED_FUNCTION
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import MAX_SCORE, reached_ms, signed, sub_part, tie_key
from shared.submit import board_period_expiry, feed_entry

log = structlog.get_logger(__name__)

DERIVED = Counter("ladder_aggregator_derived_events_total", "Events applied to derived views")
LEFT_OUT = Counter(
    "ladder_aggregator_team_sums_left_out_total",
    "Events left out of a team sum that would leave the exact scores (one a period)",
)
# Events a derive call takes at most: a consumer's batch may hold tens of thousands of one
# board's events (500 messages of up to LADDER_RELAY_BATCH), and a call runs atomically, holding
# Redis meanwhile (about 50 µs an event: calls of 1,000 held every other client for 50 ms while
# a backlog drained; calls of 100 held it 5 ms at the median under load), and
# passes each key's values to one command (Lua's unpack() takes a few thousand). A longer batch
# goes in several calls, in order, each awaited before the next is sent: Redis runs a client's
# pipelined calls back to back, and others' commands run between calls sent one by one.
CHUNK = 25


def _period_keys(keys: Keys, board_id: str, period: Period, period_id: str) -> list[str]:
    """A period's keys as derive.lua takes them: regions, players, event count, then the team
    board with its distinct set and tie keys (read on boards that sum teams)."""
    teams = keys.teams_view(board_id, period, period_id)
    return [
        keys.regions(board_id, period, period_id),
        keys.players(board_id, period, period_id),
        keys.event_count(board_id, period, period_id),
        teams,
        keys.distinct(teams),
        keys.ties(teams),
    ]


class Derive:
    """The consumer's part: apply a batch's events to the derived views, once each."""

    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog | None, feed_length: int
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._feed_length = feed_length

    @staticmethod
    def _expiry(board: Board, period: Period, period_id: str) -> int:
        return board_period_expiry(board, period, period_id)

    def call(
        self, board: Board, events: list[ScoreAccepted], as_of: str
    ) -> tuple[list[str], list[str | int]]:
        """``ladder_derive_v5``'s keys and arguments for ``events`` of ``board``, in the order
        they were accepted: each period's keys once, and each event naming its periods by
        number."""
        keys, bid = self._keys, board.board_id
        sums_teams = board.operator == "incr"
        call_keys: list[str] = [keys.feed(bid), keys.user_team(bid), keys.as_of(bid)]
        call_keys.append(keys.user_regions(bid))
        args: list[str | int] = [self._feed_length, as_of]
        args += ["1" if sums_teams else "0", "1" if board.descending else "0", MAX_SCORE]
        views = self._changed_pairs(board, events)
        args.append(len(views))
        for view, pairs in views.items():
            call_keys += [view, keys.distinct(view), keys.distinct_building(view)]
            args.append(len(pairs))
            for score, sub in pairs:
                args += [score, sub]
        numbers: dict[tuple[Period, str], int] = {}  # each period of the batch: its number
        event_keys: list[str] = []
        event_args: list[str | int] = []
        for event in events:
            mine: list[int] = []
            for period, result in event.periods.items():
                if period in board.periods:
                    at = (period, result.period_id)
                    mine.append(numbers.setdefault(at, len(numbers) + 1))
            event_keys += [
                keys.idempotency(bid, event.event_id, event.user_id),
                keys.legacy_idempotency(bid, event.event_id),
                keys.legacy_user_regions(bid, event.user_id),
            ]
            # The event's tie key (shared/submit.py): its team's sum is reached at the latest
            # of its events' (derive.lua sum_teams()).
            sub = sub_part(event.subscore, board.subscore_order)
            event_args += [len(mine), *mine, feed_entry(event), event.user_id, event.region]
            event_args += [event.team_id or "", event.value]
            event_args.append(tie_key(reached_ms(event.occurred_at), sub))
        args.append(len(numbers))
        for period, period_id in numbers:
            call_keys += _period_keys(keys, bid, period, period_id)
            args.append(self._expiry(board, period, period_id))
        return call_keys + event_keys, args + event_args

    def _changed_pairs(
        self, board: Board, events: list[ScoreAccepted]
    ) -> dict[str, dict[tuple[int, str], None]]:
        """Per regional board the events changed, the (signed score, subscore part) pairs its
        entries took and left (the outbox entry's ``previous_score`` and
        ``previous_subscore``), each once, in order."""
        bid, order, desc = board.board_id, board.subscore_order, board.descending
        views: dict[str, dict[tuple[int, str], None]] = {}
        for event in events:
            sub = sub_part(event.subscore, order)
            for period, result in event.periods.items():
                if not result.improved or period not in board.periods:
                    continue
                view = self._keys.region_view(bid, period, result.period_id, event.region)
                pairs = views.setdefault(view, {})
                pairs[(signed(result.score, desc), sub)] = None
                if result.previous_score is not None:
                    before = sub_part(result.previous_subscore, order)
                    pairs[(signed(result.previous_score, desc), before)] = None
        return views

    async def sync_dropped(self, events: list[ScoreAccepted]) -> None:
        """The pair sync alone of events left out (an erased user's, shared/erasure.py's
        ``skipping``): their writes changed the regional boards (write.lua) all the same, and
        a pair an event took or left is synced into the distinct sets by no other step; left
        unsynced, an erased user's score before its last write would stay a distinct score that
        no entry holds. Idempotent, in any order, and before or after the erasure's pass: each
        pair is made a member exactly when the view holds it."""
        by_board: dict[str, list[ScoreAccepted]] = defaultdict(list)
        for event in events:
            by_board[event.board_id].append(event)
        for board_id, board_events in by_board.items():
            board = await self._catalog.get(board_id) if self._catalog is not None else None
            if board is None:
                continue  # deleted since: its keys go
            for start in range(0, len(board_events), CHUNK):
                views = self._changed_pairs(board, board_events[start : start + CHUNK])
                if not views:
                    continue
                call_keys: list[str] = []
                args: list[str | int] = [len(views)]
                for view, pairs in views.items():
                    call_keys += [view, self._keys.distinct(view)]
                    call_keys.append(self._keys.distinct_building(view))
                    args.append(len(pairs))
                    args += [part for pair in pairs for part in pair]
                await self._redis.fcall(SYNC_DROPPED_FUNCTION, len(call_keys), *call_keys, *args)

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        by_board: dict[str, list[ScoreAccepted]] = defaultdict(list)
        for event in events:
            by_board[event.board_id].append(event)
        as_of = rfc3339(datetime.now(UTC))
        calls: list[tuple[list[str], list[str | int]]] = []
        for board_id, board_events in by_board.items():
            board = await self._catalog.get(board_id) if self._catalog is not None else None
            if board is None:
                continue  # a board deleted since: nothing of it is read any more
            for start in range(0, len(board_events), CHUNK):
                calls.append(self.call(board, board_events[start : start + CHUNK], as_of))
        if not calls:
            return
        replies: list[list[int]] = []
        for call_keys, args in calls:
            replies.append(
                await self._redis.fcall(DERIVE_FUNCTION, len(call_keys), *call_keys, *args)
            )
        DERIVED.inc(sum(applied for applied, _ in replies))
        left_out = sum(refused for _, refused in replies)
        if left_out:
            LEFT_OUT.inc(left_out)
            log.warning(
                "events left out of team sums beyond the exact scores; the teams keep their "
                "last exact totals",
                left_out=left_out,
                boards=sorted(by_board),
            )
