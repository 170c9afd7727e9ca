"""The names of Ladder's Redis Functions, the only place that spells them.

The library (``shared/lua/*.lua``, loaded by :func:`shared.redis.library_source`) registers each
function under the name given here: the loader hands the Lua a table of these names, keyed by the
name of the Lua function that implements it.

A function's ``_vN`` suffix goes up when its keys or arguments change. Every process loads the
library at start-up, replacing the one Redis has; while processes of two versions share a Redis
(a rolling restart), a call in the old layout then finds no function, and fails, instead of
running one that reads its keys in another order and writes the wrong ones. (v2: the write's
rebuild flag and journal, and the rebuild's staging keys, come in as keys. v3 of the write, v2
of the merge's put and of the standing read: the exact score and the member's tie key, with a
hash of tie keys beside each view, shared/ranking.py. v4 of the write, replay and rebuild finish,
v3 of the put and standing read: subscores in the tie key, and each id's
record (tie key, score, metadata) in that hash, which readers of ids' entries take by ``HMGET``.
v5 of the write, replay and rebuild finish, v2 of contribute: the event's record under its id
holds a 16-digit body hash and a compact answer, and its consumers' seen marks, which contribute
takes as its first two keys, the record and the old seen key. v6 of the write, replay and
rebuild finish, v2 of rebuild begin: the derived views (team boards, feed, players, event
counts, regions, the user's regions and team) leave the write for the aggregator's derive
step; the write notes the board's newest event in a key of its own and sets the record's
derive-pending bit, and the finish clears the journaled events' bits. v7 of the write, replay
and rebuild finish, v2 of derive: the regional boards' distinct-score sets leave the write too,
kept by the derive step where dense reads asked for them, from the pairs each changed period's
outbox result names (``previous_score``, ``previous_subscore``; the write takes the board's
subscore order as its 18th argument); the derive step takes the regional boards first. v8 of
the write, replay and rebuild finish, v3 of rebuild begin, derive and contribute, v2 of seen and
mark_seen: an event id belongs to its board and user, so the event's record is named by both;
each takes the record of the layout before (the id alone) beside it, honoured until it expires;
the newest event key and the rebuild name events as ``<event_id>:<user_id>``. v10 of the write,
replay and rebuild finish, v5 of derive and merge: the users' regions are one hash a board
(``{P:B}:user-regions``) in place of a set a user: the write's ninth key names it, the derive
step takes it as its fourth key (and each event's set of the layout before, to fold it in), the
merge as its ninth. v12 of the write: the lean layout, the keys the write touches alone; the
journaled layout keeps the names v10 and v11. v13 of the lean write: each period's regions set,
a third key a period.)

A change of what a function does with the same keys and arguments keeps its name: a call of
either version then reads and writes the right keys, and whichever library was loaded last
serves every process (a new name would instead fail the new processes' calls whenever an old one
restarts and loads its library). So the write and the derive step kept theirs when an entry's
and a team sum's reach time came to go by when events happened, not the order they come in; and
the derive step and the erasure theirs when a user's latest team came to go by when its events
were accepted (the time kept in a field of the same hash, which the erasure deletes with the
team); and the merge kept its when it came to note in the users' regions hash the regions its
marks found a record in, to hold a global sum past the range at the range's end, and to set the
global view's expiry only where it has none. The write kept its name, too, when each period's
outbox result gained the member ``pulled_in`` (whom its user's fall moved up into a bracket):
its reply is still {status, payload}, the entry a JSON object a caller of either version passes
on whole, and the member is absent where nobody was moved, as in every entry written before. And
when it came to leave out a period already past its retention, answering the new status
``expired`` where none is left: before, such a write failed in Redis halfway (an error reply, a
503), so a caller of the version before meets the status only where it had an error. The write
and the merge kept theirs, too, when a set entry's record came to keep the time of its latest
write beside its reach time: a record without it reads as one written when reached, as before.
The award kept its name when a badge held already came to take the earlier of its two times.
The derive step (and the rebuild's finish, which clears the same bit) kept theirs when clearing an
event's derive-pending bit came to keep its record a day more (``EXPIRE ... GT``), as a
consumer's seen mark keeps it: the same keys and arguments, and a record of the same layout,
whose answer a retry gets for as long as it lasts, as after a mark.
The standing read kept its name when it came to read the board's as_of field, an optional fifth
key and argument: a caller of the version before passes neither, and a reply of the library
before lacks the element, read as no as_of.
"""

