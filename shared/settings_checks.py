"""The checks of ``LADDER_*`` settings that a bound on a number cannot make (shared/settings.py):
a period that is 0 or a second at least, the keys, the hosts the services listen on, the
Redis, RabbitMQ and MySQL URLs, the trusted proxies and the browser origins.

Each function takes a setting's value and gives it back (normalised where its docstring says
so), or raises :class:`ValueError` with a message saying which part is wrong; pydantic puts the
setting's name after it. A URL is never quoted in a message, since it may hold a password: an
entry of a list is named by its position. Addresses, networks and origins, which hold no
secret, are quoted.

:func:`reachable_host` is the other way round: how a client on this machine names, in a URL, a
host a service listens on.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated
from urllib.parse import SplitResult, parse_qs, urlsplit

from pydantic import AfterValidator

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

MAX_REDIS_DATABASE = 2**31 - 2
"""The highest database index a Redis server can have (its ``databases`` is at most 2**31 - 1);
whether the server at hand has it (16 databases by default) is seen when a service connects
(shared/redis.py)."""

MAX_MYSQL_NAME = 64
"""The longest name MySQL and MariaDB give a database."""

# A host name: dot-separated labels of letters, digits, '-' and '_' (compose service names
# have them), no label starting or ending with '-'; a final dot allowed.
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_DIGITS = re.compile(r"[0-9]+")
_DATABASE_PATH = re.compile(r"/([0-9]+)/?")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def off_or_seconds(value: float) -> float:
    """The period of a pass that may be turned off: 0 (off), or a second at least, since a
    shorter one would run its pass again and again (the snapshots' period is bounded below for
    the same reason)."""
    if 0 < value < 1:
        raise ValueError(
            "is neither 0 (off) nor a second or more: so short a period is a busy loop"
        )
    return value


OffOrSeconds = Annotated[float, AfterValidator(off_or_seconds)]


def keys(entries: list[str]) -> list[str]:
    """Server or admin keys: printable ASCII each. A client sends a key in its
    ``Authorization`` header, which the API reads as Latin-1 bytes, so a key with another
    character (an accent, a non-breaking space) could never match. A key is named by its
    position, never quoted."""
    for position, entry in enumerate(entries, start=1):
        if not entry.isascii() or not entry.isprintable():
            raise ValueError(
                f"key {position} of {len(entries)} holds a character that is not printable "
                "ASCII, which no Authorization header carries as the key"
            )
    return entries


def is_host(value: str) -> bool:
    """``value`` is an IP address (IPv6 without brackets) or a host name."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return len(value) <= 253 and _HOST_NAME.fullmatch(value) is not None
    return True


def listen_host(value: str) -> str:
    """Where a service listens: a host name or an IP address; never empty, which uvicorn would
    take for every interface (0.0.0.0 or :: say that, on purpose)."""
    if not value:
        raise ValueError(
            "is empty: name a host or an IP address (0.0.0.0 or :: for every interface)"
        )
    if not is_host(value):
        raise ValueError(f"{value!r} is neither an IP address nor a host name")
    return value


def reachable_host(host: str) -> str:
    """The host of a URL that reaches, from this machine, a service listening on ``host``
    (:func:`listen_host`): loopback for every interface (0.0.0.0 or ::), and an IPv6 address
    in brackets, without which its colons would be read as the port's."""
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _split(entry: str) -> SplitResult | str:
    try:
        return urlsplit(entry)
    except ValueError:  # a '[' without its ']'
        return "cannot be read as a URL"


def _port_problem(url: SplitResult) -> str | None:
    """What is wrong with the port of ``url``, read from the text (urllib's ``port`` takes
    '+1', ' 1' and '٣' for numbers)."""
    address = url.netloc.rpartition("@")[2]
    if address.startswith("["):
        address = address.partition("]")[2]
    text = address.partition(":")[2] if ":" in address else ""
    if not text:
        return None
    if not _DIGITS.fullmatch(text):
        return "has a port that is not a number"
    if not 1 <= int(text) <= 65535:
        return "has a port out of 1-65535"
    return None


def _address_problem(url: SplitResult) -> str | None:
    """The host and port of a URL: there, and well formed."""
    problem = _port_problem(url)
    if problem:
        return problem
    if not url.hostname:
        return "names no host"
    if not is_host(url.hostname):
        return "has a host that is neither a host name nor an IP address"
    return None


def _entries(value: str, nothing: str) -> list[str]:
    entries = [part.strip() for part in value.split(",")]
    if not any(entries):
        raise ValueError(nothing)
    return entries


