"""The batch endpoint: up to 1000 events, each accepted or refused on its own."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import ADMIN, SERVER, UNREACHABLE_BROKER, api_client, derive_outbox, player

pytestmark = pytest.mark.usefixtures("mysql_database", "broker")


@pytest.fixture
def quiet(settings: LadderSettings) -> LadderSettings:
    return settings.model_copy(
        update={
            "amqp_url": UNREACHABLE_BROKER,
            "shutdown_grace_seconds": 1.0,
            "key_rate": 100_000.0,
            "user_rate": 10_000.0,
        }
    )


def event(i: int, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event_id": f"b-{i}",
        "user_id": f"u-{i % 300}",
        "region": ("eu", "na", "ap")[i % 3],
        "value": i % 17,
    }
    body.update(changes)
    return body


async def test_a_batch_of_1000_with_two_bad_events_accepts_998(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    events = [event(i) for i in range(1000)]
    events[10] = event(10, value=1.5)  # not an integer
    events[500] = event(500, region="Not A Region")
    async with api_client(quiet) as client:
        response = await client.post(
            "/v1/boards/main/scores/batch", json={"events": events}, headers=SERVER
        )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == 1000
    refused = [i for i, r in enumerate(results) if "error" in r]
    assert refused == [10, 500]
    assert results[10]["event_id"] == "b-10"
    assert results[10]["error"]["status"] == 422
    assert results[500]["error"]["errors"][0]["loc"] == ["body", "events", 500, "region"]
    assert results[10]["error"]["errors"][0]["loc"] == ["body", "events", 10, "value"]
    assert all(r["duplicate"] is False for i, r in enumerate(results) if i not in (10, 500))
    keys = Keys(quiet.key_prefix)
    assert await redis.xlen(keys.outbox("main")) == 998
    # Every user is on its region's board, and every accepted event is counted.
    total = 0
    for region in ("eu", "na", "ap"):
        rows = await redis.zrange(keys.region_view("main", "alltime", "all", region), 0, -1)
        total += len(rows)
    assert total == 300
    # Every accepted event is counted once the aggregator derives the batch (here by hand: the
    # broker is unreachable), and once only.
    assert await derive_outbox(redis, keys, MAIN_BOARD, quiet.feed_length) == 998
    assert await derive_outbox(redis, keys, MAIN_BOARD, quiet.feed_length) == 0
    assert int(await redis.get(keys.event_count("main", "alltime", "all")) or 0) == 998


async def test_a_batch_answers_each_event_on_its_own(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    tag = uuid.uuid4().hex[:6]
    first = {"event_id": f"x-{tag}", "user_id": "ana", "region": "eu", "value": 5}
    async with api_client(quiet) as client:
        response = await client.post(
            "/v1/boards/main/scores/batch",
            json={
                "events": [
                    first,
                    first,  # the same event again: a duplicate
                    {**first, "value": 6},  # the same id, another body: 409
                    {"user_id": "bo", "region": "eu", "value": 2_000_000},  # over max_value
                    {"user_id": "cy", "region": "eu", "value": 1},  # no id: one is made
                    ["not", "an", "object"],  # refused alone, as any invalid event
                ]
            },
            headers=SERVER,
        )
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert results[0]["duplicate"] is False
        assert results[0]["periods"]["alltime"]["score"] == 5
        assert results[1]["duplicate"] is True
        assert results[1]["periods"] == results[0]["periods"]
        assert results[2]["error"]["status"] == 409
        assert results[3]["error"]["status"] == 422
        assert results[4]["duplicate"] is False and results[4]["event_id"]
        assert results[5] == {"event_id": None, "error": results[5]["error"]}
        assert results[5]["error"]["status"] == 422
        # Said as a client reads it: the message named the model's class ("... or instance of
        # ScoreIn").
        assert results[5]["error"]["errors"] == [
            {
                "loc": ["body", "events", 5],
                "msg": "Input should be a JSON object",
                "type": "model_type",
            }
        ]

        # A player token may not post batches; nor may anyone without a credential.
        response = await client.post(
            "/v1/boards/main/scores/batch", json={"events": [first]}, headers=player("ana")
        )
        assert response.status_code == 403
        response = await client.post("/v1/boards/main/scores/batch", json={"events": [first]})
        assert response.status_code == 401


@pytest.mark.parametrize(
    "body",
    [{"events": []}, {"events": [{}] * 1001}, {"events": "no"}, {}, {"events": [], "x": 1}],
    ids=["empty", "1001", "not-a-list", "missing", "extra-field"],
)
async def test_a_malformed_batch_is_refused_whole(
    quiet: LadderSettings, redis: Redis, body: dict[str, Any]
) -> None:
    async with api_client(quiet) as client:
        response = await client.post("/v1/boards/main/scores/batch", json=body, headers=SERVER)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 0


@pytest.mark.parametrize(
    "content",
    [
        b'{"events": [{"user_id": "u", "region": "eu", "value": NaN}]}',
        b'{"events": [{"user_id": "u", "region": "eu", "value": 1, "metadata": {"a": Infinity}}]}',
        b'{"user_id": "u", "region": "eu", "value": 1, "metadata": {"a": -Infinity}}',
        b'{"user_id": "u", "region": "eu", "value": NaN}',
    ],
    ids=["batch-nan", "batch-infinity", "single-minus-infinity", "single-nan"],
)
async def test_nan_and_infinity_are_not_json(
    quiet: LadderSettings, redis: Redis, content: bytes
) -> None:
    # Python's json and pydantic's parser take them; a metadata object kept them as null.
    path = "/v1/boards/main/scores" + ("/batch" if content.startswith(b'{"events"') else "")
    headers = SERVER | {"Content-Type": "application/json"}
    async with api_client(quiet) as client:
        response = await client.post(path, content=content, headers=headers)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        # Inside a string they are text, and fine.
        text = b'{"user_id": "u", "region": "eu", "value": 1, "metadata": {"a": "NaN"}}'
        kept = await client.post("/v1/boards/main/scores", content=text, headers=headers)
        assert kept.status_code == 200, kept.text
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 1


@pytest.mark.parametrize(
    ("content", "status"),
    [
        # A "NaN" in a string sends the body through the strict parser, which recursed past its
        # limit on deep nesting (500): now the same 400 as any invalid body.
        (b'{"user_id": "NaN-1", "metadata": ' + b"[" * 1200 + b"]" * 1200 + b"}", 400),
        # A number past a double's range is an infinity once parsed, which was kept as null.
        (b'{"user_id": "u", "region": "eu", "value": 1, "metadata": {"a": 1e400}}', 422),
    ],
    ids=["deep-nesting-beside-a-nan-string", "metadata-number-past-a-double"],
)
async def test_bodies_that_were_a_500_or_kept_wrong_are_refused(
    quiet: LadderSettings, redis: Redis, content: bytes, status: int
) -> None:
    headers = SERVER | {"Content-Type": "application/json"}
    async with api_client(quiet) as client:
        response = await client.post("/v1/boards/main/scores", content=content, headers=headers)
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        batch = b'{"events": [' + content + b"]}"
        answer = await client.post("/v1/boards/main/scores/batch", content=batch, headers=headers)
        assert answer.status_code in (200, 400, 422), answer.text
        if answer.status_code == 200:
            assert answer.json()["results"][0]["error"]["status"] == 422
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 0


@pytest.mark.parametrize("where", ["value", "metadata"])
async def test_a_number_too_long_to_read_is_a_400_that_says_so(
    quiet: LadderSettings, redis: Redis, where: str
) -> None:
    """Past 4300 digits an integer is not read (RFC 8259 lets a reader bound its numbers): the
    400 says so on every route, rather than call the body invalid JSON; one digit fewer is read,
    and refused by the field's bounds."""
    headers = SERVER | {"Content-Type": "application/json"}
    detail = "The body holds an integer of more than 4300 digits, which is not read."

    def event(digits: int) -> bytes:
        number = b"-" + b"9" * digits
        if where == "value":
            return b'{"user_id": "u", "region": "eu", "value": ' + number + b"}"
        return b'{"user_id": "u", "region": "eu", "value": 1, "metadata": {"a": ' + number + b"}}"

    async with api_client(quiet) as client:
        for path, body in (
            ("/v1/boards/main/scores", event(4301)),
            ("/v1/boards/main/scores/batch", b'{"events": [' + event(4301) + b"]}"),
        ):
            response = await client.post(path, content=body, headers=headers)
            assert response.status_code == 400, response.text
            assert response.json()["detail"] == detail
        read = await client.post("/v1/boards/main/scores", content=event(4300), headers=headers)
        assert read.status_code == 422, read.text
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 0