from __future__ import annotations

LIBRARY = "ladder_v1"
"""The library's name, kept across versions: ``FUNCTION LOAD REPLACE`` then swaps every function
below in one step (a library of another name could not hold functions of the same names)."""

# -- the write (docs/api.md sections 4 and 9a) -------------------------------------------------
SUBMIT_FUNCTION = "ladder_submit_v13"
"""One accepted score, atomically: boards, ranks, brackets, idempotency answer, outbox. Given
only the keys it touches (the lean layout, shared/submit.py): while the board is being rebuilt it
writes nothing and answers ``rebuilding``, and the caller sends the journaled call instead.
(v12: the lean layout; the journaled one keeps its name. v13: each period's regions set, a third
key a period, which a user's first score on the regional board adds the region to.)"""
WRITE_FUNCTION = "ladder_write_v13"
"""``SUBMIT_FUNCTION`` behind the user's and the credential's token buckets, in the same step.
(v11: each bucket a string, no longer a hash: both read in one MGET. v12: the lean layout. v13:
the regions set a period.)"""
JOURNALED_SUBMIT_FUNCTION = "ladder_submit_v10"
"""``SUBMIT_FUNCTION`` given every key a replay of the call writes (the journaled layout), so
that it is journaled whole while the board is being rebuilt (shared/lua/rebuild.lua). (v9: a
last key, the board's hidden users, whose entries stay records alone, out of every view. v10:
its ninth key is the board's users' regions hash, for the replay's derive step. It kept its name
when a user's first score on a regional board came to add the region to the period's regions set,
a key it named already.)"""
JOURNALED_WRITE_FUNCTION = "ladder_write_v11"
"""``JOURNALED_SUBMIT_FUNCTION`` behind the token buckets, as ``WRITE_FUNCTION``."""