def amqp_urls(value: str) -> str:
    """One broker address or several, comma-separated; given back without the spaces around
    each."""
    entries = _entries(value, "names no broker address")
    for position, entry in enumerate(entries, start=1):
        where = f"address {position} of {len(entries)}"
        url = _split(entry) if entry else "is empty"
        if isinstance(url, str):
            raise ValueError(f"{where} {url}")
        if url.scheme not in ("amqp", "amqps"):
            raise ValueError(f"{where} is not an amqp:// or amqps:// URL")
        problem = _address_problem(url) or _amqp_options_problem(url)
        if problem:
            raise ValueError(f"{where} {problem}")
    return ",".join(entries)


# aiormq takes the first seven for true and any other word for false; here only the last seven
# are false, so that a word it would misread is refused.
_BOOLEAN_WORDS = frozenset(
    {"true", "yes", "y", "on", "enable", "enabled", "1"}
    | {"false", "no", "n", "off", "disable", "disabled", "0"}
)


def _seconds(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and float(text) >= 0
    except ValueError:
        return False


# The options aio-pika and aiormq read from an AMQP address's query string, each with the form
# it must have. They take a value they cannot read for a default without a word
# (``heartbeat=30s``: no heartbeats at all; ``no_verify_ssl=false``: no certificate check) and
# skip a name they do not know, so such an address is refused here.
_AMQP_OPTIONS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "heartbeat": (
        "whole seconds below 65535",
        lambda v: bool(_DIGITS.fullmatch(v)) and int(v) < 65535,
    ),
    "timeout": ("whole seconds", lambda v: bool(_DIGITS.fullmatch(v))),
    "interleave": ("a whole number", lambda v: bool(_DIGITS.fullmatch(v))),
    "reconnect_interval": ("seconds, 0 or more", _seconds),
    "happy_eyeballs_delay": ("seconds, 0 or more", _seconds),
    "fail_fast": ("true or false", lambda v: v.lower() in _BOOLEAN_WORDS),
    "no_verify_ssl": ("0 or 1", lambda v: v in ("0", "1")),
    "auth": ("plain or external", lambda v: v.lower() in ("plain", "external")),
    **{
        name: ("", lambda v: True)
        for name in ("name", "cafile", "capath", "cadata", "keyfile", "certfile")
    },
}


def _amqp_options_problem(url: SplitResult) -> str | None:
    """What aio-pika would misread among the options of ``url``; the option is named, never its
    value."""
    for name, values in parse_qs(url.query, keep_blank_values=True).items():
        if name not in _AMQP_OPTIONS:
            return f"has an option aio-pika does not read: {name!r}"
        form, valid = _AMQP_OPTIONS[name]
        if not all(valid(value) for value in values):
            return f"has an option aio-pika would misread: {name!r} ({form})"
    return None


def redis_urls(value: str, cluster: bool) -> str:
    """One Redis address, or with ``cluster`` one node of a Redis Cluster or several,
    comma-separated; given back without the spaces around each. A database is a number
    (redis-py takes a path it cannot read for database 0), and 0 on a cluster, which has no
    other."""
    entries = _entries(value, "names no Redis address")
    for position, entry in enumerate(entries, start=1):
        problem = _redis_problem(entry, cluster, first=position == 1)
        if problem:
            raise ValueError(f"address {position} of {len(entries)} {problem}")
    return ",".join(entries)


def _redis_problem(entry: str, cluster: bool, *, first: bool) -> str | None:
    url = _split(entry) if entry else "is empty"
    if isinstance(url, str):
        return url
    if url.scheme == "unix":
        if cluster:
            return "is a unix:// socket: a Redis Cluster's nodes are redis:// or rediss:// URLs"
        if not url.path:
            return "names no socket path"
    elif url.scheme in ("redis", "rediss"):
        problem = _address_problem(url)
        if problem:
            return problem
        if cluster and not first and url.port is None:
            return "names no port (each node after the first needs its own)"
    else:
        return "is not a redis://, rediss:// or unix:// URL"
    return _database_problem(url, cluster) or _options_problem(entry)


def _database_problem(url: SplitResult, cluster: bool) -> str | None:
    """The database: ``?db=N``, or else the path of a redis:// URL (``/N``)."""
    asked = parse_qs(url.query).get("db")
    if asked:
        text = asked[0]
    elif url.scheme != "unix" and url.path not in ("", "/"):
        found = _DATABASE_PATH.fullmatch(url.path)
        if found is None:
            return "has a database that is not a number (the path: /0 to /15 on a default Redis)"
        text = found.group(1)
    else:
        return None
    if not _DIGITS.fullmatch(text):
        return "has a database (db=) that is not a number"
    if int(text) > MAX_REDIS_DATABASE:
        return f"has a database index above {MAX_REDIS_DATABASE}"
    if cluster and int(text) != 0:
        return "names a database other than 0, which a Redis Cluster has not"
    return None


