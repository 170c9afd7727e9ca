"""Redis loses everything, or is rebuilt under load: ``make rebuild`` puts every board back
exactly as the history database says (docs/architecture.md, invariant 4)."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text

from shared.db import open_engine
from shared.keys import Keys, event_ref
from shared.ranking import id_of, score_of
from shared.redis import open_redis
from tests.faults.checks import (
    BOARD,
    boards_equal_history,
    consumed,
    figures,
    global_is_sum_of_regions,
    history_complete,
    nothing_left_behind,
    wait_for,
)
from tests.faults.load import Load
from tests.faults.servers import PrivateServers
from tests.faults.stack import CONSUMERS, FaultStack
from tests.helpers import ADMIN, SERVER, snapshot
from tests.stack import run

pytestmark = pytest.mark.faults

TEAMS = ("red", "blue", "gold", "teal")

# Keys that are not a projection of the event log: answers, queues, marks, timestamps, and what
# the notifier and the live views keep. The rebuild does not make them, so they are not compared.
# The write's and the consumers' own bookkeeping, which a rebuild does not make (as the
# idempotency answers, `newest` names the last event the write accepted and comes back with the
# next write).
# What a rebuild does not bring back from MySQL, besides the records and queues of events: the
# period closes' claims and marks (a period that ended is closed again, at a new time:
# docs/operations.md, "Seasons and period ends") and the merge and snapshot leases' fences
# (counters).
NOT_REBUILT = re.compile(
    r":(idem|outbox|newest|dirty|asof|top|seen|snapdirty|snaplease|livelease|badges|hot|mvp|live|rate"
    r"|rebuild|rebuilding|closed|closing|merge)(:|$)"
)

# Two more boards beside ``main`` (incr): every operator and both orders, daily and all-time.
EXTRA_BOARDS = {
    "speed": {"operator": "best", "order": "asc", "periods": ["daily", "alltime"]},
    "level": {"operator": "set", "order": "desc", "periods": ["weekly", "alltime"]},
}


@dataclass
class TeamLoad(Load):
    """:class:`Load` with teams and display names, so team boards and names are rebuilt too."""

    def event(self, worker: int, n: int, rng: Any) -> dict[str, Any]:
        body = super().event(worker, n, rng)
        user = int(body["user_id"].rsplit("u", 1)[1])
        body["team_id"] = TEAMS[user % len(TEAMS)]
        body["display_name"] = f"Player {user}"
        return body


def run_rebuild(stack: FaultStack) -> tuple[float, str]:
    """``make rebuild`` as a user runs it (the module, with the stack's environment)."""
    started = time.monotonic()
    done = run(
        [sys.executable, "-m", "services.rebuild", "--wait", "60"],
        env=stack.env,
        timeout=180,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (
        f"rebuild failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    # Its summary: one line a board (the JSON lines around it are its log).
    return took, "; ".join(line for line in done.stdout.splitlines() if not line.startswith("{"))


async def views(redis: Redis, prefix: str) -> dict[str, tuple[str, Any]]:
    """Every view of the test's boards (regional and global, every period, teams, distinct
    sets, feed, names, regions, counts), by key; players as their PFCOUNT (a HyperLogLog's
    bytes also hold a cached count that a read may refresh)."""
    state = {k: v for k, v in (await snapshot(redis, prefix)).items() if not NOT_REBUILT.search(k)}
    for key in state:
        if ":players:" in key:
            state[key] = ("hll", await redis.pfcount(key))
    return state


async def merged(redis: Redis, keys: Keys, boards: list[str]) -> bool:
    """Nothing left for the aggregator to merge on any board."""
    for board in boards:
        if await redis.exists(keys.dirty(board), keys.dirty_merging(board)):
            return False
    return True


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = [f"missing {k}" for k in sorted(before.keys() - after.keys())]
    out += [f"extra {k}" for k in sorted(after.keys() - before.keys())]
    for key in sorted(before.keys() & after.keys()):
        if before[key] != after[key]:
            was, now = before[key][1], after[key][1]
            at = next((i for i, (a, b) in enumerate(zip(was, now, strict=False)) if a != b), None)
            where = f" first at {at}: {was[at]!r} / {now[at]!r}" if at is not None else ""
            out.append(f"differs {key} ({len(was)} / {len(now)} items){where}")
    return out


async def settled_views(
    redis: Redis, keys: Keys, prefix: str, boards: list[str], want: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The views once every board is merged (and, given ``want``, once they equal it)."""
    last: dict[str, Any] = {}

    async def probe() -> bool:
        nonlocal last
        if not await merged(redis, keys, boards):
            return False
        last = await views(redis, prefix)
        return want is None or last == want

    try:
        await wait_for("views settled", probe, 60, every=0.5)
    except AssertionError:
        if want is None:
            raise
        diff = differences(want, last)
        raise AssertionError(f"{len(diff)} views differ: {diff[:10]}") from None
    return last


async def test_flushall_then_rebuild_restores_every_view(
    servers: PrivateServers, fault_stack: FaultStack
) -> None:
    """Load on three boards (incr with teams, best ascending, set), friendships; then the
    private Redis is flushed. ``make rebuild`` brings back every view equal to before the
    flush, key for key and byte for byte, and a second run changes nothing. The API runs its
    default workers, so two relays publish each board's outbox side by side: the event log
    keeps each event's outbox position, and the rebuild replays in that order whatever order
    history stored the events in."""
    settings = fault_stack.settings
    keys = Keys(settings.key_prefix)
    boards = [BOARD, *EXTRA_BOARDS]
    async with httpx.AsyncClient(base_url=fault_stack.api, timeout=10) as api:
        for board_id, spec in EXTRA_BOARDS.items():
            made = await api.put(f"/v1/boards/{board_id}", json=spec, headers=ADMIN)
            assert made.status_code in (200, 201), made.text
        for a, b in (("fr-u1", "fr-u2"), ("fr-u1", "fr-u3"), ("fr-u4", "fr-u2")):
            done = await api.put(f"/v1/users/{a}/friends/{b}", headers=SERVER)
            assert done.status_code == 204, done.text
    loads = [
        TeamLoad(fault_stack.api, tag="fm", users=120, concurrency=6),
        Load(fault_stack.api, tag="fs", board="speed", users=60, concurrency=3, seed=1),
        Load(fault_stack.api, tag="fl", board="level", users=60, concurrency=3, seed=2),
    ]
    for load in loads:
        await load.__aenter__()
    try:
        await loads[0].more(600)
        await loads[1].more(200)
        await loads[2].more(200)
    finally:
        for load in loads:
            await load.stop()
            await load.__aexit__(None, None, None)
    stored = await history_complete(settings, loads[0], within=120)
    for load in loads[1:]:
        await wait_for(
            f"board {load.board} stored",
            lambda load=load: _all_stored(settings.mysql_url, load),
            120,
            every=0.25,
        )

    async with open_redis(settings.redis_url) as redis:
        before = await settled_views(redis, keys, settings.key_prefix, boards)
        friends_before = await redis.smembers(keys.friends("fr-u1"))
        await redis.flushall()
        # Every view is gone. (Not every key: the running services may write one of their own
        # at any moment, a live view's tick or a relay's stream group, none of them rebuilt.)
        assert await views(redis, settings.key_prefix) == {}
        first_s, first_out = await asyncio.to_thread(run_rebuild, fault_stack)
        after = await settled_views(redis, keys, settings.key_prefix, boards, want=before)
        second_s, second_out = await asyncio.to_thread(run_rebuild, fault_stack)
        again = await settled_views(redis, keys, settings.key_prefix, boards, want=before)
        assert await redis.smembers(keys.friends("fr-u1")) == friends_before == {"fr-u2", "fr-u3"}
        leftovers = [k async for k in redis.scan_iter(match="*rebuild*")]
        matched = await boards_equal_history(redis, keys, stored)

    # And Ladder flows on, without a restart: scores accepted now reach MySQL, once.
    async with TeamLoad(fault_stack.api, tag="fa", users=120, concurrency=4, seed=3) as after_load:
        await after_load.more(200)
        await after_load.stop()
    loads[0].accepted.update(after_load.accepted)
    loads[0].sent += after_load.sent
    loads[0].statuses.update(after_load.statuses)
    stored = await history_complete(settings, loads[0], within=120)

    kinds: dict[str, int] = defaultdict(int)
    for key in before:
        kinds[key.split(":", 2)[2].split(":", 1)[0] if key.startswith("{") else "global"] += 1
    figures(
        "flushall_rebuild",
        loads[0],
        stored,
        other_boards_accepted={load.board: len(load.accepted) for load in loads[1:]},
        keys_compared=len(before),
        keys_by_kind=dict(kinds),
        rebuild_s=f"{first_s:.1f}",
        second_rebuild_s=f"{second_s:.1f}",
        rebuild_said=first_out,
        second_rebuild_said=second_out,
        region_entries_checked=matched,
        accepted_after_rebuild=len(after_load.accepted),
    )
    assert after == before and again == before
    assert set(after_load.statuses) == {200}, after_load.refused[:5]
    assert not leftovers, leftovers
    assert len(before) > 50


async def _all_stored(mysql_url: str, load: Load) -> bool:
    async with open_engine(mysql_url) as engine, engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT event_id, user_id FROM score_events WHERE board_id = :b"),
            {"b": load.board},
        )
        ids = [event_ref(r[0], r[1]) for r in rows]
    assert len(ids) == len(set(ids)), "an event stored twice"
    return set(ids) == set(load.accepted)


async def test_rebuild_while_writes_continue(
    servers: PrivateServers, fault_stack: FaultStack
) -> None:
    """``make rebuild`` runs while scores pour in on an ``incr`` board with teams, after Redis
    was made wrong on purpose (a stranger on a board, a score changed): afterwards every
    regional board is the sum of its history, the global view the sum of the regions, each team
    the sum of its members' events, and nothing is lost or counted twice."""
    settings = fault_stack.settings
    keys = Keys(settings.key_prefix)
    view = keys.region_view(BOARD, "alltime", "all", "eu")
    async with (
        open_redis(settings.redis_url) as redis,
        TeamLoad(fault_stack.api, tag="rw", users=200, concurrency=12) as load,
    ):
        await load.more(500)
        victim = (await redis.zrevrange(view, 0, 0))[0]
        await redis.zincrby(view, 1_000, victim)
        await redis.zadd(view, {"nobody-at-all": 5})
        accepted_before = len(load.accepted)
        rebuild = asyncio.create_task(asyncio.to_thread(run_rebuild, fault_stack))
        took, said = await rebuild
        accepted_during = len(load.accepted) - accepted_before
        await load.more(300)
        await load.stop()

    stored = await history_complete(settings, load, within=120)
    async with open_redis(settings.redis_url) as redis:
        matched = await boards_equal_history(redis, keys, stored)
        merged_ = await global_is_sum_of_regions(redis, keys, stored)
        teams = await _teams_equal_history(redis, keys, settings.mysql_url)
        journal = await redis.exists(keys.rebuild_journal(BOARD), keys.rebuilding(BOARD))
        queues = await nothing_left_behind(
            settings, redis, keys, [fault_stack.ops(c) for c in CONSUMERS], servers.rabbitmq
        )
    written = re.search(r"main: (\d+) events, (\d+) written meanwhile", said)
    assert written, said
    figures(
        "rebuild_under_load",
        load,
        stored,
        accepted_during_rebuild=accepted_during,
        rebuild_s=f"{took:.1f}",
        rebuilt_from_mysql=written[1],
        replayed_from_journal=written[2],
        region_entries_checked=matched,
        global_entries_checked=merged_,
        teams_checked=teams,
        queues_after=consumed(queues),
    )
    assert set(load.statuses) == {200}, load.refused[:5]
    assert accepted_during > 0, "no write happened during the rebuild"
    assert journal == 0


async def _teams_equal_history(redis: Redis, keys: Keys, mysql_url: str) -> int:
    """The all-time team board equals, per team, the sum of what MySQL holds for it."""
    async with open_engine(mysql_url) as engine, engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT team_id, SUM(value) FROM score_events "
                "WHERE board_id = :b AND team_id IS NOT NULL GROUP BY team_id"
            ),
            {"b": BOARD},
        )
        expected = {team: int(total) for team, total in rows}
    members = await redis.zrange(keys.teams_view(BOARD, "alltime", "all"), 0, -1, withscores=True)
    actual = {id_of(m): score_of(s, True) for m, s in members}
    assert actual == expected
    return len(expected)