# -- the aggregator ----------------------------------------------------------------------------
PUT_FUNCTION = "ladder_put_v3"
"""Replace entries of a merged (global) view with its distinct-score set."""
MERGE_FUNCTION = "ladder_merge_v6"
"""Combine a chunk of dirty users' regional records into the global view, in Redis, reading
each user's regions only, and take their dirty marks out of the merging set. (v2: the distinct
set being built and the board's dense marker come in as keys, the marker's member as an
argument; the global view keeps a distinct-score set only where it is read densely. v3: the
board's hidden users as a seventh key: their records are kept without their members. v4: the
board's merge lease as an eighth key and the caller's lease token before the marks: a caller
that lost the lease writes nothing. v5: the board's users' regions hash as a ninth key, read
for the chunk in one ``HMGET``; the ends of the set of the layout before stay, for a user with
no field yet. v6: the marks come in runs of one region, each run's region and count of marks
given, and how many users they name, before them: the function cuts each mark's id at a known
place and tells a user's marks apart by id only where a user has several; the reply's changed
ids come joined in one string, and the marks' regions, which the caller knows, no longer.)"""
TOP_PUSH_FUNCTION = "ladder_top_push_v1"
"""Publish a view's top 10 and store its fingerprint, only while the fingerprint key holds what
the caller read before it read the top: pushes of one view go out in the order of their reads."""
DENSE_BUILD_FUNCTION = "ladder_dense_build_v2"
"""A step of building a global or regional view's distinct-score set from the view, for dense
reads. (v2: under the board's merge lease, as the merge.)"""
LEASE_HOLD_FUNCTION = "ladder_lease_hold_v1"
"""Take or renew a board's merge lease; its token ("<fence>|<owner>"), or '' while another
aggregator holds it."""
LEASE_RELEASE_FUNCTION = "ladder_lease_release_v1"
"""Give a board's merge lease up, if still held with the token."""
SNAPSHOT_TAKE_FUNCTION = "ladder_snapshot_take_v1"
"""The start of a board's snapshot pass, under its snapshot lease: the changed-views set renamed
to the set the pass takes (unless one is left to take), and the take's time, kept with the set
so that a pass taking a set over stores its snapshots under the same time."""
SNAPSHOT_DONE_FUNCTION = "ladder_snapshot_done_v2"
"""The end of a board's snapshot pass, under its snapshot lease (taken and renewed with
``LEASE_HOLD_FUNCTION``): follow-up marks added, the taken set deleted, the lease given up; 0,
doing nothing, if the lease is not held with the token. (v2: the board's take hash as a fourth
key, the taken set's time deleted from it.)"""
MERGE_TAKE_FUNCTION = "ladder_merge_take_v2"
"""Under the merge lease: the dirty set becomes the merging set, unless one is there already.
(v2: a fourth key, the board's take counter, counts each rename.)"""
HOT_ADD_FUNCTION = "ladder_hot_add_v2"
"""Add events to the hot view's event set and windows, once per event. (v2: each window's
ranking, a sorted set, comes in as a key after its hash and is kept with it.)"""
HOT_TRIM_FUNCTION = "ladder_hot_trim_v2"
"""Move the hot view's windows forward, taking out what they leave behind. (v2: the windows'
rankings and the board's hidden users as keys; at most a step of events a call, and, once every
window is caught up, each one's top from its ranking.)"""
CONTRIBUTE_FUNCTION = "ladder_contribute_v4"
"""Count a batch of one board's team events toward their members' team contributions (the MVP
view), each once. (v4: a batch a call, its increments summed, in place of one event a call.)"""
DERIVE_FUNCTION = "ladder_derive_v5"
"""Apply a batch of a board's events to the views derived from them (team boards, feed,
players, event counts, regions, users' regions and teams), once per event; and sync the pairs
the events changed into the regional boards' distinct-score sets, where they have one. (v4: each
period's keys once a call, each event naming its periods by number, in place of every event
naming every key of its periods. v5: the board's users' regions hash as the fourth key, each
event's user's set of the layout before as its third.)"""
TRIM_USERS_FUNCTION = "ladder_trim_users_v1"
"""Trim a chunk of users from the names, users' regions and users' teams of a board that keeps no
all-time period: those no period the board still keeps holds (services/aggregator/trim.py)."""
SYNC_DROPPED_FUNCTION = "ladder_sync_dropped_v1"
"""The distinct-score pair sync alone (the derive step's) of events the aggregator leaves out:
an erased user's writes changed the regional boards, whose distinct sets no other step syncs."""

# -- the consumers' seen marks (the notifier's; contribute and notify take them too) ------------
SEEN_FUNCTION = "ladder_seen_v2"
"""Whether a consumer marked each of some events handled (read-only)."""
MARK_SEEN_FUNCTION = "ladder_mark_seen_v2"
"""Mark events handled by a consumer, in each event's record."""

# -- the notifier ------------------------------------------------------------------------------
AWARD_FUNCTION = "ladder_award_v1"
"""Record a badge and publish it, exactly once."""
NOTIFY_FUNCTION = "ladder_notify_v1"
"""Publish the rank messages of a board's events not handled yet and mark them handled, in one
step: each event's messages go out exactly once."""
UNAWARD_FUNCTION = "ladder_unaward_v1"
"""Take back a user's badges on a board up to a cut-off, and the event's record if it holds the
notifier's mark alone: the notifier's look after a batch (services/notifier/late_erasures.py)."""