def _options_problem(entry: str) -> str | None:
    """The URL's options (``?socket_timeout=5``) as redis-py reads them; its message names the
    option, never the URL."""
    from redis.asyncio.connection import parse_url

    try:
        parse_url(entry)
    except ValueError as error:
        return f"has an option redis-py cannot read: {error}"
    return None


def mysql_url(value: str) -> str:
    """The history database: ``mysql+asyncmy://user:password@host:port/database``, read as
    SQLAlchemy reads it (a ``?unix_socket=`` path may stand for the host)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value.strip())
    except ValueError:  # SQLAlchemy's int() of the port
        raise ValueError("has a port that is not a number") from None
    except ArgumentError:
        raise ValueError(
            "cannot be read as a URL (mysql+asyncmy://user:password@host:port/database)"
        ) from None
    if url.drivername != "mysql+asyncmy":
        raise ValueError("must be a URL of scheme mysql+asyncmy")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError("has a port out of 1-65535")
    if not url.host and "unix_socket" not in url.query:
        raise ValueError("names no host")
    if url.host and not is_host(url.host):
        raise ValueError("has a host that is neither a host name nor an IP address")
    if not url.database:
        raise ValueError("names no database (the path after the host: /ladder)")
    if len(url.database) > MAX_MYSQL_NAME:
        raise ValueError(f"names a database of more than {MAX_MYSQL_NAME} characters")
    problem = _driver_options_problem(url)
    if problem:
        raise ValueError(problem)
    return value.strip()


def _driver_options_problem(url: URL) -> str | None:
    """The URL's options (``?connect_timeout=5``) as SQLAlchemy hands them to asyncmy: each must
    be one asyncmy's ``connect`` takes, of a value SQLAlchemy can convert (a number where it
    wants one), or every connection would fail with a TypeError or a ValueError. The option is
    named, never its value."""
    import inspect

    import asyncmy

    taken = inspect.signature(asyncmy.connect).parameters
    dialect = url.get_dialect()()
    for name in sorted(url.query):
        try:
            _, given = dialect.create_connect_args(url.set(query={name: url.query[name]}))
        except (TypeError, ValueError):
            return f"has an option whose value asyncmy cannot take: {name!r}"
        unknown = sorted(set(given) - set(taken))
        if unknown:
            return f"has an option asyncmy does not take: {unknown[0]!r}"
    return None


def proxies(entries: list[str]) -> list[str]:
    """The peers trusted to name the client in ``X-Forwarded-For``: IP addresses and networks
    (``10.0.0.0/8``), or ``*`` alone. uvicorn takes anything else for a name that no TCP peer
    ever has, and ``*`` among others for such a name too."""
    if "*" in entries and len(entries) > 1:
        raise ValueError("lists '*' (every peer) among others: give '*' alone, or no '*'")
    for position, entry in enumerate(entries, start=1):
        where = f"entry {position} of {len(entries)} ({entry!r})"
        if entry == "*":
            continue
        if "/" not in entry:
            try:
                ipaddress.ip_address(entry)
            except ValueError:
                raise ValueError(f"{where} is not an IP address or network") from None
            continue
        try:
            ipaddress.ip_network(entry)
        except ValueError:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{where} is not an IP address or network") from None
            raise ValueError(f"{where} has host bits set: the network is {network}") from None
    return entries


def origins(entries: list[str]) -> list[str]:
    """The browser origins allowed to open the WebSocket, as a browser's ``Origin`` header
    writes them: ``scheme://host[:port]``. A trailing ``/`` is dropped, the scheme and host
    are put in lower case and a default port (80 of http, 443 of https) is dropped; a path, a
    query, a fragment or user information is refused. ``*`` allows any origin."""
    normalised = []
    for position, entry in enumerate(entries, start=1):
        if entry == "*":
            normalised.append(entry)
            continue
        url = _split(entry)
        problem = url if isinstance(url, str) else _origin_problem(entry, url)
        if isinstance(url, str) or problem is not None:
            raise ValueError(
                f"entry {position} of {len(entries)} ({entry!r}) {problem}: an origin is "
                "scheme://host or scheme://host:port (https://game.example)"
            )
        normalised.append(_origin(url))
    return normalised


def _origin_problem(entry: str, url: SplitResult) -> str | None:
    if not _SCHEME.fullmatch(url.scheme) or not url.netloc:
        return "is not scheme://host"
    if "@" in url.netloc:
        return "holds user information"
    if url.path not in ("", "/") or "?" in entry or "#" in entry:
        return "has a path, a query or a fragment"
    return _address_problem(url)


def _origin(url: SplitResult) -> str:
    scheme, host = url.scheme.lower(), url.hostname or ""
    address = f"[{host}]" if ":" in host else host
    port = url.port
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        address = f"{address}:{port}"
    return f"{scheme}://{address}"
