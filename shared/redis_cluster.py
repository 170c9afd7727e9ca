"""Redis Cluster: redis-py's asyncio ``RedisCluster``, with what Ladder needs of it.

- A function call goes to the primary of its first key's slot (every key of a call shares the
  board's hash tag), found from the key itself: redis-py would otherwise ask a node for the
  call's keys (``COMMAND GETKEYS``) twice for every ``FCALL``.
- The function library is loaded on every primary at start (``FUNCTION LOAD`` goes to each), and
  again when a node answers that a function is missing (a primary that joined empty): the call
  is then made once more. In a pipeline only the calls that failed so are made again (one by
  one); a transaction is not made again (its other commands ran), the error reaches its caller,
  whose next attempt finds the library.
- A PUBLISH goes to the primary of its channel's slot, alone or in a pipeline (redis-py's
  cluster pipeline refuses one, and its client asks a node for a PUBLISH's keys).
- A pipeline that redis-py sends again after a connection was lost as it was sent makes again
  only the commands nothing came back for (redis-py took a falsy reply, such as a ``PUBLISH``
  answered 0, for none, and published or wrote twice).
- ``WAIT`` after a pipeline's writes (``LADDER_REDIS_WAIT_REPLICAS``) goes to each primary that
  takes some of them, last in that primary's commands: redis-py sends a pipeline's commands for
  one node on one connection, in their order, and ``WAIT`` counts the replicas that hold what
  its own connection wrote. A write sent again elsewhere (its slot moved, or the library was
  missing), or a pipeline redis-py sent again after a connection was lost as it was sent (its
  waits then go to the default node), is not covered by those: the pipeline says so, and
  its caller counts it unconfirmed.
- ``MOVED``, ``ASK`` and ``TRYAGAIN``, and a node that is gone, are redis-py's: it refreshes its
  slot map and sends the command where the slot is now (an ``ASK`` to a node it does not know
  yet, one that joined empty and is taking its first slot, is followed too: ``get_node``). A
  command it gives up on while its slot moves (``TRYAGAIN`` for more than half a second) is
  sent again for up to ``SLOT_MOVE_WAIT``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Connection
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.cluster import PRIMARY
from redis.exceptions import (
    AskError,
    ClusterError,
    MovedError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)

FUNCTION_CALLS = frozenset({"FCALL", "FCALL_RO"})
SLOT_MOVE_WAIT = 10.0
"""Seconds a command is sent again while its slot moves to another primary."""


def function_missing(exc: BaseException) -> bool:
    """Whether a node answered that a function is not loaded there."""
    return isinstance(exc, ResponseError) and "function not found" in str(exc).lower()


class LadderCluster(RedisCluster):
    """``RedisCluster`` routing function calls by their first key, reloading the library on a
    node that lacks it."""

    library: str = ""
    """The library's source (shared.redis.library_source), set by shared.redis.open_redis."""

    def use_connection_class(self, connection_class: type[Connection]) -> None:
        """Make every node's connections of ``connection_class`` (``RedisCluster`` takes none:
        it makes them plain ``Connection`` objects), the nodes known now and those found later."""
        self.connection_kwargs["connection_class"] = connection_class
        self.nodes_manager.connection_kwargs["connection_class"] = connection_class
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = connection_class

    async def _determine_slot(self, command: str, *args: Any) -> int:
        # args: the function's name, the number of keys, the keys, the arguments.
        name = command.upper()
        if name in FUNCTION_CALLS and len(args) > 2 and int(args[1]) > 0:
            return self.keyslot(args[2])
        if name == "PFCOUNT" and len({self.keyslot(key) for key in args}) == 1:
            return self.keyslot(args[0])
        if name == "PUBLISH":
            # Any node serves a PUBLISH (it reaches every node's subscribers): the channel's
            # slot spreads them over the primaries, and follows a slot that moves.
            return self.keyslot(args[0])
        slot: int = await super()._determine_slot(command, *args)
        return slot

    def get_node(
        self, host: str | None = None, port: int | None = None, node_name: str | None = None
    ) -> ClusterNode | None:
        """The node of that address; one looked up by its name alone and not known yet is added
        as a primary. redis-py follows an ``ASK`` to the node it names by looking it up so, and
        the node a slot is being imported into is not in the slot map while it serves no slot
        (a primary just added, as a resharding onto it begins): the command then failed with
        ``AttributeError`` instead of being sent there."""
        node = super().get_node(host, port, node_name)
        if node is not None or host is not None or port is not None or not node_name:
            return node
        address, _, number = node_name.rpartition(":")
        if not (address and number.isdigit()):
            return None
        manager = self.nodes_manager
        node = ClusterNode(address, int(number), PRIMARY, **manager.connection_kwargs)
        manager.set_nodes(manager.nodes_cache, {node.name: node})
        return node

    async def load_library(self) -> None:
        """Load the library on each primary that has none (one that joined empty, or a replica
        promoted before the library reached it), never over one that has it: that may be a newer
        release's, whose function names (shared/functions.py) this process's calls do not find,
        and which this process must not undo in a rolling upgrade; those calls then fail, as on
        one Redis. (A process loads its own library over every primary once, at its start:
        shared.redis.open_redis.)"""
        for node in self.get_primaries():
            try:
                await super().execute_command("FUNCTION LOAD", self.library, target_nodes=node)
            except ResponseError as exc:
                if "already exists" not in str(exc).lower():
                    raise

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._redirected(*args, **kwargs)
        except ResponseError as exc:
            if not (self.library and function_missing(exc)):
                raise
        await self.load_library()
        return await self._redirected(*args, **kwargs)

    async def _redirected(self, *args: Any, **kwargs: Any) -> Any:
        """The command, sent again while its slot moves: redis-py gives up after sixteen
        redirections (``TTL exhausted``: about half a second of ``TRYAGAIN``, which a call of
        several keys gets until the last of them has moved), none of which ran it."""
        deadline = time.monotonic() + SLOT_MOVE_WAIT
        while True:
            try:
                return await super().execute_command(*args, **kwargs)
            except ClusterError as exc:
                if "TTL exhausted" not in str(exc) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)
        return LadderClusterPipeline(self, transaction)  # type: ignore[abstract]

    def node_urls(self, url: str) -> list[str]:
        """``url`` pointed at each node the client knows, primaries first (for the hub's
        Pub/Sub connection, which any node serves: a PUBLISH reaches every node)."""
        primaries = self.get_primaries()
        nodes = primaries + [n for n in self.get_nodes() if n not in primaries]
        return [with_address(url, node.host, int(node.port)) for node in nodes]


