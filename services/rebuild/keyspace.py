"""What a board holds in Redis before and during its rebuild: which keys the rebuild makes
(and so replaces), staging an attempt left behind, and the global views whose users are merged
again."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from shared.keys import PERIOD_ID_IN_KEY, Keys

# The board's keys that the rebuild makes (what follows the hash tag). Everything else under the
# tag belongs to others and is left alone: idempotency answers, the outbox, the aggregator's
# global views and marks, snapshot marks, badges, the live views, rate buckets. (The hidden
# users' set is made again from MySQL's hidden_users.) (`:counts` are
# the per-score counts that an earlier layout kept beside each view: a rebuild drops them.) A
# view's `:ties`, its hash of tie keys, is made and replaced with it. A regional view's
# distinct-score set, and the one being built, are dropped: the replay makes none (the
# aggregator keeps them, on demand), and the views that had one are built again
# (:func:`dense_builds`).
_REBUILT = re.compile(
    rf"lb:[a-z]+:{PERIOD_ID_IN_KEY}:(region:[^:]+|teams)(:distinct|:distinct:building|:ties|:counts)?"
    rf"|(regions|players|events):[a-z]+:{PERIOD_ID_IN_KEY}"
    r"|user:.+:regions|user-regions|names|feed|user-team|hidden"
)
_REGION_VIEW = re.compile(rf"lb:[a-z]+:{PERIOD_ID_IN_KEY}:region:[^:]+")
_GLOBAL_VIEW = re.compile(rf"lb:[a-z]+:{PERIOD_ID_IN_KEY}:global")


@dataclass
class Existing:
    """One board's keys before its rebuild (see :func:`existing`)."""

    live: set[str] = field(default_factory=set)
    staging: set[str] = field(default_factory=set)
    global_views: set[str] = field(default_factory=set)


async def existing(
    redis: Redis, keys: Keys, board_ids: list[str], prefix: str
) -> dict[str, Existing]:
    """What the boards hold now, from one SCAN of ``prefix``: the keys of the kinds the rebuild
    makes (those it does not make again are deleted: a user or a period MySQL does not know),
    staging a dead rebuild left, and the global views (their users are merged again)."""
    tags = {keys.tag(b): b for b in board_ids}
    found = {b: Existing() for b in board_ids}
    async for key in redis.scan_iter(match=glob_escape(prefix) + "*", count=1000):
        tag, _, suffix = key.partition("}:")
        board = tags.get(tag + "}")
        if board is None:
            continue
        if suffix.startswith("rebuild:"):
            if suffix != "rebuild:journal":
                found[board].staging.add(key)
        elif _REBUILT.fullmatch(suffix) is not None:
            found[board].live.add(key)
        elif _GLOBAL_VIEW.fullmatch(suffix):
            found[board].global_views.add(key)
    return found


async def drop_staging(redis: Redis, keys: Keys, board_id: str) -> None:
    """Staging left by an attempt that did not finish (the journal is not staging)."""
    tag = keys.tag(board_id)
    journal = keys.rebuild_journal(board_id)
    batch: list[str] = []
    async for key in redis.scan_iter(match=glob_escape(tag) + ":rebuild:*", count=1000):
        if key != journal:
            batch.append(key)
        if len(batch) >= 500:
            await redis.unlink(*batch)
            batch = []
    if batch:
        await redis.unlink(*batch)


def region_views(keys: Keys, board_id: str, names: Iterable[str]) -> set[str]:
    """The regional views among the board's keys ``names``."""
    tag = keys.tag(board_id)
    return {k for k in names if _REGION_VIEW.fullmatch(k[len(tag) + 1 :])}


def region_sets(views: Iterable[str]) -> set[str]:
    """The distinct-score sets, and the sets being built, of regional views: a rebuild drops
    them (the replay makes none)."""
    return {k for v in views for k in (Keys.distinct(v), Keys.distinct_building(v))}


def dense_builds(keys: Keys, board_id: str, live: Iterable[str]) -> set[str]:
    """The build-set members ("<period>|<period_id>|region:<region>") of the regional views
    among the board's keys ``live`` that had a distinct-score set, or one being built."""
    tag = keys.tag(board_id)
    wanted: set[str] = set()
    for key in live:
        for end in (":distinct", ":distinct:building"):
            view = key[: -len(end)]
            if key.endswith(end) and _REGION_VIEW.fullmatch(view[len(tag) + 1 :]):
                # lb:<period>:<period_id>:region:<region>
                _, period, period_id, _, region = view[len(tag) + 1 :].split(":", 4)
                wanted.add(f"{period}|{period_id}|region:{region}")
    return wanted


def glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
