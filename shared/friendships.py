"""Friendships and friend requests in the history database (docs/api.md section 6).

MySQL is the source of truth of both. ``friendships`` holds a row for each direction of a mutual
friendship; ``friend_requests`` a row for each pending request (``user_id`` asked ``friend_id``).
Redis holds only a projection of the friendships (the sets ``Keys.friends``), which callers write
*after* these functions commit, and which :func:`shared.restore.reconcile_friendships` brings
back to what MySQL holds: a crash or a failed command between the two writes leaves a difference
that the next reconcile removes. Requests live in MySQL alone.

Every change holds the MySQL named locks of the users it touches (both of them), taken in one
order, so that two changes of a pair, or of one user's counts, run one after the other: two
players asking each other at once make one friendship, and the caps below are exact.

The caps keep one user from filling another's lists: a user has at most ``MAX_FRIENDS`` friends,
at most ``MAX_OUTGOING`` requests of its own pending (past that, an ask is refused), and at most
``MAX_INCOMING`` requests pending to it (past that, the oldest is dropped). Pending requests never
count toward ``MAX_FRIENDS``, and nothing another user sends keeps a user from asking, accepting,
declining or ending anything.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    and_,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared import db_locks
from shared.db import friend_requests, friendships, to_db_time
from shared.db_locks import named_locks

# Bounds a friends list, and so the friends scope's read, which fetches every friend's score.
MAX_FRIENDS = 1000
# A user's own pending requests: the most one account can spray at others.
MAX_OUTGOING = 100
# Requests pending to one user: past this, the oldest goes, so a flood cannot grow it.
MAX_INCOMING = 100
LOCK_WAIT_SECONDS = 10
FRIENDSHIP_PAGE = 5000


class Outcome(enum.Enum):
    FRIENDS = "friends"
    """The two are friends now (or were already)."""
    PENDING = "pending"
    """The caller's request waits for the other side's."""


class FriendsFull(Exception):
    """A user already has ``MAX_FRIENDS`` friends."""

    def __init__(self, user_id: str) -> None:
        super().__init__(
            f"User {user_id!r} already has {MAX_FRIENDS} friends, the most there may be."
        )
        self.user_id = user_id


class RequestsFull(Exception):
    """A user already has ``MAX_OUTGOING`` requests pending."""

    def __init__(self, user_id: str) -> None:
        super().__init__(
            f"User {user_id!r} already has {MAX_OUTGOING} friend requests pending, the most"
            " there may be: withdraw one (DELETE) or wait for answers."
        )
        self.user_id = user_id


class LockTimeout(db_locks.LockTimeout):
    """Another change of the same users held their lock for too long."""


def _lock_name(engine: AsyncEngine, user_id: str) -> str:
    # MySQL lock names are server-wide and at most 64 characters: the database names the
    # deployment (tests run many side by side), and a digest keeps any user id short.
    digest = hashlib.sha256(f"{engine.url.database}\0{user_id}".encode()).hexdigest()
    return f"ladder.friends.{digest[:40]}"


@contextlib.asynccontextmanager
async def _locked(engine: AsyncEngine, *user_ids: str) -> AsyncIterator[AsyncConnection]:
    """A connection holding the named locks of ``user_ids`` for the block, taken in one order
    (so that two changes never deadlock on them); the block's work is one transaction,
    committed when it ends without an error. Raises :class:`LockTimeout`."""
    names = [_lock_name(engine, u) for u in user_ids]
    refusal = LockTimeout("another change of these users' friends is under way")
    async with named_locks(engine, names, LOCK_WAIT_SECONDS, refusal) as conn:
        yield conn
        await conn.commit()


async def _are_friends(conn: AsyncConnection, user_id: str, friend_id: str) -> bool:
    t = friendships.c
    query = select(literal(1)).where(t.user_id == user_id, t.friend_id == friend_id)
    return await conn.scalar(query) is not None


async def _friend_counts(conn: AsyncConnection, *user_ids: str) -> dict[str, int]:
    t = friendships.c
    query = select(t.user_id, func.count()).where(t.user_id.in_(user_ids)).group_by(t.user_id)
    counts = {u: 0 for u in user_ids}
    counts.update({row[0]: row[1] for row in await conn.execute(query)})
    return counts


def _pair(table: Table, user_id: str, friend_id: str) -> ColumnElement[bool]:
    """The rows of ``table`` between the two users, either way."""
    c = table.c
    return or_(
        and_(c.user_id == user_id, c.friend_id == friend_id),
        and_(c.user_id == friend_id, c.friend_id == user_id),
    )


async def _make_friends(conn: AsyncConnection, user_id: str, friend_id: str) -> None:
    """Both rows of the friendship, and no request left between the two; raises
    :class:`FriendsFull` (changing nothing) if either side is full."""
    if not await _are_friends(conn, user_id, friend_id):
        counts = await _friend_counts(conn, user_id, friend_id)
        for who in (user_id, friend_id):
            if counts[who] >= MAX_FRIENDS:
                raise FriendsFull(who)
        now = to_db_time(datetime.now(UTC))
        await conn.execute(
            insert(friendships).values(
                [
                    {"user_id": user_id, "friend_id": friend_id, "created_at": now},
                    {"user_id": friend_id, "friend_id": user_id, "created_at": now},
                ]
            )
        )
    await conn.execute(delete(friend_requests).where(_pair(friend_requests, user_id, friend_id)))


async def befriend(engine: AsyncEngine, user_id: str, friend_id: str) -> None:
    """Make the two friends of each other at once (a server key's PUT); already friends is
    fine. Pending requests between them are settled. Raises :class:`FriendsFull`."""
    async with _locked(engine, user_id, friend_id) as conn:
        await _make_friends(conn, user_id, friend_id)


async def ask(engine: AsyncEngine, user_id: str, friend_id: str) -> Outcome:
    """``user_id`` asks ``friend_id`` for friendship (a player's PUT): if ``friend_id`` has asked
    too, they are friends now; otherwise the request waits (asking again changes nothing).
    Raises :class:`FriendsFull` if a friendship made now, or ever, could not fit ``user_id``'s
    list (or ``friend_id``'s, when accepting), and :class:`RequestsFull` if ``user_id`` has too
    many requests pending; either way nothing changes."""
    async with _locked(engine, user_id, friend_id) as conn:
        pair = (await conn.execute(_pair_state(user_id, friend_id))).one()
        if pair.friends:
            return Outcome.FRIENDS
        if pair.asked:
            await _make_friends(conn, user_id, friend_id)
            return Outcome.FRIENDS
        if pair.my_friends >= MAX_FRIENDS:
            raise FriendsFull(user_id)
        if pair.mine:
            return Outcome.PENDING
        if pair.my_requests >= MAX_OUTGOING:
            raise RequestsFull(user_id)
        now = to_db_time(datetime.now(UTC))
        await conn.execute(
            insert(friend_requests).values(user_id=user_id, friend_id=friend_id, created_at=now)
        )
        if pair.their_incoming >= MAX_INCOMING:
            # The oldest go, one index range: the list stays at the cap however many ask.
            await conn.execute(
                DROP_OLDEST, {"user_id": friend_id, "n": pair.their_incoming + 1 - MAX_INCOMING}
            )
    return Outcome.PENDING


# MySQL's own DELETE ... ORDER BY ... LIMIT, which SQLAlchemy's delete() does not spell.
DROP_OLDEST = text(
    "DELETE FROM friend_requests WHERE friend_id = :user_id ORDER BY created_at, user_id LIMIT :n"
)


def _pair_state(user_id: str, friend_id: str) -> Select[Any]:
    """What an ask decides on, in one round trip: whether the two are friends, whether either
    has asked the other, ``user_id``'s friends and requests, and the requests to ``friend_id``."""
    t, r = friendships.c, friend_requests.c

    def has(table: Table, *where: ColumnElement[bool]) -> Any:
        return exists().where(*where).select_from(table)

    def count(*where: ColumnElement[bool]) -> Any:
        return select(func.count()).where(*where).scalar_subquery()

    return select(
        has(friendships, t.user_id == user_id, t.friend_id == friend_id).label("friends"),
        has(friend_requests, r.user_id == friend_id, r.friend_id == user_id).label("asked"),
        has(friend_requests, r.user_id == user_id, r.friend_id == friend_id).label("mine"),
        count(t.user_id == user_id).label("my_friends"),
        count(r.user_id == user_id).label("my_requests"),
        count(r.friend_id == friend_id).label("their_incoming"),
    )


async def unfriend(engine: AsyncEngine, user_id: str, friend_id: str) -> None:
    """End the friendship both ways and drop the requests pending between the two, either way:
    ``user_id`` withdraws its own, declines ``friend_id``'s. None of them there is fine."""
    async with _locked(engine, user_id, friend_id) as conn:
        await conn.execute(delete(friendships).where(_pair(friendships, user_id, friend_id)))
        await conn.execute(
            delete(friend_requests).where(_pair(friend_requests, user_id, friend_id))
        )


async def load_friends(engine: AsyncEngine, user_id: str) -> list[str]:
    """The user's friends, sorted."""
    t = friendships.c
    async with engine.connect() as conn:
        rows = await conn.scalars(
            select(t.friend_id).where(t.user_id == user_id).order_by(t.friend_id)
        )
        return list(rows)


async def load_requests(engine: AsyncEngine, user_id: str) -> tuple[list[str], list[str]]:
    """The requests pending to the user and its own, each a sorted list of user ids (at most
    ``MAX_INCOMING`` and ``MAX_OUTGOING``)."""
    r = friend_requests.c
    async with engine.connect() as conn:
        incoming = await conn.scalars(
            select(r.user_id).where(r.friend_id == user_id).order_by(r.user_id)
        )
        outgoing = await conn.scalars(
            select(r.friend_id).where(r.user_id == user_id).order_by(r.friend_id)
        )
        return list(incoming), list(outgoing)


async def friends_by_user(
    engine: AsyncEngine, page: int = FRIENDSHIP_PAGE
) -> AsyncIterator[dict[str, set[str]]]:
    """Every user that has friends, with all of them, a page of about ``page`` rows at a time
    in user order: a user's friends are never split across two pages, and memory stays bounded
    however many friendships there are."""
    t = friendships.c
    after: str | None = None
    while True:
        query = select(t.user_id, t.friend_id).order_by(t.user_id, t.friend_id).limit(page)
        if after is not None:
            query = query.where(t.user_id > after)
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        found: dict[str, set[str]] = defaultdict(set)
        for user_id, friend_id in rows:
            found[user_id].add(friend_id)
        if len(rows) == page:
            # The last user may go on past the page: read it whole with the next one, or alone
            # if it filled the page by itself.
            last = rows[-1].user_id
            if len(found) > 1:
                del found[last]
            else:
                found[last] = set(await load_friends(engine, last))
        if not found:
            return
        yield dict(found)
        if len(rows) < page:
            return
        after = next(reversed(found))


async def users_with_friends(engine: AsyncEngine, user_ids: Iterable[str]) -> set[str]:
    """Those of ``user_ids`` that have at least one friend in MySQL."""
    ids = list(user_ids)
    if not ids:
        return set()
    t = friendships.c
    async with engine.connect() as conn:
        rows = await conn.scalars(select(t.user_id).where(t.user_id.in_(ids)).distinct())
        return set(rows)
