"""``make clean``: everything of a key prefix, a broker prefix and a history database goes, and
nothing else; twice is as good as once; a running Ladder is left running on a fresh start."""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from pathlib import Path

import aio_pika
import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from scripts.clean import clean, clean_broker
from services.history.migrate import migrate
from shared.amqp import connect as connect_broker
from shared.settings import LadderSettings
from shared.topology import Topology
from sim.control import declare_exchange, exchange_name
from tests.conftest import MYSQL_SERVER_URL
from tests.helpers import ADMIN, SERVER, UNREACHABLE_BROKER, api_client, server_statement
from tests.stack import ROOT, Stack, redis_env, run


def make_clean(settings: LadderSettings, run_dir: Path) -> str:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LADDER_KEY_PREFIX": settings.key_prefix,
        "LADDER_BROKER_PREFIX": settings.broker_prefix,
        **redis_env(settings),
        "LADDER_AMQP_URL": settings.amqp_url,
        "LADDER_MYSQL_URL": settings.mysql_url,
        "LADDER_RUN_DIR": str(run_dir),
    }
    done = run(["make", "-s", "--no-print-directory", "clean"], env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def database_exists(name: str) -> bool:
    engine = create_async_engine(MYSQL_SERVER_URL)
    try:
        async with engine.connect() as conn:
            found = await conn.execute(
                text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :n"),
                {"n": name},
            )
            return found.first() is not None
    finally:
        await engine.dispose()


async def exists(connection: aio_pika.abc.AbstractConnection, kind: str, name: str) -> bool:
    channel = await connection.channel()
    try:
        if kind == "queue":
            await channel.get_queue(name, ensure=True)
        else:
            await channel.get_exchange(name, ensure=True)
    except aio_pika.exceptions.ChannelNotFoundEntity:
        return False
    await channel.close()
    return True


async def keys_of(redis: Redis, prefix: str) -> list[str]:
    found = []
    for pattern in (f"{prefix}:*", "{" + prefix + ":*"):
        found += [k async for k in redis.scan_iter(match=pattern, count=1000)]
    return found


async def test_clean_twice_leaves_nothing_of_its_prefixes_and_touches_nothing_else(
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    mysql_database: str,
    tmp_path: Path,
) -> None:
    prefix = settings.key_prefix
    # What a Ladder of these prefixes makes: boards, scores, friends, rate buckets, ...
    quiet = settings.model_copy(update={"amqp_url": UNREACHABLE_BROKER})
    async with api_client(quiet) as api:
        for i in range(5):
            event = {"event_id": f"e{i}", "user_id": f"u{i}", "region": "eu", "value": 3}
            assert (await api.post("/v1/boards/main/scores", json=event, headers=SERVER)).is_success
        assert (await api.put("/v1/users/u1/friends/u2", headers=SERVER)).status_code == 204
    # ... its queues and exchanges and the simulation's control exchange ...
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        await broker.declare(channel)
        await declare_exchange(channel, settings.broker_prefix)
        # ... next to what is not its own: a game backend's queue named after Ladder's prefix,
        # and a longer prefix, which is another installation.
        await channel.declare_queue(f"{settings.broker_prefix}.periods.game", durable=True)
        await channel.declare_queue(f"{settings.broker_prefix}x.keep", auto_delete=False)
    await redis.set(f"{prefix}x:keep", "1")
    await redis.set("{" + prefix + "x:main}:keep", "1")
    assert len(await keys_of(redis, prefix)) > 10
    assert await database_exists(mysql_database)

    try:
        first = make_clean(settings, tmp_path / "run")
        second = make_clean(settings, tmp_path / "run")
        assert "database" in first and "dropped" in first
        assert "0 Redis keys" in second and "0 queues and 0 exchanges" in second
        assert "no history database" in second

        assert await keys_of(redis, prefix) == []
        assert not await database_exists(mysql_database)
        connection = await connect_broker(settings.amqp_urls)
        async with connection:
            gone = [
                *(("queue", name) for name in broker.queues),
                *(("exchange", name) for name in broker.exchanges),
                ("exchange", exchange_name(settings.broker_prefix)),
            ]
            for kind, name in gone:
                assert not await exists(connection, kind, name), name
            assert await exists(connection, "queue", f"{settings.broker_prefix}x.keep")
            assert await exists(connection, "queue", f"{settings.broker_prefix}.periods.game")
        assert await redis.get(f"{prefix}x:keep") == "1"
        assert await redis.get("{" + prefix + "x:main}:keep") == "1"
    finally:
        await redis.delete(f"{prefix}x:keep", "{" + prefix + "x:main}:keep")
        connection = await connect_broker(settings.amqp_urls)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(f"{settings.broker_prefix}x.keep")
            await channel.queue_delete(f"{settings.broker_prefix}.periods.game")


@pytest.mark.stack
@pytest.mark.timeout(180)
def test_clean_leaves_a_running_ladder_working_on_a_fresh_start(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api, headers=SERVER, timeout=10) as api:
        check_clean(stack, api)


def check_clean(stack: Stack, api: httpx.Client) -> None:
    old = {"event_id": "before-clean", "user_id": "old-timer", "region": "eu", "value": 9}
    assert api.post("/v1/boards/main/scores", json=old).status_code == 200
    assert api.put("/v1/boards/arena", json={}, headers=ADMIN).status_code == 201

    said = stack.make("clean")
    assert "dropped" in said and "started again" in said

    # Everything is gone ...
    assert api.get("/v1/boards/arena").status_code == 404
    assert api.get("/v1/boards/main/users/old-timer").status_code == 404
    # ... and everything works: a new score is ranked, merged, and kept in the new history.
    user = f"u-{uuid.uuid4().hex[:8]}"
    new = {"event_id": "after-clean", "user_id": user, "region": "eu", "value": 4}
    answer = api.post("/v1/boards/main/scores", json=new)
    assert answer.status_code == 200 and answer.json()["periods"]["alltime"]["rank"] == 1

    def kept() -> bool:
        events = api.get(f"/v1/boards/main/users/{user}/events")
        return events.status_code == 200 and len(events.json()["events"]) == 1

    def merged() -> bool:
        top = api.get("/v1/boards/main/leaderboard", params={"scope": "global"}).json()
        return [e["user_id"] for e in top["entries"]] == [user]

    for probe in (kept, merged):
        end = time.monotonic() + 20
        while not probe():
            assert time.monotonic() < end, f"{probe.__name__}: not within 20 s"
            time.sleep(0.2)


async def test_clean_leaves_a_longer_broker_prefix_its_queues_and_their_messages(
    settings: LadderSettings, broker: Topology
) -> None:
    # A prefix may hold dots: "<prefix>.staging" is another installation on the same broker,
    # whose names all begin with this prefix and a dot.
    other = Topology(prefix=f"{settings.broker_prefix}.staging")
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await broker.declare(channel)
        await other.declare(channel)
        exchange = await other.declare_exchange(channel)
        await exchange.publish(aio_pika.Message(b"staging's score"), routing_key="")
    try:
        await clean_broker(settings)
        connection = await connect_broker(settings.amqp_urls)
        async with connection:
            assert not await exists(connection, "queue", broker.queue("history"))
            assert not await exists(connection, "exchange", broker.scores_exchange)
            for name in other.queues:
                assert await exists(connection, "queue", name), name
            for name in other.exchanges:
                assert await exists(connection, "exchange", name), name
            channel = await connection.channel()
            queue = await channel.get_queue(other.queue("history"), ensure=True)
            message = await queue.get(timeout=5, no_ack=True)
            assert message.body == b"staging's score"
    finally:
        connection = await connect_broker(settings.amqp_urls)
        async with connection:
            await other.delete(await connection.channel())


async def test_clean_removes_the_periods_exchange_where_rabbitmqctl_is_not_at_hand(
    settings: LadderSettings, broker: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a host that runs no broker of its own: nothing can list the broker's names.
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        await broker.declare(await connection.channel())
    await clean_broker(settings)
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        for name in broker.queues:
            assert not await exists(connection, "queue", name), name
        for name in broker.exchanges:
            assert not await exists(connection, "exchange", name), name


async def made(settings: LadderSettings, redis: Redis, broker: Topology) -> None:
    """A few keys and the topology of ``settings``' prefixes, as a Ladder makes them."""
    await redis.set(f"{settings.key_prefix}:made", "1")
    await redis.set("{" + settings.key_prefix + ":main}:made", "1")
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        await broker.declare(await connection.channel())


async def test_clean_drops_a_database_whose_name_needs_quoting_with_all_the_rest(
    settings: LadderSettings, redis: Redis, broker: Topology, test_id: str
) -> None:
    # Settings and migrate accept a hyphen in the database's name; migrate quotes it.
    database = f"ladder-{test_id}"
    hyphened = settings.model_copy(update={"mysql_url": f"{MYSQL_SERVER_URL}/{database}"})
    await migrate(hyphened.mysql_url)
    await made(hyphened, redis, broker)
    try:
        await clean(hyphened)
        assert await keys_of(redis, settings.key_prefix) == []
        assert not await database_exists(database)
        connection = await connect_broker(settings.amqp_urls)
        async with connection:
            assert not await exists(connection, "queue", broker.queue("history"))
            assert not await exists(connection, "exchange", broker.scores_exchange)
    finally:
        await server_statement(MYSQL_SERVER_URL, f"DROP DATABASE IF EXISTS `{database}`")


async def test_clean_refusing_the_database_removes_nothing(
    settings: LadderSettings, redis: Redis, broker: Topology
) -> None:
    # The server's own schema is never Ladder's history database, whatever the URL says.
    refused = settings.model_copy(update={"mysql_url": f"{MYSQL_SERVER_URL}/information_schema"})
    await made(refused, redis, broker)
    with pytest.raises(SystemExit, match="information_schema"):
        await clean(refused)
    assert len(await keys_of(redis, settings.key_prefix)) == 2
    assert await database_exists("information_schema")
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        for name in broker.queues:
            assert await exists(connection, "queue", name), name
        for name in broker.exchanges:
            assert await exists(connection, "exchange", name), name


@pytest.mark.parametrize(("argument", "status"), [("--help", 0), ("--dry-run", 2)])
async def test_clean_given_an_argument_removes_nothing(
    settings: LadderSettings, redis: Redis, argument: str, status: int
) -> None:
    # `--help` prints what clean does; an argument it does not take (an operator hoping for a
    # dry run) is refused. Neither removes anything, whatever the settings name.
    await redis.set(f"{settings.key_prefix}:kept", "1")
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LADDER_KEY_PREFIX": settings.key_prefix,
        "LADDER_BROKER_PREFIX": settings.broker_prefix,
        **redis_env(settings),
        "LADDER_AMQP_URL": UNREACHABLE_BROKER,
        "LADDER_MYSQL_URL": settings.mysql_url,
        "PYTHONPATH": str(ROOT),
    }
    done = run([sys.executable, "scripts/clean.py", argument], env=env, timeout=60)
    assert done.returncode == status, done.stdout + done.stderr
    assert "usage: scripts/clean.py" in done.stdout + done.stderr
    assert await keys_of(redis, settings.key_prefix) == [f"{settings.key_prefix}:kept"]


async def test_clean_that_cannot_reach_a_server_names_its_setting_in_one_line(
    settings: LadderSettings, redis: Redis
) -> None:
    # The broker does not answer: clean stops there with a line naming the setting to check,
    # not a traceback, and without the address (a URL may hold a password).
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LADDER_KEY_PREFIX": settings.key_prefix,
        "LADDER_BROKER_PREFIX": settings.broker_prefix,
        **redis_env(settings),
        "LADDER_AMQP_URL": UNREACHABLE_BROKER.replace("guest:guest", "guest:secret"),
        "LADDER_MYSQL_URL": settings.mysql_url,
        "PYTHONPATH": str(ROOT),
    }
    done = run([sys.executable, "scripts/clean.py"], env=env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("clean: stopped: the server of LADDER_AMQP_URL cannot be used (")
    assert "secret" not in done.stderr and ":1" not in last