@pytest.mark.parametrize(
    ("number", "status"),
    [(b"1" + b"0" * 4300 + b"e-4000", 200), (b"1" * 5000 + b".5", 422)],
    ids=["a-double-of-4301-digits", "past-a-double-s-range"],
)
async def test_a_long_decimal_is_read_alike_by_the_single_and_the_batch_post(
    quiet: LadderSettings, redis: Redis, number: bytes, status: int
) -> None:
    """A decimal of more than 4300 digits, which Python's parser reads and pydantic's refuses
    for its length: the single POST answered 400 where the batch took it."""
    headers = SERVER | {"Content-Type": "application/json"}

    def event(event_id: str) -> bytes:
        head = b'{"event_id": "' + event_id.encode() + b'", "user_id": "u", "region": "eu", '
        return head + b'"value": 1, "metadata": {"a": ' + number + b"}}"

    async with api_client(quiet) as client:
        single = await client.post("/v1/boards/main/scores", content=event("s"), headers=headers)
        batch = await client.post(
            "/v1/boards/main/scores/batch",
            content=b'{"events": [' + event("b") + b"]}",
            headers=headers,
        )
    assert single.status_code == status, single.text
    result = batch.json()["results"][0]
    assert (result["error"]["status"] if "error" in result else 200) == status, result


