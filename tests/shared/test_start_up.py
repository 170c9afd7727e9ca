"""What a service does at start-up: settings out of bounds stop it with the setting named
(shared/settings.py), and a Redis that does not answer yet is waited for, not a reason to exit
(shared/redis.py ``open_redis(wait=True)``), since a process manager soon gives up on a service
that keeps exiting."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.redis import open_redis
from shared.settings import LadderSettings
from tests.conftest import REDIS_URL


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("log_level", "verbose"),
        ("api_port", 70_000),
        ("notifier_port", 0),
        ("future_tolerance_seconds", -1),
        ("jwt_leeway_seconds", -5),
        ("redis_url", ""),
        ("mysql_url", "postgresql://root@127.0.0.1/ladder"),
    ],
)
def test_a_setting_out_of_bounds_stops_the_service_naming_it(setting: str, value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        LadderSettings(_env_file=None, **{setting: value})  # type: ignore[call-arg]
    assert setting in str(refused.value)


def test_a_log_level_is_taken_in_any_case() -> None:
    assert LadderSettings(_env_file=None, log_level="warning").log_level == "WARNING"  # type: ignore[call-arg]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_without_wait_a_redis_that_does_not_answer_fails_at_once() -> None:
    with pytest.raises(RedisConnectionError):
        async with open_redis(f"redis://127.0.0.1:{_free_port()}/0"):
            pass


async def test_a_service_starting_waits_for_redis_to_answer() -> None:
    # A Redis on a port where nothing listens yet: the opening waits, retrying; once a
    # Redis answers there, it goes on.
    port = _free_port()
    opened = asyncio.Event()

    async def start() -> None:
        async with open_redis(f"redis://127.0.0.1:{port}/0", wait=True) as redis:
            assert await redis.ping()
            opened.set()

    starting = asyncio.create_task(start())
    await asyncio.sleep(1.5)
    assert not starting.done()
    # Redis comes up: a forwarder from the port to the test Redis stands for it.
    target = REDIS_URL.removeprefix("redis://").split("/")[0].split(":")

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(target[0], int(target[1]))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(forward, "127.0.0.1", port)
    async with server:
        await asyncio.wait_for(opened.wait(), timeout=15)
        await starting
