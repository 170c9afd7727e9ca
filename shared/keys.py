"""The whole Redis key layout of Ladder, in one place: no other module builds a Redis key or a
Pub/Sub channel name.

Every key of a board carries the hash tag ``{<prefix>:<board_id>}``, so that every multi-key
operation Ladder makes (the atomic write, the global merge, a relay read) touches one hash slot
and runs unchanged on Redis Cluster; the price: one board lives on one shard. The layout, key by
key (type, what it holds): docs/architecture.md, "The Redis key layout".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OUTBOX_GROUP = "relay"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builders for one key prefix (``LADDER_KEY_PREFIX``)."""

    prefix: str

    # -- whole-installation keys -------------------------------------------------------------
    @property
    def boards(self) -> str:
        return f"{self.prefix}:boards"

    @property
    def relay_unroutable(self) -> str:
        """Why relays keep each board's outbox (services/api/relay/outbox.py), for /readyz."""
        return f"{self.prefix}:relay:unroutable"

    def ws_address(self, address: str) -> str:
        """A sorted set: the open WebSockets of one client address, scored by lease end."""
        return f"{self.prefix}:ws:address:{address}"

    def user_channel(self, user_id: str) -> str:
        return f"{self.prefix}:push:user:{user_id}"

    def board_channel(self, board_id: str, scope: str, period: str) -> str:
        return f"{self.prefix}:push:lb:{board_id}:{scope}:{period}"

    # -- per-board keys (one hash tag) ---------------------------------------------------------
    def tag(self, board_id: str) -> str:
        return "{" + f"{self.prefix}:{board_id}" + "}"

    def board_view(self, board_id: str, period: str, period_id: str, scope: str) -> str:
        """A sorted set: ``scope`` is ``global`` or ``region:<region>``."""
        return f"{self.tag(board_id)}:lb:{period}:{period_id}:{scope}"

    def region_view(self, board_id: str, period: str, period_id: str, region: str) -> str:
        return self.board_view(board_id, period, period_id, f"region:{region}")

    def global_view(self, board_id: str, period: str, period_id: str) -> str:
        return self.board_view(board_id, period, period_id, "global")

    def regions(self, board_id: str, period: str, period_id: str) -> str:
        return f"{self.tag(board_id)}:regions:{period}:{period_id}"

    def names(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:names"

    def rate_bucket(self, board_id: str, kind: str, who: str) -> str:
        """A token bucket; ``kind`` is ``user`` or ``key``. Under the board's hash tag, so that
        the rate-limited write checks and takes it in the same atomic call (one slot)."""
        return f"{self.tag(board_id)}:rate:{kind}:{who}"

    def idempotency(self, board_id: str, event_id: str, user_id: str) -> str:
        """The event's record: an ``event_id`` belongs to its board and user (docs/api.md
        section 4), so the record is named by both, the id first: an event id holds no ``:``
        (shared/events.py), so the first ``:`` after it ends it whatever the user id holds."""
        return f"{self.tag(board_id)}:idem:{event_ref(event_id, user_id)}"

    def replicated_mark(self, board_id: str) -> str:
        """A string (expiring) the write sets before a ``WAIT`` after no write of its own (a
        duplicate's answer), so that the ``WAIT`` covers the first write too (write/durable.py)."""
        return f"{self.tag(board_id)}:replicated"

    def legacy_idempotency(self, board_id: str, event_id: str) -> str:
        """The record of the layout before (ids unique per board), honoured until it expires
        (docs/architecture.md, "Idempotency"); its name holds no ``:`` after the id."""
        return f"{self.tag(board_id)}:idem:{event_id}"

    def outbox(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:outbox"

    def dirty(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:dirty"

    def dirty_merging(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:dirty:merging"

    def merge_lease(self, board_id: str) -> str:
        """``{P:B}:merge:lease`` (string, expiring): "<fence>|<owner>", its merger (lease.py)."""
        return f"{self.tag(board_id)}:merge:lease"

    def merge_fence(self, board_id: str) -> str:
        """``{P:B}:merge:fence`` (counter): the fence of the board's latest merge lease."""
        return f"{self.tag(board_id)}:merge:fence"

    def merge_takes(self, board_id: str) -> str:
        """``{P:B}:merge:takes`` (counter): the dirty set's renames, each a merge batch's name."""
        return f"{self.tag(board_id)}:merge:takes"

    def as_of(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:asof"

    def last_top(self, board_id: str, period: str, period_id: str, scope: str) -> str:
        return f"{self.tag(board_id)}:top:{period}:{period_id}:{scope}"

    def seen(self, board_id: str, consumer: str, event_id: str) -> str:
        """A consumer's mark of the layout before, apart from the event's record; unused once
        that layout's records expire (``LADDER_IDEMPOTENCY_TTL_SECONDS`` after the upgrade)."""
        return f"{self.tag(board_id)}:seen:{consumer}:{event_id}"

    def teams_view(self, board_id: str, period: str, period_id: str) -> str:
        return self.board_view(board_id, period, period_id, "teams")

    @staticmethod
    def distinct(view_key: str) -> str:
        """The distinct-score set that goes with a view (for dense ranks)."""
        return f"{view_key}:distinct"

    @staticmethod
    def distinct_building(view_key: str) -> str:
        """A view's distinct-score set while the aggregator builds it (renamed when done)."""
        return f"{view_key}:distinct:building"

    def dense(self, board_id: str) -> str:
        """``{P:B}:dense`` (set): the scope kinds read with ``rank_style=dense`` ("global",
        "region"): their views keep distinct-score sets once built (a team view always)."""
        return f"{self.tag(board_id)}:dense"

    def dense_build(self, board_id: str) -> str:
        """``{P:B}:dense:build`` (set): "<period>|<period_id>|<scope>" views whose distinct-score
        set a dense read found missing, for the aggregator to build."""
        return f"{self.tag(board_id)}:dense:build"

    @staticmethod
    def ties(view_key: str) -> str:
        """The hash of each id's current tie key that goes with a view (shared/ranking.py)."""
        return f"{view_key}:ties"

    def feed(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:feed"

    def players(self, board_id: str, period: str, period_id: str) -> str:
        return f"{self.tag(board_id)}:players:{period}:{period_id}"

    def event_count(self, board_id: str, period: str, period_id: str) -> str:
        return f"{self.tag(board_id)}:events:{period}:{period_id}"

    def user_regions(self, board_id: str) -> str:
        """``{P:B}:user-regions`` (hash): user_id -> the regions it scored in, each once, sorted
        byte by byte, joined by :data:`REGIONS_SEPARATOR`."""
        return f"{self.tag(board_id)}:user-regions"

    def legacy_user_regions(self, board_id: str, user_id: str) -> str:
        """``{P:B}:user:<user_id>:regions`` (set): the user's regions as the layout before kept
        them, a set a user; read where the hash has no field for the user yet, and folded into
        it by the derive step (shared/lua/derive.lua)."""
        return f"{self.tag(board_id)}:user:{user_id}:regions"

    def user_team(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:user-team"

    def newest_event(self, board_id: str) -> str:
        """The id of the newest event the write accepted (what a rebuild waits for)."""
        return f"{self.tag(board_id)}:newest"

    def badges(self, board_id: str, user_id: str) -> str:
        return f"{self.tag(board_id)}:badges:{user_id}"

    # -- the live views (docs/api.md section 8a) -----------------------------------------------
    def hot_events(self, board_id: str) -> str:
        """The recent on-time events, by ``occurred_at`` (ms), trimmed to the window; a member an
        event (its id and user: a redelivery rewrites its own member)."""
        return f"{self.tag(board_id)}:hot:events"

    def hot_window(self, board_id: str, window: int) -> str:
        """A window's per-user sums and counts, kept as events enter it and leave it."""
        return f"{self.tag(board_id)}:hot:window:{window}"

    def hot_rank(self, board_id: str, window: int) -> str:
        """A window's users ranked as the hot view ranks them (shared/lua/hot.lua)."""
        return f"{self.tag(board_id)}:hot:rank:{window}"

    def hot_view(self, board_id: str, window: int) -> str:
        return f"{self.tag(board_id)}:hot:{window}"

    def live_quiet(self) -> str:
        """When an aggregator last found every board whose hot view it did not recompute (an
        empty one, with no hot event since) still without a hot event (RFC 3339; expiring)."""
        return f"{self.prefix}:live:quiet"

    def team_members(self, board_id: str, period: str, period_id: str, team_id: str) -> str:
        return f"{self.tag(board_id)}:mvp:{period}:{period_id}:team:{team_id}"

    def member_team(self, board_id: str, period: str, period_id: str) -> str:
        return f"{self.tag(board_id)}:mvp:{period}:{period_id}:user-team"

    def mvp_view(self, board_id: str, period: str) -> str:
        return f"{self.tag(board_id)}:mvp:{period}"

    def mvp_dirty(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:mvp:dirty"

    def friends(self, user_id: str) -> str:
        """One set per user; a friends read takes it and then batches one board read."""
        return f"{self.prefix}:friends:{user_id}"

    def friends_match(self) -> str:
        """A ``SCAN`` pattern of every friend set (the prefix's own pattern has no glob
        characters: LADDER_KEY_PREFIX is lowercase letters, digits, ``_`` and ``-``)."""
        return f"{self.prefix}:friends:*"

    def friends_owner(self, key: str) -> str:
        """The user id of a friend set's key."""
        return key.removeprefix(f"{self.prefix}:friends:")

    def snapshot_dirty(self, board_id: str, *, taking: bool = False) -> str:
        """``{P:B}:snapdirty`` (set): "<period>|<period_id>|<scope>" views changed since the last
        snapshot, marked by history; ``taking=True``: ``{P:B}:snapdirty:taking``, the set a
        snapshot pass renamed it to and works on, so a crash mid-pass leaves it to be taken."""
        return f"{self.tag(board_id)}:snapdirty" + (":taking" if taking else "")

    def snapshot_take(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:snaptake"

    def lease(self, board_id: str, kind: str, *, fence: bool = False) -> str:
        """``{P:B}:<kind>lease`` (string, expiring): "<fence>|<owner>", who does that work of the
        board (``snap``: snapshots; ``live``: hot and MVP views); ``fence=True``: its counter."""
        return f"{self.tag(board_id)}:{kind}lease" + (":fence" if fence else "")

    # -- the rebuild (services/rebuild/; the write checks the flag and journals) -------------
    def rebuilding(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:rebuilding"

    def rebuild_journal(self, board_id: str) -> str:
        return f"{self.tag(board_id)}:rebuild:journal"

    def staged(self, board_id: str, key: str) -> str:
        """The staging copy of one of the board's keys: ``:rebuild`` after the hash tag."""
        tag = self.tag(board_id)
        if not key.startswith(tag + ":"):
            raise ValueError(f"{key!r} is not a key of board {board_id!r}")
        return f"{tag}:rebuild{key[len(tag) :]}"

    def replay_scratch(self, board_id: str) -> list[str]:
        """What a replayed write gets in place of its idempotency record, the record of the
        layout before, outbox, rebuild flag, journal and newest event
        (``shared.submit.WRITE_OWN_KEYS``): staging names that nothing reads, the replay
        deleting what it wrote to them and the flag never set, so that it journals nothing."""
        return [
            self.staged(board_id, self.idempotency(board_id, "replay", "replay")),
            self.staged(board_id, self.legacy_idempotency(board_id, "replay")),
            self.staged(board_id, self.outbox(board_id)),
            self.staged(board_id, self.rebuilding(board_id)),
            self.staged(board_id, self.rebuild_journal(board_id)),
            self.staged(board_id, self.newest_event(board_id)),
        ]

    # -- moderation (services/api/routes/moderation.py, shared/hidden.py) -------------------
    def hidden(self, board_id: str) -> str:
        """``{P:B}:hidden`` (set): the board's hidden users, whose members the write, the merge
        and the hide step keep out of every view while their records stay."""
        return f"{self.tag(board_id)}:hidden"

    # -- period ends (services/aggregator/closer.py, shared/lua/periods.lua) -----------------
    def period_closed(self, board_id: str, period: str, name: str) -> str:
        """The claim of a period's close (``name``: shared.periods.close_name), set once (``SET
        NX``) with the time it closed; whoever sets it writes the ``period.closed`` message."""
        return f"{self.tag(board_id)}:closed:{period}:{name}"

    def period_watermark(self, board_id: str, period: str) -> str:
        """The end (Unix seconds) of the latest closed period of that kind (before the first:
        the start of the one closing): the periods that ended since are closed, none before."""
        return f"{self.tag(board_id)}:closed:{period}"

    def period_closing(self, board_id: str, period: str, name: str) -> str:
        """Set once a period's close marked its users for a last merge: the take count after (incr
        boards: then the time, Unix seconds, and the newest event, awaited derived)."""
        return f"{self.tag(board_id)}:closing:{period}:{name}"

    def periods_outbox(self, board_id: str) -> str:
        """``period.closed`` messages the broker has not confirmed (consumer group ``relay``)."""
        return f"{self.tag(board_id)}:periods:outbox"

    # -- erasure and board deletion (shared/erasure.py, docs/api.md section 8b) ---------------
    @property
    def erased(self) -> str:
        """Hash: an erased user's :func:`shared.erasure.user_hash` -> its events' cut-off (ms)."""
        return f"{self.prefix}:erased"

    @property
    def erasing(self) -> str:
        """Hash: the hashes of the users whose erasure is pending (their writes wait) -> cut-off."""
        return f"{self.prefix}:erasing"

    @property
    def deleted_boards(self) -> str:
        """``P:deleted-boards`` (hash): board_id -> cut-off (ms); its events up to it are gone."""
        return f"{self.prefix}:deleted-boards"

    def board_match(self, board_id: str, within: str = "*") -> str:
        """A ``SCAN`` pattern of every key of a board (board ids hold no glob characters), or of
        those whose name after the hash tag ``within`` matches (``*:season:*``: seasons')."""
        return f"{self.tag(board_id)}:{within}"

    def idempotency_match(self, user_id: str) -> str:
        """A ``SCAN`` pattern of the event records naming ``user_id`` on every board (no glob
        characters in ids); :func:`record_user` tells apart an id ending ``:<user_id>``."""
        return "{" + f"{self.prefix}:*}}:idem:*:{user_id}"

    def boards_match(self) -> str:
        """A ``SCAN`` pattern of every key of every board."""
        return "{" + f"{self.prefix}:*"

    def view_of(self, key: str) -> tuple[str, str, str, str | None] | None:
        """(board_id, period, period_id, region or None for global) of a view's key, else None."""
        head = "{" + f"{self.prefix}:"
        board_id, found, rest = key.removeprefix(head).partition("}:")
        parsed = parse_view(rest) if key.startswith(head) and found else None
        return None if parsed is None else (board_id, *parsed)

    def team_set_of(self, key: str) -> str | None:
        """The board id of an MVP team's member set's key (:meth:`team_members`); else None."""
        head = "{" + f"{self.prefix}:"
        board_id, found, rest = key.removeprefix(head).partition("}:mvp:")
        return board_id if key.startswith(head) and found and ":team:" in rest else None

    def record_user(self, key: str) -> str | None:
        """The user id an event record's key names (None for one of the layout before: id alone)."""
        _, _, rest = key.partition("}:idem:")
        return parse_event_ref(rest)[1]


REGIONS_SEPARATOR = " "
"""Between a user's regions in :meth:`Keys.user_regions` (a region name holds none:
shared/events.py ``REGION_PATTERN``; shared/lua/common.lua spells it too)."""


def regions_of(field: str | None) -> list[str]:
    """The regions a :meth:`Keys.user_regions` field holds (none for no field)."""
    return field.split(REGIONS_SEPARATOR) if field else []


DERIVED_FIELD = "derived"
"""The field of a board's as_of hash that the aggregator's derive step sets (shared/lua/derive.lua
spells it too): when it last applied a batch of the board's events."""


def event_ref(event_id: str, user_id: str) -> str:
    """An event's identity within its board, ``<event_id>:<user_id>``: unambiguous, an event id
    holding no ``:``. The newest event key holds one, and the rebuild names events by it."""
    return f"{event_id}:{user_id}"


def parse_event_ref(ref: str) -> tuple[str, str | None]:
    """(event_id, user_id) of an :func:`event_ref` (user None: a bare id, of the layout before)."""
    event_id, _, user_id = ref.partition(":")
    return event_id, user_id or None


def seen_keys(
    keys: Keys, board_id: str, consumer: str, event_id: str, user_id: str
) -> tuple[str, str, str]:
    """What a consumer's seen marks of an event take (shared/lua/live.lua): the event's record,
    which holds its mark; the record of the layout before, under the id alone, which holds the
    marks of an event accepted before ids were scoped to users; and the seen key of the layout
    before that, for such a record without a marks byte."""
    return (
        keys.idempotency(board_id, event_id, user_id),
        keys.legacy_idempotency(board_id, event_id),
        keys.seen(board_id, consumer, event_id),
    )


def dirty_member(period: str, period_id: str, region: str, user_id: str) -> str:
    """A member of the dirty set. ``|`` cannot occur in any identifier."""
    return f"{period}|{period_id}|{region}|{user_id}"


def parse_dirty_member(member: str) -> tuple[str, str, str, str]:
    period, period_id, region, user_id = member.split("|", 3)
    return period, period_id, region, user_id


PERIOD_ID_IN_KEY = r"[^:]+(?::\d\d)?"
"""A period id in a key name: a season's (``2026-12-04T18:00``) holds one ``:``, no other."""

_VIEW = re.compile(rf"lb:([a-z]+):({PERIOD_ID_IN_KEY}):(global|region:([^:]+))")


def parse_view(suffix: str) -> tuple[str, str, str | None] | None:
    """(period, period_id, region or None for the global view) of a view's key without its
    ``{P:B}:`` tag (``lb:<period>:<period_id>:<scope>``); None for any other key."""
    matched = _VIEW.fullmatch(suffix)
    return None if matched is None else (matched[1], matched[2], matched[4])
