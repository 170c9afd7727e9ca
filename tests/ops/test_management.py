"""The RabbitMQ management UI that `make up` (scripts/infra.sh) enables on the local broker:
the read-only monitoring user logs in, sees the queues and connections, changes nothing, and a
running consumer shows on the Connections and Queues pages under its service's name.

Through the management HTTP API, the one the UI itself reads. The consumer runs on the test's
own exchange and queues (its broker prefix), so a running `make up` is not disturbed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import httpx
import pytest
from aiormq.exceptions import ChannelAccessRefused

from shared.amqp import connect as connect_broker
from shared.consumer import ConsumerRunner
from shared.events import ScoreAccepted
from shared.settings import LadderSettings
from shared.topology import Topology, connection_name, consumer_tag
from tests.helpers import consuming as runner_consuming
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
MANAGEMENT_URL = os.environ.get("LADDER_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672")
MONITOR = ("ladder-monitor", os.environ.get("LADDER_BROKER_MONITOR_PASSWORD", "dev-monitor"))


@pytest.fixture
async def monitor() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=MANAGEMENT_URL, auth=MONITOR, timeout=10) as client:
        yield client


async def _ignore(events: list[ScoreAccepted]) -> None:
    """The test's consumer takes nothing: its queue stays empty."""


@pytest.fixture
async def consuming(settings: LadderSettings, broker: Topology) -> AsyncIterator[ConsumerRunner]:
    """The aggregator's consumer, on the test's queues, until the test ends."""
    runner = ConsumerRunner(
        name="aggregator", amqp_url=settings.amqp_url, topology=broker, handler=_ignore
    )
    async with runner_consuming(runner, 15):
        yield runner


async def test_the_monitor_logs_in_with_the_monitoring_tag(monitor: httpx.AsyncClient) -> None:
    answer = await monitor.get("/api/whoami")
    assert answer.status_code == 200, answer.text
    assert answer.json()["tags"] == ["monitoring"]
    overview = (await monitor.get("/api/overview")).json()
    assert overview["rabbitmq_version"], overview


async def test_a_running_consumer_shows_by_name_on_connections_and_queues(
    monitor: httpx.AsyncClient, consuming: ConsumerRunner, broker: Topology
) -> None:
    name = connection_name("aggregator", "consumer")
    assert name.startswith("ladder-aggregator consumer ")

    async def named() -> dict[str, Any] | None:
        connections = (await monitor.get("/api/connections")).json()
        return next(
            (c for c in connections if c["client_properties"].get("connection_name") == name),
            None,
        )

    connection = await eventually(named, within=30)
    assert connection["user"] == "guest"

    queue_path = f"/api/queues/%2F/{quote(broker.queue('aggregator'), safe='')}"

    async def consumer_details() -> list[dict[str, Any]] | None:
        # The queue's consumer list comes with the broker's statistics, every few seconds.
        details: list[dict[str, Any]] = (
            (await monitor.get(queue_path)).json().get("consumer_details", [])
        )
        # Until the statistics catch up, a consumer's channel_details is an empty list.
        complete = details and all(isinstance(d["channel_details"], dict) for d in details)
        return details if complete else None

    details = await eventually(consumer_details, within=30)
    assert [d["consumer_tag"] for d in details] == [consumer_tag("aggregator")]
    # The channel names its connection by the broker's own name for it (addresses).
    assert details[0]["channel_details"]["connection_name"] == connection["name"]
    queue = (await monitor.get(queue_path)).json()
    assert queue["arguments"]["x-queue-type"] == "quorum"


async def test_the_monitor_sees_queues_but_changes_nothing(
    monitor: httpx.AsyncClient, settings: LadderSettings, broker: Topology
) -> None:
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        await broker.declare(await connection.channel())
    names = {q["name"] for q in (await monitor.get("/api/queues")).json()}
    assert broker.queue("history") in names
    queue_path = f"/api/queues/%2F/{quote(broker.queue('history'), safe='')}"
    # Neither through the HTTP API...
    assert (await monitor.delete(queue_path)).status_code in (401, 403)
    assert (await monitor.delete(f"{queue_path}/contents")).status_code in (401, 403)
    names = {q["name"] for q in (await monitor.get("/api/queues")).json()}
    assert broker.queue("history") in names
    # ...nor over AMQP: its permissions match no name, so it may not read a queue.
    user, password = MONITOR
    amqp = settings.amqp_url.replace("guest:guest@", f"{user}:{quote(password, safe='')}@")
    monitor_connection = await aio_pika.connect(amqp)
    async with monitor_connection:
        channel = await monitor_connection.channel()
        queue = await channel.get_queue(broker.queue("history"), ensure=False)
        with pytest.raises(ChannelAccessRefused):
            await queue.get(no_ack=True, fail=False)
        channel = await monitor_connection.channel()
        with pytest.raises(ChannelAccessRefused):
            await channel.declare_queue(f"{broker.prefix}.monitor-made", auto_delete=True)


HARNESS = """
set -u
SCRIPT_NAME=infra ROOT=$1 HOST=127.0.0.1
source scripts/common.sh
source scripts/infra_management.sh
# Nothing runs on the machine's broker: each command it would run is printed instead.
as_root() { echo "would run: $*" >&2; }
wait_until() { :; }
ensure_rabbitmq_management
"""


@pytest.mark.parametrize(
    ("environment", "dotenv", "refused"),
    [
        ({"LADDER_ENV": "prod"}, "", True),
        ({"LADDER_ENV": "prod", "LADDER_BROKER_MONITOR_PASSWORD": "dev-monitor"}, "", True),
        ({}, "LADDER_ENV=prod\n", True),  # the services read .env too
        ({"LADDER_ENV": "prod", "LADDER_BROKER_MONITOR_PASSWORD": "a-long-secret"}, "", False),
        ({}, "LADDER_ENV='prod'\nLADDER_BROKER_MONITOR_PASSWORD=a-long-secret\n", False),
        ({}, "", False),  # dev: the development password
    ],
)
def test_prod_refuses_the_development_monitor_password(
    tmp_path: Path, environment: dict[str, str], dotenv: str, refused: bool
) -> None:
    (tmp_path / ".env").write_text(dotenv)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LADDER_ENV", "LADDER_BROKER_MONITOR_PASSWORD")
    }
    done = subprocess.run(
        ["bash", "-c", HARNESS, "harness", str(tmp_path)],
        cwd=ROOT,
        env=env | environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if refused:
        assert done.returncode == 1
        assert "set LADDER_BROKER_MONITOR_PASSWORD" in done.stderr
        assert "would run" not in done.stderr  # refused before touching the broker
    else:
        assert done.returncode == 0, done.stderr
        assert "change_password ladder-monitor" in done.stderr or "add_user" in done.stderr