@pytest.mark.parametrize(
    "bad",
    [
        b'{"event_id": "\\ud800", "user_id": "u-bad", "region": "eu", "value": 1}',
        b'{"user_id": "u-bad", "region": "eu", "value": 1, "metadata": {"\\udc00": 1}}',
        b'{"user_id": "u-bad\\uD800", "region": "eu", "value": 1}',
    ],
    ids=["event-id", "metadata-key", "user-id"],
)
async def test_half_a_surrogate_pair_is_not_json_text(
    quiet: LadderSettings, redis: Redis, bad: bytes
) -> None:
    """A string escape of half a UTF-16 pair is no text (UTF-8 has none for it): the body is
    not JSON Ladder takes, a 400 on every route, as the single POST's parser has it; the batch
    answered 500 after writing its other events, which a retry then counted twice."""
    good = b'{"event_id": "g-1", "user_id": "u-ok", "region": "eu", "value": 7}'
    headers = SERVER | {"Content-Type": "application/json"}
    batch = b'{"events": [' + good + b", " + bad + b"]}"
    async with api_client(quiet) as client:
        for path, body in [("/scores/batch", batch), ("/scores", bad)]:
            response = await client.post("/v1/boards/main" + path, content=body, headers=headers)
            assert response.status_code == 400, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
        # A whole pair is a character like any other.
        pair = b'{"user_id": "u", "region": "eu", "value": 1, "metadata": {"e": "\\ud83c\\udfc6"}}'
        kept = await client.post(
            "/v1/boards/main/scores/batch", content=b'{"events": [' + pair + b"]}", headers=headers
        )
        assert kept.status_code == 200, kept.text
        assert "error" not in kept.json()["results"][0], kept.text
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 1


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
async def test_a_body_in_another_encoding_is_not_json(
    quiet: LadderSettings, redis: Redis, encoding: str
) -> None:
    """Bodies are UTF-8, without a byte-order mark, on every route: json guessed UTF-16 and
    UTF-32 and took them on the batch, where the single POST refused them."""
    event = '{"user_id": "u", "region": "eu", "value": 1}'
    headers = SERVER | {"Content-Type": "application/json"}
    async with api_client(quiet) as client:
        for path, text in [("/scores", event), ("/scores/batch", '{"events": [' + event + "]}")]:
            response = await client.post(
                "/v1/boards/main" + path, content=text.encode(encoding), headers=headers
            )
            assert response.status_code == 400, (path, response.text)
        board = await client.put(
            "/v1/boards/enc", content='{"max_value": 7}'.encode(encoding), headers=ADMIN
        )
        assert board.status_code == 400, board.text
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 0


