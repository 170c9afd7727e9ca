"""Typed settings for every Ladder service.

Every ``LADDER_*`` variable is read here, once, at a service's entry point, and the object is
passed down. Nothing else reads or writes ``os.environ``: a library's one variable that Ladder
sets and reads (prometheus-client's multiprocess directory), and the environment handed on to a
child process, go through the helpers at the end of this module.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal, NoReturn

import structlog
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings import SettingsError as EnvFileError

from shared import settings_checks as checks
from shared.logs import configure

DEV_SERVER_KEY = "dev-server-key"
DEV_ADMIN_KEY = "dev-admin-key"
DEV_JWT_SECRET = "dev-jwt-secret"
MIN_SECRET_BYTES = 32
"""The shortest key or JWT secret prod accepts: as many bytes as 32 random bytes have entropy."""


class SettingsError(ValueError):
    """Settings that a service must not start with."""


CLOSE_GRACE = 1.0
"""Seconds past end + lateness + merge interval before a period's close starts: a write accepted
just before the lateness ran out has reached Redis (the write is one Redis call after the
check)."""

DAY = 86_400
"""Seconds in a day: the bound of the settings that delay a period's close or repeat a pass."""


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


CsvList = Annotated[list[str], NoDecode]


class LadderSettings(BaseSettings):
    """Settings shared by the four services; each reads only what it needs.

    Every number is bounded, and neither ``inf`` nor ``nan`` is a number here: a value that is
    accepted at start must not fail later (a TTL Redis refuses, a date out of range). Each
    bound's reason is in its field's description; the checks of hosts, URLs, proxies and
    origins are in shared/settings_checks.py."""

    model_config = SettingsConfigDict(
        env_prefix="LADDER_", env_file=".env", extra="ignore", frozen=True, allow_inf_nan=False
    )

    env: Literal["dev", "prod"] = "dev"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    # With LADDER_REDIS_CLUSTER, LADDER_REDIS_URL names one node of a Redis Cluster, or several,
    # comma-separated, so that a process starting while one is down finds the cluster
    # (shared/redis_cluster.py). (Before redis_url: its check reads it.)
    redis_cluster: bool = False
    redis_url: str = "redis://127.0.0.1:6379/0"
    # One broker node, or every node of a RabbitMQ cluster, comma-separated (shared/amqp.py).
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    mysql_url: str = "mysql+asyncmy://root@127.0.0.1:3306/ladder"

    # Namespaces. Tests give each run its own so that a running `make up` is never disturbed.
    key_prefix: str = Field(default="ladder", pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")
    broker_prefix: str = Field(default="ladder", pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    api_workers: int = Field(
        default=2, ge=1, le=32, description="API processes sharing the port (BENCHMARKS.md)"
    )
    aggregator_port: int = Field(default=9101, ge=1, le=65535)
    history_port: int = Field(default=9102, ge=1, le=65535)
    notifier_port: int = Field(default=9103, ge=1, le=65535)
    ops_host: str = "127.0.0.1"

    server_keys: CsvList = Field(default_factory=list)
    admin_keys: CsvList = Field(default_factory=list)
    jwt_secret: str = ""
    jwt_leeway_seconds: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="seconds of clock skew; more would honour tokens long expired",
    )
    public_reads: bool = True

    # A bucket refuses while it holds less than a token and holds at most its burst (twice the
    # rate for a user, the rate for a credential): below 0.5 and 1 not one write would pass.
    user_rate: float = Field(
        default=20.0, ge=0.5, le=1e9, description="score submissions a second (1e9: no limit)"
    )
    key_rate: float = Field(
        default=5000.0, ge=1, le=1e9, description="submissions a second a credential"
    )
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="a body is read whole"
    )

    allowed_lateness: float = Field(
        default=600.0,
        ge=0,
        le=DAY,
        description="seconds, a day at most: a period closes this long after its end (a "
        "daily board's as late as the next day), and board main's retention outlasts that",
    )
    future_tolerance_seconds: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="seconds a client's clock may lead; an hour ahead is a wrong clock or "
        "time zone, not skew",
    )
    merge_interval: float = Field(
        default=2.0,
        ge=0.1,
        le=60,
        description="seconds; a board's merge lease lasts three, which must outlast a merge, "
        "and the global view lags by up to one",
    )
    snapshot_interval: float = Field(
        default=60.0, ge=1, le=DAY, description="seconds; a snapshot pass is no busy loop"
    )
    snapshot_size: int = Field(default=100, ge=1, le=1000)
    snapshot_retention_days: int = Field(default=0, ge=0, le=36_500, description="0: for good")
    trim_interval: float = Field(default=3600.0, ge=60, le=7 * DAY, description="seconds")
    feed_length: int = Field(
        default=1000, ge=1, le=100_000, description="events a board's feed keeps in Redis's memory"
    )
    outbox_max: int = Field(
        default=100_000,
        ge=1,
        le=1_000_000_000,
        description="events Redis's memory holds for the broker",
    )
    periods_outbox_max: int = Field(
        default=100, ge=1, le=100_000, description="the newest period.closed messages a board keeps"
    )
    idempotency_ttl_seconds: int = Field(
        default=DAY,
        ge=60,
        le=366 * DAY,
        description="seconds, a year at most: every accepted event's answer stays in "
        "Redis's memory this long",
    )
    # Group commit of single score writes (services/api/write/group.py): the longest a write
    # waits for others to share its Redis round trip (0: each goes alone), and the most in one.
    write_group_ms: float = Field(default=1.0, ge=0, le=100, description="milliseconds")
    write_group_max: int = Field(default=64, ge=1, le=1000)
    # Durability across a failover (services/api/write/durable.py): a score write is answered
    # 2xx only once this many replicas of its Redis primary acknowledge it (WAIT; 0: at once),
    # within the timeout, past which it answers 503.
    redis_wait_replicas: int = Field(default=0, ge=0, le=16, description="replicas")
    redis_wait_timeout_ms: int = Field(default=1000, ge=1, le=60_000, description="milliseconds")
    relay_batch: int = Field(default=200, ge=1, le=5000)
    relay_claim_idle_ms: int = Field(
        default=15_000,
        ge=100,
        le=3_600_000,
        description="ms before another relay takes a dead one's batch",
    )
    consumer_prefetch: int = Field(default=256, ge=1, le=5000)
    history_batch: int = Field(default=500, ge=1, le=5000)
    history_flush_ms: int = Field(
        default=50, ge=1, le=60_000, description="ms a partial batch waits for more"
    )
    # A quorum queue's argument (shared/topology.py), fixed once the queues exist: RabbitMQ
    # refuses another value for them (docs/operations.md, "Changing the delivery limit"). A
    # message failed 1000 times is poison; the broker's argument is a 32-bit integer.
    delivery_limit: int = Field(default=20, ge=1, le=1000, description="redeliveries")

    ws_send_queue: int = Field(
        default=256, ge=1, le=100_000, description="messages queued for a socket"
    )
    ws_message_rate: float = Field(
        default=10.0, ge=0.5, le=1000, description="client messages a second (bursts of twice)"
    )
    # Open WebSockets an API process holds at most: from one client address, and in all. Past
    # either, a handshake is refused with 429 (services/api/push/admission.py).
    ws_max_per_ip: int = Field(
        default=200, ge=1, le=1_000_000, description="sockets per client address"
    )
    ws_max: int = Field(default=20_000, ge=1, le=1_000_000, description="sockets per API process")
    # The peers whose X-Forwarded-For names the client (uvicorn's forwarded_allow_ips): a proxy
    # in front of the API, by IP address or network. '*' alone trusts every peer; empty, none.
    forwarded_allow_ips: CsvList = Field(default_factory=lambda: ["127.0.0.1", "::1"])
    allowed_origins: CsvList = Field(default_factory=list)
    shutdown_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="seconds; a process manager's own patience "
        "(supervisord's stopwaitsecs) must outlast twice this",
    )
    # How often each API process makes the Redis friend sets what MySQL holds (a pass reads all).
    friends_reconcile_seconds: checks.OffOrSeconds = Field(
        default=300.0, ge=0, le=DAY, description="seconds: 0 (at start-up only), or 1 to a day"
    )

    @model_validator(mode="before")
    @classmethod
    def _csv(cls, data: object) -> object:
        if isinstance(data, dict):
            for field in ("server_keys", "admin_keys", "allowed_origins", "forwarded_allow_ips"):
                for name in (field, f"LADDER_{field.upper()}"):
                    if name in data:
                        data[name] = _split_csv(data[name])
        return data

    @field_validator("server_keys", "admin_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        return checks.keys(value)

    @field_validator("amqp_url")
    @classmethod
    def _amqp_addresses(cls, value: str) -> str:
        return checks.amqp_urls(value)

    @field_validator("redis_url")
    @classmethod
    def _redis_addresses(cls, value: str, info: ValidationInfo) -> str:
        return checks.redis_urls(value, cluster=bool(info.data.get("redis_cluster")))

    @field_validator("mysql_url")
    @classmethod
    def _mysql_address(cls, value: str) -> str:
        return checks.mysql_url(value)

    @field_validator("api_host", "ops_host")
    @classmethod
    def _hosts(cls, value: str) -> str:
        return checks.listen_host(value)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        return checks.proxies(value)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        return checks.origins(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_capitals(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def close_delay(self) -> float:
        """Seconds after a period's end before the aggregator closes it: the lateness a write
        may have, a merge interval, and :data:`CLOSE_GRACE`."""
        return self.allowed_lateness + self.merge_interval + CLOSE_GRACE

    @property
    def amqp_urls(self) -> list[str]:
        """Every broker address of ``LADDER_AMQP_URL``, in order: one for a single node. (A
        property, not cached: a copy with another ``amqp_url`` must not inherit a cached
        list.)"""
        return self.amqp_url.split(",")

    @model_validator(mode="after")
    def _one_redis_unless_a_cluster(self) -> LadderSettings:
        if "," in self.redis_url and not self.redis_cluster:
            raise SettingsError(
                "LADDER_REDIS_URL lists several nodes: only a Redis Cluster has several "
                "(set LADDER_REDIS_CLUSTER=true)"
            )
        return self

    @model_validator(mode="after")
    def _refuse_dev_secrets_in_prod(self) -> LadderSettings:
        if self.env != "prod":
            return self
        problems = []
        if not self.server_keys:
            problems.append("LADDER_SERVER_KEYS is not set")
        if not self.admin_keys:
            problems.append("LADDER_ADMIN_KEYS is not set")
        if not self.jwt_secret:
            problems.append("LADDER_JWT_SECRET is not set")
        if DEV_SERVER_KEY in self.server_keys or DEV_ADMIN_KEY in self.server_keys:
            problems.append("LADDER_SERVER_KEYS holds a development key")
        if DEV_ADMIN_KEY in self.admin_keys or DEV_SERVER_KEY in self.admin_keys:
            problems.append("LADDER_ADMIN_KEYS holds a development key")
        if self.jwt_secret == DEV_JWT_SECRET:
            problems.append("LADDER_JWT_SECRET is the development secret")
        elif self.jwt_secret and len(self.jwt_secret.encode()) < MIN_SECRET_BYTES:
            problems.append(f"LADDER_JWT_SECRET is shorter than {MIN_SECRET_BYTES} bytes")
        for name, keys in (
            ("LADDER_SERVER_KEYS", self.server_keys),
            ("LADDER_ADMIN_KEYS", self.admin_keys),
        ):
            # Which key is short is said by its position, never by the key itself.
            short = [
                str(i + 1) for i, key in enumerate(keys) if len(key.encode()) < MIN_SECRET_BYTES
            ]
            if short:
                problems.append(
                    f"{name}: key {', '.join(short)} of {len(keys)} is shorter than "
                    f"{MIN_SECRET_BYTES} bytes"
                )
        if problems:
            raise SettingsError("LADDER_ENV=prod refuses to start: " + "; ".join(problems))
        return self

    @cached_property
    def effective_server_keys(self) -> frozenset[str]:
        """Server keys in force: the configured ones, or the dev default in dev."""
        if self.server_keys or self.env == "prod":
            return frozenset(self.server_keys)
        return frozenset({DEV_SERVER_KEY})

    @cached_property
    def effective_admin_keys(self) -> frozenset[str]:
        if self.admin_keys or self.env == "prod":
            return frozenset(self.admin_keys)
        return frozenset({DEV_ADMIN_KEY})

    @cached_property
    def effective_jwt_secret(self) -> str:
        return self.jwt_secret or DEV_JWT_SECRET

    @property
    def uses_dev_defaults(self) -> list[str]:
        """Names of the credentials that fell back to development defaults."""
        used = []
        if not self.server_keys:
            used.append("server key")
        if not self.admin_keys:
            used.append("admin key")
        if not self.jwt_secret:
            used.append("JWT secret")
        return used if self.env == "dev" else []


def load_settings(service: str = "ladder") -> LadderSettings:
    """The settings of ``service``, for an entry point: settings it must not start with end
    the process with status 2 and one JSON log line (on stderr, with the fields of the
    service's other lines) whose message names every problem and its setting."""
    try:
        return LadderSettings()
    except ValidationError as exc:
        problems = "; ".join(
            str(e["msg"]).removeprefix("Value error, ")
            + ("" if not e["loc"] else f" (LADDER_{str(e['loc'][0]).upper()})")
            for e in exc.errors(include_url=False)
        )
        named = list(dict.fromkeys(re.findall(r"\bLADDER_[A-Z0-9_]+", problems)))
        _refuse(service, f"invalid settings: {problems}", settings=named)
    except (UnicodeDecodeError, OSError, EnvFileError) as exc:
        # The .env file is not UTF-8 text, cannot be read (a directory, no permission), or holds
        # a value its parser refuses.
        _refuse(service, f"invalid settings: the settings file .env cannot be read: {exc}")


def _refuse(service: str, message: str, **fields: Any) -> NoReturn:
    """End the process with status 2 and ``message`` as one JSON log line on stderr."""
    configure(service, "INFO", stream=sys.stderr)
    structlog.get_logger(__name__).error(message, **fields)
    raise SystemExit(2) from None


# prometheus-client reads this variable itself, once, when it is first imported: a process
# whose samples are to be summed with others' must find it in its environment at start.
PROMETHEUS_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def share_multiprocess_metrics_dir(path: str) -> None:
    """Have the processes started from now on keep their metrics in files under ``path``."""
    os.environ[PROMETHEUS_MULTIPROC_DIR] = path


def multiprocess_metrics_dir() -> str | None:
    """Where this process and its siblings keep their metrics, if they share them."""
    return os.environ.get(PROMETHEUS_MULTIPROC_DIR) or None


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``extra`` on top, for a child configured by variables
    (the bench's wrk scripts read ``BENCH_USERS``, ``BENCH_RUN`` and the like; what a user set is
    passed through)."""
    return {**os.environ, **extra}
