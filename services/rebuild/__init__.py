"""``make rebuild``: every board recreated in Redis, exactly, from the history database.

An operator's tool, not a service: run as ``python -m services.rebuild [--board ID ...] [--wait
SECONDS] [--restored]`` (``--restored``: after the history database was restored from a backup,
what it lacks of what Redis applied is left out rather than waited for; step 2 and the counter
check of step 5 below give way, docs/operations.md). Redis is a projection of MySQL (the design
invariants in docs/architecture.md): this puts back, from MySQL alone, the board definitions and
friendships (:mod:`shared.restore`, which the API runs at start-up too), and for each board its
regional views of every period still retained, team boards and their distinct-score sets, feed,
player and event counts, each user's regions and team, and display names; then it marks every
user of every view dirty, so the aggregator merges the global views again through its own code.
A regional view's distinct-score set (kept on demand by the aggregator) is dropped, and built
again by the aggregator from the rebuilt view where the board is still read densely there.

Each event is replayed, in the order its write was applied in (its position in the board's
outbox stream, which the event log keeps), through ``ladder_replay_v10``:
the very ``submit()`` of the write path, then the aggregator's derive step (feed, counts,
regions, users' regions and teams), aimed at staging keys, leaving no idempotency answer and no
outbox entry, into the periods its live write put it in (the event log keeps them; an event
stored before it did goes into the board's periods as they are now, and a season of a former
schedule is kept a day past its latest event: :func:`services.rebuild.staging.expire_former`).
So the rebuilt sorted sets hold byte for byte what the writes made, however many relays
published the events and in whatever order history stored them. Events stored before the log
kept positions (migration 0012) are replayed first, in the order they were stored: the order
they were applied in where one relay published them (docs/reliability.md).

Writes may go on meanwhile. Per board (:class:`services.rebuild.rebuilder.Rebuilder`):

1. ``ladder_rebuild_begin_v3`` raises the board's ``rebuilding`` flag, holding this rebuild's
   token (a second rebuild of the board at once is refused), with a TTL kept up while the
   rebuild works, and starts its journal: from then on every event ``submit()`` applies is
   also journaled. It returns the events in the outbox and the newest the write accepted,
   each named by its id and user (an event id belongs to its board and user:
   ``shared.keys.event_ref``) (:mod:`services.rebuild.flag`).
2. Wait until MySQL holds those, and the aggregator has derived them: then both hold every
   event applied before the flag (the relay publishes, and history stores and the aggregator
   derives, in outbox order).
3. Read the board's events in one consistent snapshot of MySQL, in keyset pages of their
   outbox position (memory stays bounded by a page), replaying each onto staging
   (:mod:`services.rebuild.event_log`, :mod:`services.rebuild.staging`).
4. In the same snapshot, look up which journaled events it held.
5. ``ladder_rebuild_finish_v10``, one atomic step: replay the other journaled events onto staging,
   check that no live event counter is ahead of its staged one (an event applied before the flag
   that MySQL did not hold yet: then all is thrown away and the board read again), rename
   staging over the live keys, clear the journaled events' derive-pending bits (staging holds
   their derived views: the aggregator must not apply them again), drop the flag and journal
   (:mod:`services.rebuild.finish`).

Running it twice changes nothing: the second run builds the same keys from the same events.
docs/reliability.md has the argument in full.
"""