# -- period ends (docs/api.md section 8b) -------------------------------------------------------
CLOSE_PERIOD_FUNCTION = "ladder_close_period_v3"
"""Claim a period's close, queue its ``period.closed`` message and publish its
``period_closed`` pushes, exactly once. (v2: the message's id comes as an argument, kept in its
outbox entry, since a season's is named by its end too; and a period that ends at or before its
kind's watermark is refused, claimed or not under the claim's name. v3: the outbox's bound,
``LADDER_PERIODS_OUTBOX_MAX``, comes before the message's id, the oldest entries past it are
dropped, and the reply says how many, after whether the period was closed.)"""
PARK_PERIODS_FUNCTION = "ladder_park_periods_v2"
"""A deleted board's period outbox moved, whole, to a key the deletion leaves to the period relay
(shared/parked_periods.py). (v2: an empty outbox is removed in the same step, so that the
deletion, which parks again after its scan, never unlinks an outbox a late close wrote to.)"""
DROP_PARKED_FUNCTION = "ladder_drop_parked_v1"
"""A parked period outbox removed once it holds no entry."""
PUBLISHING_PERIOD_FUNCTION = "ladder_publishing_period_v1"
"""A period outbox's entry marked as being published by the period relay, if still there as read
(an erasure replaced it otherwise: its rewriting goes out in its place)."""
ERASE_PERIOD_MESSAGES_FUNCTION = "ladder_erase_period_messages_v2"
"""``period.closed`` messages still waiting in a period outbox replaced by their rewriting
without an erased user (services/api/erased_periods.py), each if still there as read and not
being published. (v2: an entry the period relay marked as being published is left alone, and
counted apart, so that its rewriting never follows it under the same ``message_id``.)"""

# -- the relays (shared/relaying.py) -----------------------------------------------------------
FORGET_CONSUMERS_FUNCTION = "ladder_forget_consumers_v1"
"""Consumers of a relay's group deleted where they have no entry pending and have been idle long
enough: a stopped relay's own, a dead one's."""

# -- the rebuild (docs/reliability.md) ---------------------------------------------------------
REPLAY_FUNCTION = "ladder_replay_v10"
"""``SUBMIT_FUNCTION`` and the derive step onto staging keys, leaving no answer and no outbox
entry."""
REBUILD_BEGIN_FUNCTION = "ladder_rebuild_begin_v3"
"""Raise a board's rebuild flag and start its journal."""
REBUILD_EXTEND_FUNCTION = "ladder_rebuild_extend_v1"
"""Keep a rebuild's flag up."""
REBUILD_FINISH_FUNCTION = "ladder_rebuild_finish_v10"
"""Replay the journal onto staging and put staging in place of the live keys, in one step."""
REBUILD_ABORT_FUNCTION = "ladder_rebuild_abort_v1"
"""End a rebuild without a result."""

# -- reads (docs/api.md section 5) -------------------------------------------------------------
STANDING_FUNCTION = "ladder_standing_v3"
"""A user's place in a view and the entries around it (read-only)."""
PLACE_FUNCTION = "ladder_place_v3"
"""``STANDING_FUNCTION`` with the counts of the read's rank style (competition, dense), so that
the standing and ranks reads take one round trip in every style (read-only). (v2: a dense
count on a view without its distinct-score set comes as {count}, walked, or {} if too long.
v3: a fourth argument, 'self' for the user's own read, places a hidden user where it would be.)"""
PAGE_FUNCTION = "ladder_page_v3"
"""A page of a view: rows, size, first position (cursors), names, records, the first row's
style count and the global view's as_of, in one round trip (read-only). (v2: as the place
read's v2, its dense count. v3: a cursor whose member moved or left is placed by a binary search
among its score's entries instead of a walk from the score's first, so that every cursor costs
O(log² n + page) at most.)"""
FRIENDS_FUNCTION = "ladder_friends_v1"
"""A friends scope's group: the records in the global view and names of ids the caller read from
the owner's friend set, and the view's as_of, in one call of the board's keys (read-only)."""

