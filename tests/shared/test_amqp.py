"""Broker addresses: ``LADDER_AMQP_URL`` as a list, and connections that move on to the next
address (shared/amqp.py), against the machine's RabbitMQ and a port where nothing listens."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import structlog
from pydantic import ValidationError

from shared import amqp
from shared.settings import LadderSettings
from shared.topology import client_properties
from tests.conftest import AMQP_URL
from tests.helpers import UNREACHABLE_BROKER
from tests.stack import ROOT

DEAD = UNREACHABLE_BROKER  # port 1: refused at once
ANOTHER_DEAD = "amqp://guest:guest@127.0.0.1:2/"


def test_one_address_is_a_list_of_one() -> None:
    settings = LadderSettings(_env_file=None, amqp_url=AMQP_URL)  # type: ignore[call-arg]
    assert settings.amqp_urls == [AMQP_URL]


def test_several_addresses_keep_their_order() -> None:
    listed = f" {DEAD} ,{AMQP_URL}, amqps://u:p@rabbit-3:5671/ladder"
    settings = LadderSettings(_env_file=None, amqp_url=listed)  # type: ignore[call-arg]
    assert settings.amqp_urls == [DEAD, AMQP_URL, "amqps://u:p@rabbit-3:5671/ladder"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "names no broker address"),
        (f"{AMQP_URL},,{DEAD}", "address 2 of 3 is empty"),
        ("http://127.0.0.1:5672/", "address 1 of 1 is not an amqp:// or amqps:// URL"),
        (f"{AMQP_URL},amqp:///", "address 2 of 2 names no host"),
        ("amqp://guest:secret@127.0.0.1:99999/", "address 1 of 1 has a port out of 1-65535"),
        ("amqp://guest:secret@127.0.0.1:amqp/", "address 1 of 1 has a port that is not a number"),
        ("amqp://guest:secret@bad host/", "has a host that is neither a host name nor an IP"),
        # Options aio-pika would read as something else without a word: no heartbeats, no
        # certificate check, or a name it skips.
        ("amqp://g:secret@h/?heartbeat=30s", "would misread: 'heartbeat' (whole seconds below"),
        ("amqps://g:secret@h/?no_verify_ssl=false", "would misread: 'no_verify_ssl' (0 or 1)"),
        ("amqp://g:secret@h/?fail_fast=maybe", "would misread: 'fail_fast' (true or false)"),
        (f"{AMQP_URL},amqp://g:secret@h/?heartbeet=30", "address 2 of 2 has an option aio-pika"),
    ],
)
def test_a_bad_address_is_refused_by_its_position(value: str, said: str) -> None:
    with pytest.raises(ValidationError) as caught:
        LadderSettings(_env_file=None, amqp_url=value)  # type: ignore[call-arg]
    message = caught.value.errors(include_url=False)[0]["msg"]
    assert said in message
    assert "secret" not in message


@pytest.mark.parametrize(
    "options", ["heartbeat=30&name=api", "no_verify_ssl=1&cafile=/etc/ca.pem", "fail_fast=no"]
)
def test_options_aio_pika_reads_are_taken(options: str) -> None:
    listed = f"amqps://u:p@rabbit-1:5671/?{options}"
    assert LadderSettings(_env_file=None, amqp_url=listed).amqp_urls == [listed]  # type: ignore[call-arg]


def test_a_service_with_a_bad_address_does_not_start() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from shared.settings import load_settings; load_settings()"],
        cwd=ROOT,
        env={"LADDER_AMQP_URL": f"{AMQP_URL},rabbit-2:5672", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    logged = json.loads(done.stderr)
    assert logged["message"] == (
        "invalid settings: address 2 of 2 is not an amqp:// or amqps:// URL (LADDER_AMQP_URL)"
    )
    assert (logged["level"], logged["service"]) == ("error", "ladder")


async def test_a_dead_first_address_connects_to_the_second() -> None:
    with structlog.testing.capture_logs() as logs:
        connection = await amqp.connect_robust(
            [DEAD, AMQP_URL], client_properties=client_properties("api", "test")
        )
    try:
        assert connection.connected.is_set()
        assert connection.node == amqp.node_of(AMQP_URL)
        channel = await connection.channel()
        await channel.declare_queue(exclusive=True)
    finally:
        await connection.close()
    said = [(e["event"], e.get("node")) for e in logs if e["event"].startswith("broker")]
    assert said == [
        ("broker node unavailable", "127.0.0.1:1"),
        ("broker connected", amqp.node_of(AMQP_URL)),
    ]


async def test_a_plain_connection_takes_the_first_that_answers() -> None:
    connection = await amqp.connect([DEAD, ANOTHER_DEAD, AMQP_URL])
    async with connection:
        assert not connection.is_closed


async def test_no_address_answering_raises_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        await amqp.connect_robust([DEAD, ANOTHER_DEAD])
    assert time.monotonic() - started < 5


async def test_a_lost_connection_moves_on_round_the_list() -> None:
    """Connected to the live address (second), the connection is dropped: the next attempt goes
    to the next address (the dead one, round the list), fails, and the one after it (the live
    one again) succeeds; the channel and its queue are restored there."""
    connection = await amqp.connect_robust([DEAD, AMQP_URL], reconnect_interval=0.1)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())
        assert connection.index == 1
        with structlog.testing.capture_logs() as logs:
            transport = connection.transport
            assert transport is not None
            await transport.connection.close(ConnectionError("dropped by the test"))
            await asyncio.wait_for(reconnected.wait(), 10)
        assert connection.index == 1
        moves = [
            (e["lost"], e["next"]) for e in logs if e["event"] == "broker connection: next node"
        ]
        assert moves == [
            (amqp.node_of(AMQP_URL), "127.0.0.1:1"),
            ("127.0.0.1:1", amqp.node_of(AMQP_URL)),
        ]
        await queue.declare()  # the exclusive queue was made again on the new connection
    finally:
        await connection.close()
