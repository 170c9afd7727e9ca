"""Consumer faults: each consumer killed with SIGKILL mid-stream, restarted by supervisord."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from shared.keys import Keys
from tests.faults.checks import (
    consumed,
    figures,
    history_complete,
    metric,
    settled,
)
from tests.faults.load import Load
from tests.faults.servers import PrivateServers
from tests.faults.stack import CONSUMERS, FaultStack

pytestmark = pytest.mark.faults


async def test_consumers_killed_mid_stream(
    servers: PrivateServers, fault_stack: FaultStack
) -> None:
    """The aggregator, history and notifier are each killed (SIGKILL: no drain, no ack of the
    batch in hand) while scores pour in; supervisord starts each again by itself. No event is
    missing from MySQL or stored twice, every board is the sum of its history, and the global
    view is the sum of the regions once merged."""
    settings = fault_stack.settings
    keys = Keys(settings.key_prefix)
    restarts: dict[str, str] = {}
    async with Load(fault_stack.api, tag="kc") as load:
        await load.more(300)
        for service in CONSUMERS:
            old = await asyncio.to_thread(fault_stack.pid, service)
            assert old, f"{service} is not running: {fault_stack.ctl('status')}"
            killed = time.monotonic()
            os.kill(old, signal.SIGKILL)
            new = await asyncio.to_thread(fault_stack.new_pid, service, old)
            await asyncio.to_thread(fault_stack.wait_ready, service)
            restarts[service] = f"{old}->{new} ready in {time.monotonic() - killed:.1f}s"
            # It consumes again: the stream goes on past it before the next kill.
            await load.more(300)
        await load.stop()

    stored = await history_complete(settings, load, within=120)
    # Events the restarted history found stored already: a batch its killed predecessor had
    # committed but not acked (it depends on where the kill fell, so it is only reported).
    redelivered = await metric(
        fault_stack.ops("history"), 'ladder_history_events_total{outcome="duplicate"}'
    )
    matched, merged, queues = await settled(
        settings, keys, stored, [fault_stack.ops(c) for c in CONSUMERS], servers.rabbitmq
    )
    figures(
        "consumers_killed",
        load,
        stored,
        restarts=restarts,
        history_redelivered_already_stored=int(redelivered),
        region_entries_checked=matched,
        global_entries_checked=merged,
        queues_after=consumed(queues),
        exits=fault_stack.exits(),
    )
    assert set(load.statuses) == {200}, load.refused[:5]
    # Nothing else fell over: the only exits are the three kills.
    assert fault_stack.exits() == [f"{s}: terminated by SIGKILL" for s in CONSUMERS]