async def test_users_over_their_rate_are_refused_alone(
    settings: LadderSettings, redis: Redis, broker: Topology
) -> None:
    limited = settings.model_copy(update={"amqp_url": UNREACHABLE_BROKER, "user_rate": 1.0})
    events = [event(i, user_id="busy") for i in range(3)] + [event(9, user_id="calm")]
    async with api_client(limited) as client:
        response = await client.post(
            "/v1/boards/main/scores/batch", json={"events": events}, headers=SERVER
        )
    results = response.json()["results"]
    # Each event takes its own token, as single POSTs would: the user's burst (twice its rate
    # of 1 a second) lets two through, the third is refused alone, the other user is untouched.
    assert [r.get("error", {}).get("status") for r in results] == [None, None, 429, None]
    assert results[2]["error"]["type"].endswith("rate-limited")
    # When to send it again, as a single POST's Retry-After: a token a second, so 1 s; the
    # events answered otherwise have no such member.
    assert results[2]["error"]["retry_after"] == 1
    assert all("retry_after" not in r.get("error", {}) for r in results[:2] + results[3:])
    assert results[1]["periods"]["alltime"]["score"] == events[1]["value"]
    assert results[3]["periods"]["alltime"]["score"] == events[3]["value"]


async def test_an_event_answered_before_the_write_keeps_its_answer_when_the_credential_is_empty(
    settings: LadderSettings, redis: Redis, broker: Topology
) -> None:
    # A credential of one token a second; the lateness short enough to pass within the test.
    limited = settings.model_copy(
        update={"amqp_url": UNREACHABLE_BROKER, "key_rate": 1.0, "allowed_lateness": 1.0}
    )
    url = "/v1/boards/main/scores/batch"
    first = event(1, occurred_at=datetime.now(UTC).isoformat())
    async with api_client(limited) as client:
        accepted = await client.post(url, json={"events": [first]}, headers=SERVER)
        assert accepted.status_code == 200, accepted.text
        await asyncio.sleep(1.2)  # the token back; the first event past the allowed lateness
        spent = await client.post(url, json={"events": [event(2)]}, headers=SERVER)
        assert "error" not in spent.json()["results"][0]
        # The retry of the first event is answered from its record before the write, with the
        # credential empty: its answer is given, and only the new event is refused.
        retry = await client.post(url, json={"events": [first, event(3)]}, headers=SERVER)
    assert retry.status_code == 200, retry.text
    results = retry.json()["results"]
    assert results[0]["duplicate"] is True
    assert results[0]["periods"] == accepted.json()["results"][0]["periods"]
    assert results[1]["error"]["status"] == 429


@pytest.mark.parametrize("users", [("a", "b"), ("b", "a")], ids=["empty-first", "empty-second"])
async def test_a_batch_the_credential_refuses_whole_is_429_and_waits_for_its_longest_wait(
    settings: LadderSettings, redis: Redis, broker: Topology, users: tuple[str, str]
) -> None:
    # One token in each bucket: the user's (2 s to the next) and the credential's (1 s).
    limited = settings.model_copy(
        update={"amqp_url": UNREACHABLE_BROKER, "key_rate": 1.0, "user_rate": 0.5}
    )
    url = "/v1/boards/main/scores/batch"
    ids = {"a": 2, "b": 3}
    async with api_client(limited) as client:
        accepted = await client.post(url, json={"events": [event(1, user_id="a")]}, headers=SERVER)
        assert "error" not in accepted.json()["results"][0]
        refused = await client.post(
            url, json={"events": [event(ids[u], user_id=u) for u in users]}, headers=SERVER
        )
        single = await client.post(
            "/v1/boards/main/scores", json=event(4, user_id="a"), headers=SERVER
        )
    # The credential let none through: the batch is refused as a whole. The wait is until both
    # buckets of every event have a token: user a's, the longer, wherever a's event stands
    # (after the credential's second alone, a's event would be refused again).
    assert refused.status_code == 429, refused.text
    assert "credential" in refused.json()["detail"]
    assert refused.headers["Retry-After"] == "2"
    assert single.status_code == 429, single.text
    assert "credential" in single.json()["detail"]
    assert single.headers["Retry-After"] == "2"
    assert await redis.xlen(Keys(limited.key_prefix).outbox("main")) == 1