# -- moderation (docs/api.md section 8b) ------------------------------------------------------
HIDE_FUNCTION = "ladder_hide_v1"
"""Take a hidden user's members out of some views (their records stay), or put them back from
their records, with the views' distinct-score sets."""

# -- erasure (docs/api.md section 8b; services/api/eraser.py) ---------------------------------
ERASE_USER_FUNCTION = "ladder_erase_user_v3"
"""Erase a user from one board's keys: the views named, feed, hot view, MVPs, badges, names.
(v2: each hot window's ranking as a key after its hash. v3: each view's distinct set being
built as a key after its distinct set.)"""
UNCOUNT_FUNCTION = "ladder_uncount_v1"
"""Take erased events out of a board's event counters (never below 0)."""
UNCOUNT_EVENTS_FUNCTION = "ladder_uncount_events_v1"
"""Take erased events out of a board's event counters, each once and only if it was counted
(its record's derive-pending bit clear), by their records."""

REGISTERED: dict[str, str] = {
    "submit": SUBMIT_FUNCTION,
    "write": WRITE_FUNCTION,
    "submit_journaled": JOURNALED_SUBMIT_FUNCTION,
    "write_journaled": JOURNALED_WRITE_FUNCTION,
    "put": PUT_FUNCTION,
    "merge": MERGE_FUNCTION,
    "top_push": TOP_PUSH_FUNCTION,
    "dense_build": DENSE_BUILD_FUNCTION,
    "lease_hold": LEASE_HOLD_FUNCTION,
    "lease_release": LEASE_RELEASE_FUNCTION,
    "merge_take": MERGE_TAKE_FUNCTION,
    "snapshot_take": SNAPSHOT_TAKE_FUNCTION,
    "snapshot_done": SNAPSHOT_DONE_FUNCTION,
    "hot_add": HOT_ADD_FUNCTION,
    "hot_trim": HOT_TRIM_FUNCTION,
    "contribute": CONTRIBUTE_FUNCTION,
    "derive": DERIVE_FUNCTION,
    "sync_dropped": SYNC_DROPPED_FUNCTION,
    "trim_users": TRIM_USERS_FUNCTION,
    "seen": SEEN_FUNCTION,
    "mark_seen": MARK_SEEN_FUNCTION,
    "award": AWARD_FUNCTION,
    "notify": NOTIFY_FUNCTION,
    "unaward": UNAWARD_FUNCTION,
    "close_period": CLOSE_PERIOD_FUNCTION,
    "park_periods": PARK_PERIODS_FUNCTION,
    "drop_parked": DROP_PARKED_FUNCTION,
    "publishing_period": PUBLISHING_PERIOD_FUNCTION,
    "erase_period_messages": ERASE_PERIOD_MESSAGES_FUNCTION,
    "forget_consumers": FORGET_CONSUMERS_FUNCTION,
    "replay": REPLAY_FUNCTION,
    "rebuild_begin": REBUILD_BEGIN_FUNCTION,
    "rebuild_extend": REBUILD_EXTEND_FUNCTION,
    "rebuild_finish": REBUILD_FINISH_FUNCTION,
    "rebuild_abort": REBUILD_ABORT_FUNCTION,
    "standing": STANDING_FUNCTION,
    "placed": PLACE_FUNCTION,
    "page": PAGE_FUNCTION,
    "friends": FRIENDS_FUNCTION,
    "hide": HIDE_FUNCTION,
    "erase_user": ERASE_USER_FUNCTION,
    "uncount": UNCOUNT_FUNCTION,
    "uncount_events": UNCOUNT_EVENTS_FUNCTION,
}
"""Each function's name keyed by the Lua function that implements it: the loader hands it to the
Lua as the table ``FUNCTIONS``, and each file registers ``FUNCTIONS.<key>``."""