# The replies that say a command ran nowhere and is to go to another node, or again.
_REDIRECTED = (AskError, MovedError, TryAgainError)


class LadderClusterPipeline(ClusterPipeline):
    """A cluster pipeline whose function calls that met a node without the library are made
    again, once, after the library is loaded."""

    cluster_client: LadderCluster
    _waited: dict[int, str] | None = None
    """The slot of every write a queued ``WAIT`` covers, and the node it went to."""
    _resent = False

    async def queue_waits(self, replicas: int, timeout_ms: int) -> int:
        """Queue ``WAIT replicas timeout_ms`` for each primary that takes some of the commands
        queued so far, after them on that primary's connection; the number queued (their
        replies are the last of the pipeline's, one per primary)."""
        client = self.cluster_client
        if client._initialize:  # a client not used yet has no slot map
            await client.initialize()
        nodes: dict[str, Any] = {}
        self._waited = {}
        for command in self._execution_strategy._command_queue:  # type: ignore[attr-defined]
            slot = await client._determine_slot(*command.args)
            node = client.nodes_manager.get_node_from_slot(slot)
            nodes.setdefault(node.name, node)
            self._waited[slot] = node.name
        for node in nodes.values():
            self.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
        return len(nodes)

    def waits_cover(self) -> bool:
        """After ``execute``: whether each write went where its ``WAIT`` did, on the same
        connection, so the ``WAIT`` replies speak for every write. Not so when a write was sent
        again on its own: its slot moved or is moving (``MOVED``, ``ASK``, ``TRYAGAIN``; or the
        slot map names another node now) or the node lacked the library."""
        if self._resent:
            return False
        if not self._waited:
            return True
        nodes = self.cluster_client.nodes_manager
        try:
            return all(
                nodes.get_node_from_slot(slot).name == name for slot, name in self._waited.items()
            )
        except RedisClusterException:  # a slot not covered now
            return False

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._transaction:
            # redis-py's cluster transaction hands a command's options to its reply's parser,
            # and the parsers of SMEMBERS and the like take none: the keys a command names for
            # client-side caching (which Ladder does not use) are dropped.
            kwargs.pop("keys", None)
        return super().execute_command(*args, **kwargs)

    def publish(self, channel: Any, message: Any, **kwargs: Any) -> Any:
        """Queued as any keyed command: redis-py's cluster pipeline refuses a PUBLISH."""
        return self.execute_command("PUBLISH", channel, message, **kwargs)

    def unlink(self, *names: Any) -> Any:
        """Queued, as ``DEL`` is (redis-py's cluster pipeline makes ``unlink`` a coroutine that
        a caller queueing it does not await, and nothing is sent)."""
        return self._split_command_across_slots("UNLINK", *names)

    def pfcount(self, *sources: Any) -> Any:
        """Queued as any keyed command (refused as ``PUBLISH`` is); the keys share one slot."""
        return self.execute_command("PFCOUNT", *sources)

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        if self._transaction:
            try:
                return await super().execute(raise_on_error, allow_redirections)
            except ResponseError as exc:
                if self.cluster_client.library and function_missing(exc):
                    await self.cluster_client.load_library()
                raise
        queued = [(cmd.args, dict(cmd.kwargs)) for cmd in self._execution_strategy._command_queue]  # type: ignore[attr-defined]
        # With WAITs queued, a command redirected (MOVED, ASK, TRYAGAIN) is sent again here,
        # not by redis-py, so that waits_cover() knows its WAIT did not see it go.
        waiting = self._waited is not None
        results = await self._sent(allow_redirections and not waiting)
        again = []
        if waiting and allow_redirections:
            again = [i for i, result in enumerate(results) if isinstance(result, _REDIRECTED)]
        if self.cluster_client.library:
            missing = [i for i, result in enumerate(results) if function_missing(result)]
            if missing:
                await self.cluster_client.load_library()
                again += missing
        if again:
            self._resent = True
            for i in sorted(again):
                args, kwargs = queued[i]
                try:
                    results[i] = await self.cluster_client.execute_command(*args, **kwargs)
                except Exception as exc:  # as the pipeline would hold it
                    results[i] = exc
        if raise_on_error:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results

    async def _sent(self, allow_redirections: bool) -> list[Any]:
        """The pipeline's replies (without ``allow_redirections``, a redirected command's error).

        A connection lost as the pipeline was sent makes redis-py send it again, meant for the
        commands without a reply; but it takes a falsy reply (a ``PUBLISH`` that reached no
        subscriber of its node, a 0, an empty string) or an error for none, and made those
        again: a push published twice, a write run twice. Here only a command that nothing came
        back for, or a redirection (which ran it nowhere), is sent again. A pipeline sent again
        is not covered by its waits: redis-py drops a command's ``target_nodes`` as it sends it,
        so each ``WAIT`` went to the default node the second time."""
        strategy = self._execution_strategy
        sent = strategy._execute  # type: ignore[attr-defined]
        for command in strategy._command_queue:  # type: ignore[attr-defined]
            command.result = _UNSENT
        tries = 0

        async def unanswered(client: Any, stack: list[Any], *args: Any, **kwargs: Any) -> Any:
            nonlocal tries
            tries += 1
            if tries == 1:
                return await sent(client, stack, *args, **kwargs)
            again = [c for c in stack if c.result is _UNSENT or isinstance(c.result, _REDIRECTED)]
            await sent(client, again, *args, **kwargs)
            return [command.result for command in stack]

        strategy._execute = unanswered  # type: ignore[attr-defined]
        try:
            results: list[Any] = await super().execute(False, allow_redirections)
        finally:
            del strategy._execute  # type: ignore[attr-defined]
        if tries > 1:
            self._resent = True
        return results


class _Unsent:
    """A command's result until its reply: falsy, as redis-py takes a command without one."""

    def __bool__(self) -> bool:
        return False


_UNSENT = _Unsent()


def seed_nodes(url: str) -> tuple[str, list[ClusterNode]]:
    """A node list ``redis://a:7000/0,redis://b:7001/0``: the first URL (whose credentials and
    options the client takes) and the other nodes, which the client also tries at start."""
    first, *others = [part.strip() for part in url.split(",") if part.strip()]
    nodes = []
    for other in others:
        parts = urlsplit(other)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"a Redis Cluster node needs a host and a port: {other!r}")
        nodes.append(ClusterNode(parts.hostname, parts.port))
    return first, nodes


def with_address(url: str, host: str, port: int) -> str:
    """``url`` with its host and port replaced (its credentials, database and query kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    netloc = f"{credentials}@{address}" if credentials else address
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
