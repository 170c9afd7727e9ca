"""Why a handler failed: the outage of something it needs (transient), or the events themselves.

The consumer runner (:mod:`shared.consumer`) asks :func:`is_transient` about every exception a
handler raises. A transient failure is about the system: a connection refused or lost, a
timeout, a server loading, read-only, out of memory, a lock wait or deadlock, a schema or
privilege that is not there (yet). Retrying the same events later will work once it is fixed,
so the runner holds the batch and retries it, and nothing counts toward dead-lettering. Any
other failure is about the events: MySQL refusing a value (a constraint, a value out of range),
a Redis script refusing its arguments, the handler's own code raising on them. Those events
will fail however often they are retried, so the runner finds which ones and lets the queue
dead-letter them.

When in doubt about a database error, it is transient: a refused event costs one message held
until someone looks, while an outage taken for refusals would dead-letter everything in flight.
"""

from __future__ import annotations

import re

from redis import exceptions as redis_errors
from sqlalchemy import exc as sa

# MySQL and MariaDB error numbers that say the row itself is refused, beyond the driver's
# IntegrityError and DataError classes: asyncmy raises them as OperationalError.
REFUSED_ROW_CODES = frozenset(
    {
        1292,  # ER_TRUNCATED_WRONG_VALUE: a value that is not a valid date, number...
        1690,  # ER_DATA_OUT_OF_RANGE: arithmetic out of a column type's range
        3819,  # ER_CHECK_CONSTRAINT_VIOLATED (MySQL 8)
        4025,  # ER_CONSTRAINT_FAILED: a CHECK constraint (MariaDB)
    }
)

_REDIS_TRANSIENT = (
    redis_errors.ConnectionError,  # refused, reset, auth, LOADING (BusyLoadingError)
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,  # a replica promoted under us
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
    # A cluster whose slots keep moving past the client's redirections (TTL exhausted), no node
    # reachable, a slot no node serves (SlotNotCoveredError): a cluster in failover or forming.
    redis_errors.ClusterError,
    redis_errors.RedisClusterException,
    redis_errors.OutOfMemoryError,
    redis_errors.NoPermissionError,
    redis_errors.NoScriptError,
)
# Error replies about the server's state rather than the command's arguments.
_REDIS_TRANSIENT_REPLIES = (
    "busy",  # a script or function runs too long
    "loading",
    "masterdown",
    "noreplicas",
    "function not found",  # the library is gone with the data (a Redis restarted empty)
)


def _redis_reply(error: redis_errors.ResponseError) -> str:
    """The server's error reply, lower case. redis-py gives a pipeline's error after a
    description of the command that met it, ``Command # 1 (FCALL ...) of pipeline caused error:
    ('Function not found',)``, the asyncio client with the reply as a tuple: the reply is what
    follows the last "caused error: " (the command's own arguments come before it)."""
    text = str(error)
    _, said, reply = text.rpartition("caused error: ")
    if said and text.startswith("Command # "):
        text = reply.lstrip("('\"")
    return text.lower()


def _mysql_code(error: sa.DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _one_is_transient(error: BaseException) -> bool:
    if isinstance(error, sa.DBAPIError):
        if error.connection_invalidated or isinstance(error, sa.InterfaceError):
            return True
        if isinstance(error, (sa.IntegrityError, sa.DataError)):
            return False
        return _mysql_code(error) not in REFUSED_ROW_CODES
    if isinstance(error, (sa.DisconnectionError, sa.TimeoutError)):
        return True
    if isinstance(error, (OSError, TimeoutError, *_REDIS_TRANSIENT)):
        return True
    if isinstance(error, redis_errors.ResponseError):
        return _redis_reply(error).startswith(_REDIS_TRANSIENT_REPLIES)
    return False


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it, or one of a group's) is an outage rather than a
    refusal of the events; see the module's docstring."""
    if isinstance(error, BaseExceptionGroup):
        return any(is_transient(inner) for inner in error.exceptions)
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if _one_is_transient(current):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


# Anything that looks like an address with a scheme (it may carry a password), and a user and
# password before an @ without one.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_CREDENTIALS = re.compile(r"[^\s'\"/@:]+:[^\s'\"/@]+@")
# A server's address as drivers write it in their errors: a ('host', port) pair (asyncio's and
# asyncmy's), a host:port (redis-py's "connecting to ..."), an IP literal, a quoted host after
# "on" or "host" (MySQL's "server on 'db'", "Unknown MySQL server host 'db'").
_ADDRESS = re.compile(
    r"\(\s*'[^']*'(?:\s*,\s*\d+)+\s*\)"
    r"|\[[0-9A-Fa-f:.]+\](?::\d+)?"
    r"|(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?(?!\w|\.\d)"
    r"|(?<![\w.-])(?:localhost|(?:[A-Za-z0-9-]+\.)+[A-Za-z][A-Za-z0-9-]*):\d+\b"
    r"|(?<=\bon )'[^']*'|(?<=\bhost )'[^']*'"
)
# SQLAlchemy's pointer to its documentation, at the end of each of its errors.
_BACKGROUND = re.compile(r"\s*\(Background on this error at: [^)]*\)")
REASON_MOST = 200


def short_reason(error: BaseException) -> str:
    """``error`` as a short line for ``/readyz`` (its class and message, at most
    ``REASON_MOST`` characters), with no address in it: none that could carry a password, and
    no server's host or port (``/readyz`` answers anyone who can reach it)."""
    text = _BACKGROUND.sub("", " ".join(str(error).split()))
    text = _ADDRESS.sub("<address>", _CREDENTIALS.sub("", _URL.sub("<address>", text)))
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= REASON_MOST else line[: REASON_MOST - 1] + "…"
