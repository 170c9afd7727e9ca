"""The command line of the rebuild: ``python -m services.rebuild [--board ID ...] [--wait S]
[--restored]``.

Opens MySQL and Redis, rebuilds, and prints one summary line a board rebuilt; exits with status
1 (the reason logged) if a board could not be rebuilt, once every other board is.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Iterable

import structlog
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

from services.rebuild.rebuilder import BoardRebuild, Rebuilder, RebuildFailed
from shared.db import open_engine
from shared.db_boards import LockTimeout
from shared.failures import short_reason
from shared.keys import Keys
from shared.logs import configure
from shared.redis import open_redis
from shared.settings import LadderSettings, load_settings

log = structlog.get_logger(__name__)


async def rebuild(
    settings: LadderSettings,
    only: Iterable[str] = (),
    wait_seconds: float = 120.0,
    restored: bool = False,
) -> list[BoardRebuild]:
    """Open MySQL and Redis (loading the function library, which a Redis that lost its data
    lacks too) and rebuild (``restored``: the history database was restored from a backup)."""
    async with (
        open_engine(settings.mysql_url) as engine,
        open_redis(
            settings.redis_url, cluster=settings.redis_cluster, load_functions=True
        ) as redis,
    ):
        keys = Keys(settings.key_prefix)
        rebuilder = Rebuilder(engine, redis, keys, settings, wait_seconds, restored)
        return await rebuilder.run(only)


def summary(board: BoardRebuild) -> str:
    """The line printed for one rebuilt board."""
    return (
        f"{board.board_id}: {board.events} events, {board.journal_replayed} written "
        f"meanwhile (and {board.journal_known} more already in MySQL), {board.keys} keys, "
        f"{board.dirty} users to merge, {board.attempts} attempt(s), {board.seconds:.1f} s"
    )


def seconds(text: str) -> float:
    """A ``--wait``: a finite number of seconds, 0 or more (``nan`` would wait for ever)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, 0 or more")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.rebuild",
        description="Recreate every board in Redis exactly from the history database.",
    )
    parser.add_argument("--board", action="append", default=[], help="only this board (repeatable)")
    parser.add_argument(
        "--wait",
        type=seconds,
        default=None,
        help="seconds to wait for history to store events Redis applied already (120; 10 with "
        "--restored)",
    )
    parser.add_argument(
        "--restored",
        action="store_true",
        help="the history database was restored from a backup: events Redis applied that it "
        "still lacks after the wait are lost with it, and left out",
    )
    options = parser.parse_args(argv)
    wait = options.wait if options.wait is not None else 10.0 if options.restored else 120.0
    settings = load_settings("rebuild")
    configure("rebuild", settings.log_level)
    try:
        done = asyncio.run(rebuild(settings, options.board, wait, options.restored))
    except RebuildFailed as exc:
        for board in exc.done:
            print(summary(board))
        log.error("rebuild failed", error=str(exc))
        sys.exit(1)
    # A server that does not answer or refuses the URL: one line naming the setting to look at
    # (short_reason() leaves out the address, whose URL may hold a password), not a traceback.
    except DBAPIError as exc:
        log.error(
            "rebuild failed: the history database (LADDER_MYSQL_URL) cannot be read",
            error=short_reason(exc),
        )
        sys.exit(1)
    except RedisError as exc:
        log.error(
            "rebuild failed: Redis (LADDER_REDIS_URL) cannot be used", error=short_reason(exc)
        )
        sys.exit(1)
    # A PUT or DELETE of a board, or an API process restoring the definitions at its start, held
    # the definitions lock past its wait: nothing was changed yet, and the rebuild may be run again.
    except LockTimeout as exc:
        log.error("rebuild failed: nothing was changed; run it again", error=str(exc))
        sys.exit(1)
    for board in done:
        print(summary(board))
