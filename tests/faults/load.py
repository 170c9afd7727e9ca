"""Real load for the fault tests: an asyncio httpx client posting distinct score events.

Every event has a fixed body (``occurred_at`` included), so that a request whose answer was lost
(a timeout, a reset connection) can be sent again as is: the API answers the first result with
``"duplicate": true`` if it had accepted it, or accepts it now. Every event thus ends with a
definite answer, and the set of accepted events is exact.

An event id belongs to its board and user, and the load uses that: each worker sends for users
of its own, and two workers send the same event ids, each for its own users. So every id serves
two users' events (which must both count, once each), and no two requests of one user share an
id unless one is the other's retry. Events are named by ``shared.keys.event_ref``
(``<event_id>:<user_id>``) in ``accepted`` and in the checks.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from shared.keys import event_ref
from tests.helpers import SERVER

REGIONS = ("eu", "na", "as")


@dataclass
class Load:
    api: str
    tag: str
    users: int = 300
    concurrency: int = 16
    board: str = "main"
    seed: int = 0
    sent: int = 0
    # Each accepted event's body, by its event_ref.
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)
    duplicates_answered: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    refused: list[tuple[int, str]] = field(default_factory=list)
    retries: int = 0
    # (monotonic time of the answer, status) of every final answer, for "during the outage".
    answers: list[tuple[float, int]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _client: httpx.AsyncClient | None = None

    def event(self, worker: int, n: int, rng: random.Random) -> dict[str, Any]:
        # The worker's own users (user % concurrency == worker); the event id of workers 2k and
        # 2k + 1 alike.
        user = worker + self.concurrency * rng.randrange(max(1, self.users // self.concurrency))
        # Mostly a home region; one in five events elsewhere, so a user's global score is a
        # sum of several regions.
        region = REGIONS[user % 3] if rng.random() < 0.8 else rng.choice(REGIONS)
        return {
            "event_id": f"{self.tag}-{worker // 2}-{n}",
            "user_id": f"{self.tag}-u{user}",
            "region": region,
            "value": rng.randint(1, 100),
            "occurred_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }

    async def _post(self, body: dict[str, Any]) -> int:
        assert self._client is not None
        delay = 0.1
        for _ in range(60):
            try:
                response = await self._client.post(f"/v1/boards/{self.board}/scores", json=body)
            except httpx.TransportError:
                # The answer is unknown: the same body again tells (idempotent on event_id).
                self.retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if response.status_code == 200 and response.json().get("duplicate"):
                self.duplicates_answered += 1
            if response.status_code >= 300:
                self.refused.append((response.status_code, response.text[:300]))
            return response.status_code
        raise AssertionError(f"no answer for {body['event_id']} after 60 attempts")

    async def _worker(self, worker: int) -> None:
        rng = random.Random(f"{self.seed}-{worker}")
        n = 0
        while not self._stop.is_set():
            body = self.event(worker, n, rng)
            n += 1
            self.sent += 1
            status = await self._post(body)
            self.statuses[status] += 1
            self.answers.append((time.monotonic(), status))
            if 200 <= status < 300:
                self.accepted[event_ref(body["event_id"], body["user_id"])] = body

    async def __aenter__(self) -> Load:
        self._client = httpx.AsyncClient(
            base_url=self.api,
            headers=SERVER,
            timeout=httpx.Timeout(10.0),
            limits=httpx.Limits(max_connections=self.concurrency),
        )
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"load-{i}") for i in range(self.concurrency)
        ]
        return self

    async def stop(self) -> None:
        """Stop sending; every request in flight gets its answer first."""
        self._stop.set()
        if self._tasks:
            await asyncio.gather(*self._tasks)
            self._tasks = []

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        for task in self._tasks:
            if exc[0] is not None:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=exc[0] is not None)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()

    async def more(self, count: int, within: float = 60.0) -> None:
        """Wait until ``count`` more events than now have been accepted."""
        target = len(self.accepted) + count
        end = time.monotonic() + within
        while len(self.accepted) < target:
            for task in self._tasks:
                if task.done():
                    task.result()
            if time.monotonic() > end:
                raise AssertionError(
                    f"load stalled: {len(self.accepted)} accepted of {target} wanted; "
                    f"statuses {dict(self.statuses)}"
                )
            await asyncio.sleep(0.02)

    def answered_between(self, start: float, end: float) -> Counter[int]:
        return Counter(status for at, status in self.answers if start <= at <= end)

    @property
    def rate(self) -> float:
        if len(self.answers) < 2:
            return 0.0
        return len(self.answers) / (self.answers[-1][0] - self.answers[0][0])
