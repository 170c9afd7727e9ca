"""Database faults: MySQL stopped under load, then started again."""

from __future__ import annotations

import time

import httpx
import pytest

from shared.keys import Keys
from tests.faults.checks import (
    Sampler,
    assert_answered_throughout,
    consumed,
    figures,
    history_complete,
    queue_depths,
    restarted_while_down,
    settled,
    stopped_under_load,
    wait_for,
)
from tests.faults.load import Load
from tests.faults.servers import PrivateServers
from tests.faults.stack import CONSUMERS, FaultStack

pytestmark = pytest.mark.faults


async def test_mysql_stopped_under_load(servers: PrivateServers, fault_stack: FaultStack) -> None:
    """MySQL stops while scores pour in: score writes do not notice (every answer 2xx), history
    says it is not ready and holds its queue, and once MySQL is back it catches up exactly:
    every accepted event once."""
    settings = fault_stack.settings
    keys = Keys(settings.key_prefix)
    history_url = f"{fault_stack.ops('history')}/readyz"
    history_queue = f"{settings.broker_prefix}.scores.history"
    async with (
        Sampler(f"{fault_stack.api}/readyz") as api_ready,
        Load(fault_stack.api, tag="my") as load,
        httpx.AsyncClient(timeout=5) as client,
        stopped_under_load(servers.mariadb, load) as t,
    ):

        async def history_not_ready() -> int:
            status = (await client.get(history_url)).status_code
            return status if status == 503 else 0

        await wait_for("history /readyz 503 while MySQL is down", history_not_ready, 20)
        not_ready_after = time.monotonic() - t.down
        await load.more(600)

        async def backlog() -> int:
            return (await queue_depths(settings))[history_queue]

        held = await wait_for("history's queue holds events", backlog, 20)

    outage = load.answered_between(t.down, t.starting)
    ready_during = api_ready.between(t.stopping, t.up)
    stored = await history_complete(settings, load, within=120)
    caught_up = time.monotonic() - t.up
    matched, merged, queues = await settled(
        settings, keys, stored, [fault_stack.ops(c) for c in CONSUMERS], servers.rabbitmq
    )
    figures(
        "mysql_stopped",
        load,
        stored,
        mysql_down_s=f"{t.starting - t.down:.1f}",
        history_503_after_s=f"{not_ready_after:.1f}",
        answered_while_down=dict(outage),
        history_queue_held=held,
        api_readyz_while_down=dict(ready_during),
        history_caught_up_s=f"{caught_up:.1f}",
        region_entries_checked=matched,
        global_entries_checked=merged,
        queues_after=consumed(queues),
        unexpected_exits=fault_stack.exits(),
    )
    assert_answered_throughout(load, outage, ready_during)


async def test_history_restarted_while_mysql_is_down(
    servers: PrivateServers, fault_stack: FaultStack
) -> None:
    """History dies while MySQL is away, and the process manager starts it again at once: it
    must wait for MySQL rather than exit, and once MySQL is back catch up exactly."""
    await restarted_while_down(
        fault_stack, "md", servers.mariadb.stop, servers.mariadb.start, "mysql"
    )
