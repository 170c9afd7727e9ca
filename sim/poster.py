"""Posting the simulation's scores through Ladder's public API, one batch per tick.

Batches go to ``POST /v1/boards/{board}/scores/batch`` with a server key. A batch that does not
get through (the API away, 5xx, 503, 429 for the whole batch) is sent again with the same event
ids, which the API takes as the same events: nothing counts twice. An event refused alone with
429 or 503 is sent again a second later; any other refusal is logged and dropped.

Nothing ends the posting but the simulation stopping: a batch whose posting fails in any other
way (an answer not understood, a board that cannot be made again yet) is logged and put back
first in line, and posting goes on after a growing pause. A board being deleted answers its
``PUT`` 409 until the deletion is done; the poster waits for its name to be free.

``accepted`` counts each event the API holds, once: an event answered ``duplicate`` (a batch
sent again whose first answer was lost; the simulation's event ids are its own, unique per run)
is one the API took on an earlier try, and counts in ``accepted`` as well as in ``duplicates``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import httpx
import structlog

log = structlog.get_logger("sim.poster")

MAX_BATCH = 1000
MAX_PENDING = 200_000
RETRYABLE = frozenset({429, 502, 503, 504})
FIRST_BACKOFF_S = 0.5  # the pause after a batch failed unexpectedly, or a board being deleted
MAX_BACKOFF_S = 10.0

# The board the simulation creates when it is missing: points add up (so teams sum), highest
# first, every period; a round's score is well inside the value bounds.
BOARD_SPEC: dict[str, Any] = {
    "operator": "incr",
    "order": "desc",
    "min_value": 0,
    "max_value": 1000,
    "notify_top": [1, 10, 100],
}


class BoardUnavailable(RuntimeError):
    """The board neither exists nor can be created with the credentials given."""


class Poster:
    def __init__(
        self,
        client: httpx.AsyncClient,
        board_id: str,
        server_key: str,
        admin_key: str,
        *,
        dry_run: bool = False,
    ) -> None:
        self.client = client
        self.board_id = board_id
        self.dry_run = dry_run
        self._server = {"Authorization": f"Bearer {server_key}"}
        self._admin = {"Authorization": f"Bearer {admin_key}"}
        self.pending: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.stopping = False
        self.accepted = self.duplicates = self.refused = self.retried = self.dropped = 0
        self.batches = 0

    def add(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        self.pending.extend(events)
        overflow = len(self.pending) - MAX_PENDING
        if overflow > 0:
            for _ in range(overflow):
                self.pending.popleft()
            self.dropped += overflow
            log.warning("too many scores waiting; the oldest dropped", dropped=overflow)
        self.idle.clear()
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            backoff = FIRST_BACKOFF_S
            while self.pending:
                batch = [self.pending.popleft() for _ in range(min(MAX_BATCH, len(self.pending)))]
                try:
                    await self._deliver(batch)
                except Exception:
                    # Not lost, and not the end of the posting: the same events go again.
                    self.pending.extendleft(reversed(batch))
                    log.exception(
                        "posting failed; sending again", events=len(batch), retry_in=backoff
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                else:
                    backoff = FIRST_BACKOFF_S
            self.idle.set()

    async def ensure_board(self) -> None:
        """Create the board with the admin key if it does not exist. While a board of that name
        is being deleted (its ``PUT`` answers 409), wait and try again."""
        if self.dry_run:
            return
        url = f"/v1/boards/{self.board_id}"
        delay = FIRST_BACKOFF_S
        while True:
            got = await self._send("GET", url, headers=self._server)
            if got.status_code == 200:
                if got.json().get("operator") != "incr":
                    log.warning("board is not incr: teams will not sum", board_id=self.board_id)
                return
            if got.status_code != 404:
                raise BoardUnavailable(f"GET {url}: {got.status_code} {got.text[:200]}")
            put = await self._send("PUT", url, headers=self._admin, json=BOARD_SPEC)
            if put.status_code in (200, 201):
                log.info("board created", board_id=self.board_id, definition=BOARD_SPEC)
                return
            if put.status_code != 409 or self.stopping:
                raise BoardUnavailable(f"PUT {url}: {put.status_code} {put.text[:200]}")
            log.warning("board being deleted; waiting to make it again", retry_in=delay)
            self.retried += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)

    async def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request, repeated while the API is away or busy (until the simulation stops)."""
        delay = 0.5
        while True:
            try:
                response = await self.client.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                if self.stopping:
                    raise
                log.warning("api unreachable; retrying", error=repr(exc), retry_in=delay)
            else:
                if response.status_code not in RETRYABLE and response.status_code < 500:
                    return response
                if self.stopping:
                    return response
                after = response.headers.get("Retry-After", "")
                wait = float(after) if after.replace(".", "", 1).isdigit() else delay
                log.warning("api busy; retrying", status=response.status_code, retry_in=wait)
                delay = wait
            self.retried += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def _deliver(self, batch: list[dict[str, Any]]) -> None:
        self.batches += 1
        if self.dry_run:
            self.accepted += len(batch)
            log.debug("batch (dry run)", events=len(batch))
            return
        url = f"/v1/boards/{self.board_id}/scores/batch"
        try:
            response = await self._send("POST", url, headers=self._server, json={"events": batch})
            if response.status_code == 404:
                # The board went away (make clean): make it again and send the same events.
                await self.ensure_board()
                response = await self._send(
                    "POST", url, headers=self._server, json={"events": batch}
                )
        except httpx.TransportError:
            self.refused += len(batch)
            log.warning("stopping with a batch undelivered", events=len(batch))
            return
        if response.status_code != 200:
            self.refused += len(batch)
            log.error("batch refused", status=response.status_code, detail=response.text[:300])
            return
        # Read whole before anything is counted: an answer not understood raises here, and the
        # batch, sent again, is not counted twice.
        results: list[dict[str, Any]] = list(response.json()["results"])
        if len(results) != len(batch) or not all(isinstance(r, dict) for r in results):
            raise ValueError(f"{len(results)} results for a batch of {len(batch)}")
        again: list[dict[str, Any]] = []
        for event, result in zip(batch, results, strict=True):
            error = result.get("error")
            if error is None:
                # A duplicate is this run's own event, taken on an earlier try.
                self.accepted += 1
                if result.get("duplicate"):
                    self.duplicates += 1
            elif isinstance(error, dict) and error.get("status") in RETRYABLE and not self.stopping:
                again.append(event)
            else:
                self.refused += 1
                log.warning("score refused", event_id=event["event_id"], problem=error)
        if again:
            self.retried += len(again)
            asyncio.get_running_loop().call_later(1.0, self.add, again)

    async def drain(self, seconds: float) -> None:
        """Send what is waiting, for at most ``seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), seconds)
        self.stopping = True

    def summary(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "refused": self.refused,
            "retried": self.retried,
            "waiting": len(self.pending),
        }
