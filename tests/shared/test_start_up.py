"""What a service does at start-up: settings it cannot work with stop it with the setting named
(shared/settings.py, shared/settings_checks.py), in one JSON log line, and a Redis that does not
answer yet is waited for, not a reason to exit (shared/redis.py ``open_redis(wait=True)``), since
a process manager soon gives up on a service that keeps exiting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from annotated_types import Ge, Gt, Le, Lt
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.redis import open_redis
from shared.settings import LadderSettings, SettingsError
from tests.conftest import ON_CLUSTER, REDIS_URL
from tests.stack import ROOT


def _refusal(**values: Any) -> str:
    """The message of the settings' refusal of ``values``, as load_settings puts it (each
    problem then its setting)."""
    with pytest.raises(ValidationError) as refused:
        LadderSettings(_env_file=None, **values)  # type: ignore[call-arg]
    return "; ".join(
        f"{e['msg']} (LADDER_{str(e['loc'][0]).upper()})" if e["loc"] else e["msg"]
        for e in refused.value.errors(include_url=False)
    )


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
        # Past what the code can use: a Redis TTL, a date, a queue argument.
        ("idempotency_ttl_seconds", 10**20),
        ("allowed_lateness", 1e11),
        ("allowed_lateness", 1e300),
        ("future_tolerance_seconds", 1e11),
        ("delivery_limit", 10**20),
        ("delivery_limit", 1001),
        ("feed_length", 10**20),
        ("outbox_max", 10**20),
        ("periods_outbox_max", 10**20),
        ("max_body_bytes", 10**20),
        ("relay_claim_idle_ms", 10**20),
        ("history_flush_ms", 10**20),
        ("ws_send_queue", 10**20),
        ("ws_max", 10**20),
        ("ws_max_per_ip", 10**20),
        ("jwt_leeway_seconds", 3601),
        ("shutdown_grace_seconds", 1e9),
        ("friends_reconcile_seconds", 1e9),
        ("snapshot_interval", 1e9),
        ("merge_interval", 1e9),
        # Below what works: a bucket that never holds a whole token, a lease shorter than a
        # merge, a ticker that never sleeps.
        ("user_rate", 0.4),
        ("key_rate", 0.9),
        ("ws_message_rate", 1e-300),
        ("merge_interval", 1e-9),
        ("snapshot_interval", 1e-9),
        ("friends_reconcile_seconds", 0.001),
        ("friends_reconcile_seconds", 0.999),
        ("api_host", ""),
        ("ops_host", ""),
        ("api_host", "not a host!"),
        ("ops_host", "[::1]"),
    ],
)
def test_a_setting_out_of_bounds_stops_the_service_naming_it(setting: str, value: object) -> None:
    assert f"LADDER_{setting.upper()}" in _refusal(**{setting: value})


NUMBERS = [
    name
    for name, field in LadderSettings.model_fields.items()
    if field.annotation in (int, float, "int", "float")
]


def test_every_number_has_both_bounds() -> None:
    """A number without an upper bound takes a value accepted at start that fails later."""
    assert len(NUMBERS) > 30
    for name in NUMBERS:
        kinds = {type(bound) for bound in LadderSettings.model_fields[name].metadata}
        assert kinds & {Le, Lt} and kinds & {Ge, Gt}, name


@pytest.mark.parametrize(
    "name", [n for n in NUMBERS if LadderSettings.model_fields[n].annotation in (float, "float")]
)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", float("inf"), float("nan")])
def test_no_number_is_infinite_or_not_a_number(name: str, value: object) -> None:
    assert "finite number" in _refusal(**{name: value})


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::1", "127.0.0.1", "api.internal", "my_api"])
def test_a_host_name_or_an_address_is_listened_on(host: str) -> None:
    settings = LadderSettings(_env_file=None, api_host=host, ops_host=host)  # type: ignore[call-arg]
    assert settings.api_host == settings.ops_host == host


@pytest.mark.parametrize("seconds", [0, 1, 86_400])
def test_friend_sets_are_reconciled_at_start_only_or_a_second_apart_at_least(
    seconds: float,
) -> None:
    settings = LadderSettings(_env_file=None, friends_reconcile_seconds=seconds)  # type: ignore[call-arg]
    assert settings.friends_reconcile_seconds == seconds


def test_a_log_level_is_taken_in_any_case() -> None:
    assert LadderSettings(_env_file=None, log_level="warning").log_level == "WARNING"  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("value", "cluster", "said"),
    [
        ("redis://:secret@127.0.0.1:99999/0", False, "address 1 of 1 has a port out of 1-65535"),
        ("redis://:secret@127.0.0.1:port/0", False, "has a port that is not a number"),
        ("redis://:secret@127.0.0.1:6379/abc", False, "has a database that is not a number"),
        ("redis://:secret@127.0.0.1:6379/-1", False, "has a database that is not a number"),
        ("redis://:secret@127.0.0.1:6379/?db=x", False, "has a database (db=) that is not a"),
        ("redis://:secret@127.0.0.1:6379/2147483647", False, "database index above 2147483646"),
        ("redis://:secret@/0", False, "address 1 of 1 names no host"),
        ("redis://:secret@bad host:6379/0", False, "neither a host name nor an IP address"),
        ("redis://:secret@[::1/0", False, "cannot be read as a URL"),
        ("unix://:secret@", False, "names no socket path"),
        ("redis://:secret@h:6379/0?socket_timeout=soon", False, "option redis-py cannot read"),
        ("redis://:secret@h:6379/0,", True, "address 2 of 2 is empty"),
        ("redis://:secret@h:7000/1", True, "a database other than 0"),
        ("redis://:secret@h:7000/0,redis://i/0", True, "address 2 of 2 names no port"),
        ("unix:///tmp/redis.sock", True, "a Redis Cluster's nodes are redis:// or rediss://"),
    ],
)
def test_a_bad_redis_url_is_refused_saying_which_part(value: str, cluster: bool, said: str) -> None:
    message = _refusal(redis_url=value, redis_cluster=cluster)
    assert said in message and "(LADDER_REDIS_URL)" in message
    assert "secret" not in message


@pytest.mark.parametrize(
    ("value", "cluster", "kept"),
    [
        (" redis://:pw@h:6379/3 ", False, "redis://:pw@h:6379/3"),
        ("rediss://h/", False, "rediss://h/"),
        ("redis://[::1]:6379/0?db=2&socket_timeout=5", False, None),
        ("unix:///run/redis.sock?db=1", False, None),
        ("redis://a:7000/0, redis://b:7001", True, "redis://a:7000/0,redis://b:7001"),
    ],
)
def test_a_good_redis_url_is_taken(value: str, cluster: bool, kept: str | None) -> None:
    settings = LadderSettings(_env_file=None, redis_url=value, redis_cluster=cluster)  # type: ignore[call-arg]
    assert settings.redis_url == (kept or value)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("mysql+asyncmy://root:secret@127.0.0.1:99999/ladder", "has a port out of 1-65535"),
        ("mysql+asyncmy://root:secret@127.0.0.1:0/ladder", "has a port out of 1-65535"),
        ("mysql+asyncmy://root:secret@127.0.0.1:abc/ladder", "has a port that is not a number"),
        ("mysql+asyncmy://root:secret@/ladder", "names no host"),
        ("mysql+asyncmy://", "names no host"),
        ("mysql+asyncmy://root:secret@[bad/ladder", "neither a host name nor an IP address"),
        ("mysql+asyncmy://root:secret@127.0.0.1:3306/", "names no database"),
        ("mysql+asyncmy://root:secret@127.0.0.1/" + "d" * 65, "more than 64 characters"),
        ("mysql+pymysql://root:secret@127.0.0.1/ladder", "scheme mysql+asyncmy"),
        ("not a url at all, secret", "cannot be read as a URL"),
        # Options asyncmy's connect would refuse with a TypeError or a ValueError, every time.
        ("mysql+asyncmy://r:secret@h/d?conect_timeout=5", "does not take: 'conect_timeout'"),
        ("mysql+asyncmy://r:secret@h/d?connect_timeout=5s", "cannot take: 'connect_timeout'"),
    ],
)
def test_a_bad_mysql_url_is_refused_saying_which_part(value: str, said: str) -> None:
    message = _refusal(mysql_url=value)
    assert said in message and "(LADDER_MYSQL_URL)" in message
    assert "secret" not in message


@pytest.mark.parametrize(
    "value",
    [
        "mysql+asyncmy://ladder:pw@mysql:3306/ladder",
        "mysql+asyncmy://root@[::1]/ladder?charset=utf8mb4",
        "mysql+asyncmy://root@/ladder?unix_socket=/run/mysqld/mysqld.sock",
        "mysql+asyncmy://ladder:pw@mysql/ladder?connect_timeout=5&ssl_ca=/etc/ca.pem",
    ],
)
def test_a_good_mysql_url_is_taken(value: str) -> None:
    assert LadderSettings(_env_file=None, mysql_url=value).mysql_url == value  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("not-an-ip", "entry 1 of 1 ('not-an-ip') is not an IP address or network"),
        ("127.0.0.1,10.0.0.0/33", "entry 2 of 2 ('10.0.0.0/33') is not an IP address or network"),
        ("10.0.0.1/24", "has host bits set: the network is 10.0.0.0/24"),
        ("*,10.0.0.1", "lists '*' (every peer) among others"),
    ],
)
def test_a_proxy_that_no_peer_can_be_is_refused(value: str, said: str) -> None:
    message = _refusal(forwarded_allow_ips=value)
    assert said in message and "(LADDER_FORWARDED_ALLOW_IPS)" in message


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        ("", []),
        ("*", ["*"]),
        ("10.0.0.0/8, fd00::/8,192.0.2.7", ["10.0.0.0/8", "fd00::/8", "192.0.2.7"]),
    ],
)
def test_proxies_by_address_or_network_are_taken(value: str, taken: list[str]) -> None:
    settings = LadderSettings(_env_file=None, forwarded_allow_ips=value)  # type: ignore[call-arg]
    assert settings.forwarded_allow_ips == taken


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("not a url", "('not a url') is not scheme://host"),
        ("game.example", "is not scheme://host"),
        ("https://game.example/play", "has a path, a query or a fragment"),
        ("https://game.example?x=1", "has a path, a query or a fragment"),
        ("https://game.example#top", "has a path, a query or a fragment"),
        ("https://me@game.example", "holds user information"),
        ("https://game.example:99999", "has a port out of 1-65535"),
        ("https://*.example", "neither a host name nor an IP address"),
    ],
)
def test_an_origin_no_browser_sends_is_refused(value: str, said: str) -> None:
    message = _refusal(allowed_origins=f"https://ok.example,{value}")
    assert f"entry 2 of 2 {said}" in message or said in message
    assert "(LADDER_ALLOWED_ORIGINS)" in message


def test_origins_are_written_as_a_browser_sends_them() -> None:
    listed = "https://Game.Example/,http://localhost:3000/,https://a.example:443,http://b:80,*"
    settings = LadderSettings(_env_file=None, allowed_origins=listed)  # type: ignore[call-arg]
    assert settings.allowed_origins == [
        "https://game.example",
        "http://localhost:3000",
        "https://a.example",
        "http://b",
        "*",
    ]


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_invalid_settings_are_one_json_log_line_naming_them() -> None:
    done = _python(
        "from shared.settings import load_settings; load_settings('aggregator')",
        {
            "LADDER_REDIS_URL": "redis://:secret@127.0.0.1:6379/abc",
            "LADDER_MERGE_INTERVAL": "inf",
        },
    )
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    logged = json.loads(line)
    assert logged["message"] == (
        "invalid settings: address 1 of 1 has a database that is not a number (the path: /0 to "
        "/15 on a default Redis) (LADDER_REDIS_URL); Input should be a finite number "
        "(LADDER_MERGE_INTERVAL)"
    )
    assert logged["settings"] == ["LADDER_REDIS_URL", "LADDER_MERGE_INTERVAL"]
    assert (logged["level"], logged["service"], logged["logger"]) == (
        "error",
        "aggregator",
        "shared.settings",
    )
    assert "timestamp" in logged
    assert "secret" not in done.stderr


def test_a_settings_file_that_is_not_utf_8_is_one_json_log_line(tmp_path: Path) -> None:
    """A .env written in another encoding: status 2 and one line, not a traceback."""
    (tmp_path / ".env").write_bytes(b"LADDER_JWT_SECRET=caf\xe9\n")
    done = subprocess.run(
        [sys.executable, "-c", "from shared.settings import load_settings; load_settings('api')"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    logged = json.loads(line)
    assert logged["message"].startswith("invalid settings: the settings file .env cannot be read")
    assert (logged["level"], logged["service"]) == ("error", "api")


@pytest.mark.skipif(ON_CLUSTER, reason="a Redis Cluster has database 0 only")
async def test_a_database_the_redis_server_has_not_is_refused_naming_the_setting() -> None:
    beyond = REDIS_URL.rsplit("/", 1)[0] + "/1000000"
    with pytest.raises(SettingsError, match="LADDER_REDIS_URL names a database"):
        async with open_redis(beyond, wait=True):
            pass


@pytest.mark.skipif(ON_CLUSTER, reason="a Redis Cluster has database 0 only")
def test_a_service_given_such_a_database_stops_with_one_line() -> None:
    code = (
        "from shared.service import run\n"
        "from shared.redis import open_redis\n"
        "async def main(settings):\n"
        "    async with open_redis(settings.redis_url, wait=True):\n"
        "        pass\n"
        "run('aggregator', main)\n"
    )
    done = _python(code, {"LADDER_REDIS_URL": REDIS_URL.rsplit("/", 1)[0] + "/1000000"})
    assert done.returncode == 2
    [line] = done.stdout.splitlines()
    logged = json.loads(line)
    assert logged["message"].startswith("invalid settings: LADDER_REDIS_URL names a database")
    assert "exception" not in logged


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


@pytest.mark.parametrize("setting", ["LADDER_SERVER_KEYS", "LADDER_ADMIN_KEYS"])
def test_a_key_no_authorization_header_carries_is_refused_by_its_position(setting: str) -> None:
    # The API reads the header's bytes as Latin-1: a key with an accent or a non-breaking
    # space, sent as a client's UTF-8, would never match it.
    secret = "clé-" + "s" * 40
    done = _python(
        "from shared.settings import load_settings; load_settings('api')",
        {setting: f"{'k' * 40}, {secret}"},
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    logged = json.loads(line)
    assert logged["settings"] == [setting]
    assert "key 2 of 2 holds a character that is not printable ASCII" in logged["message"]
    assert "clé" not in done.stderr and "sss" not in done.stderr
