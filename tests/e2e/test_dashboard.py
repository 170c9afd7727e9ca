"""The dashboard at ``GET /``: the page and its files, the anonymous socket it relies on, and the
page itself in headless Chromium against a running Ladder fed by the simulation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from redis.asyncio import Redis
from selenium.webdriver.support.ui import Select

from shared.settings import DEV_ADMIN_KEY, DEV_JWT_SECRET, DEV_SERVER_KEY, LadderSettings
from tests import tools
from tests.helpers import SERVER, api_client, serve
from tests.stack import ROOT, Stack

# The README's picture is docs/dashboard.png; a run saves its own under .run/ unless
# LADDER_SCREENSHOT names where (LADDER_SCREENSHOT=docs/dashboard.png refreshes the README's).
SCREENSHOT = Path(os.environ.get("LADDER_SCREENSHOT") or ROOT / ".run" / "dashboard.png")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RETRY_S = 2.0  # the page's RETRY_MS: a failed read worth another try is tried again after this


@pytest.mark.usefixtures("mysql_database", "redis", "broker")
async def test_the_page_and_its_files_are_served_without_credentials(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        page = await client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp
        assert '<script src="/static/dashboard.js"' in page.text
        script = await client.get("/static/dashboard.js")
        style = await client.get("/static/dashboard.css")
        assert script.status_code == style.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert style.headers["content-type"].startswith("text/css")
        # Everything the page loads is its own, and it carries no credential.
        for text in (page.text, script.text, style.text):
            assert not re.search(r"https?://|//cdn|@import", text)
            for secret in (DEV_SERVER_KEY, DEV_ADMIN_KEY, DEV_JWT_SECRET, "Authorization"):
                assert secret not in text
        # Each topic the page subscribes to exists on the socket.
        for topic in ("global:", ":hot:10", ":hot:60", ":mvps:", ":region:"):
            assert topic in script.text
        assert (await client.get("/static/nothing.js")).status_code == 404
        described = (await client.get("/openapi.json")).json()["paths"]["/"]["get"]
        assert "text/html" in described["responses"]["200"]["content"]


async def _ask(ws: Any, op: dict[str, Any]) -> dict[str, Any]:
    """Send one op and return the first answer that is not a view's current state."""
    await ws.send(json.dumps(op))
    await ws.send(json.dumps({"op": "ping"}))
    answers = []
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 5))
        if message["type"] == "pong":
            return answers[0] if answers else message
        if message["type"] != "leaderboard":
            answers.append(message)


@pytest.mark.parametrize("public", [True, False])
@pytest.mark.usefixtures("mysql_database", "broker")
async def test_an_anonymous_socket_watches_only_public_views_while_reads_are_public(
    quiet: LadderSettings, redis: Redis, public: bool
) -> None:
    settings = quiet.model_copy(update={"public_reads": public})
    topics = [
        "leaderboard:main:global:alltime",
        "leaderboard:main:region:eu:weekly",
        "leaderboard:main:hot:10",
        "leaderboard:main:hot:60",
        "leaderboard:main:mvps:alltime",
    ]
    async with serve(settings) as url, websockets.connect(url) as anonymous:
        for topic in topics:
            answer = await _ask(anonymous, {"op": "subscribe", "topic": topic})
            if public:
                assert answer["type"] != "error", answer
            else:
                assert answer["type"] == "error" and answer["topic"] == topic
        refused = await _ask(anonymous, {"op": "subscribe", "topic": "user:u-1"})
        assert refused["type"] == "error"
        # The socket stays open after a refusal.
        assert (await _ask(anonymous, {"op": "ping"}))["type"] == "pong"


# -- the page in a browser ----------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        tools.missing("headless Chromium needs Debian's chromium and chromium-driver (.ci/run)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # The page's console, which a failing wait prints beside what the page shows.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1440,1080", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(probe: Any, within: float, what: str, page: Any = None) -> Any:
    """``probe()``'s first true answer within ``within`` s; else fails, saying what ``page`` (a
    browser) showed and logged by then."""
    end = time.monotonic() + within
    while True:
        with contextlib.suppress(Exception):
            if answer := probe():
                return answer
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {within} s{page_state(page)}")
        time.sleep(0.2)


# The page's next ``arguments[0]`` reads of its top players fail (as if the API were away), then
# the page reads them: ``window.__topReads`` counts the tries.
FAIL_TOP_READS = """
const real = window.fetch;
let failures = arguments[0];
window.__topReads = 0;
// A push may redraw the table a moment after the error shows: what the table said is kept.
window.__playersSaid = [];
const players = document.querySelector("#players");
new MutationObserver(() => window.__playersSaid.push(players.innerText))
  .observe(players, { childList: true, subtree: true, characterData: true });
window.fetch = (path, ...rest) => {
  if (!String(path).includes("scope=global")) return real(path, ...rest);
  window.__topReads += 1;
  return failures-- > 0 ? Promise.reject(new Error("read refused")) : real(path, ...rest);
};
load("players");
"""


def page_state(driver: Any) -> str:
    if driver is None:
        return ""
    shown = driver.execute_script("return document.querySelector('main').innerText")
    console = "\n".join(str(entry.get("message")) for entry in driver.get_log("browser"))
    return f"\n--- the page showed:\n{shown}\n--- its console:\n{console}"


def text_of(driver: Any, selector: str) -> str:
    return str(driver.execute_script(f"return document.querySelector({selector!r}).innerText"))


def rows(driver: Any, selector: str) -> int:
    """Rows of entries (not the empty-table line) under ``selector``."""
    return len(driver.find_elements("css selector", f"{selector} tr[data-key]"))


def first_key(driver: Any, selector: str) -> str | None:
    """The first entry's key, read in one step: the page may redraw the table at any moment,
    which would leave an element found beforehand stale."""
    key = driver.execute_script(
        f"const row = document.querySelector({selector + ' tr[data-key]'!r});"
        " return row ? row.dataset.key : null"
    )
    return None if key is None else str(key)


def status_of(driver: Any) -> str:
    return str(driver.execute_script("return document.querySelector('#status').dataset.state"))


def post_score(stack: Stack, user_id: str, name: str, rounds: int, board: str = "arena") -> None:
    """``rounds`` scores of 1000 (the board's largest value) for one new player, in one batch."""
    events = [
        {
            "event_id": uuid.uuid4().hex,
            "user_id": user_id,
            "display_name": name,
            "region": "eu",
            "team_id": "dashboard-testers",
            "value": 1000,
            "occurred_at": datetime.now(UTC).isoformat(),
        }
        for _ in range(rounds)
    ]
    r = httpx.post(
        f"{stack.api}/v1/boards/{board}/scores/batch",
        json={"events": events},
        headers=SERVER,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert all("error" not in result for result in r.json()["results"]), r.text


@pytest.mark.stack
@pytest.mark.timeout(180)
def test_the_dashboard_moves_live_and_comes_back_after_the_api_restarts(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    log_path = tmp_path / "sim.log"
    with log_path.open("w") as log_file:
        sim = subprocess.Popen(
            [sys.executable, "-m", "sim", "--seed", "3", "--speed", "20", "--set", "tick_s=0.5"],
            cwd=ROOT,
            env=stack.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        top = f"{stack.api}/v1/boards/arena/leaderboard?scope=global"
        wait_until(lambda: len(httpx.get(top).json()["entries"]) == 10, 30, "the sim's board")

        browser.get(f"{stack.api}/")
        # The current state at once, from REST; then live over the socket.
        wait_until(lambda: status_of(browser) == "live", 15, "the socket open", browser)
        wait_until(lambda: rows(browser, "#players") == 10, 10, "top players", browser)
        assert browser.execute_script("return document.querySelector('#board').value") == "arena"
        browser.execute_script("window.__sameDocument = true")

        wait_until(lambda: rows(browser, "#hot60") == 10, 20, "hot streaks", browser)
        wait_until(lambda: rows(browser, "#mvps") == 10, 20, "team MVPs", browser)
        wait_until(lambda: rows(browser, "#regions") >= 4 * 5, 20, "regions", browser)
        wait_until(lambda: rows(browser, "#teams") >= 3, 30, "teams", browser)
        # The picture in the README: the simulation's game as the page shows it.
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT))
        assert SCREENSHOT.stat().st_size > 10_000

        # A read that fails says so in its table and is tried again until it answers.
        browser.execute_script(FAIL_TOP_READS, 2)
        said = "return window.__playersSaid.some((text) => text.includes('read refused'))"
        wait_until(lambda: browser.execute_script(said), 5, "the error", browser)
        tries = "return window.__topReads"
        wait_until(lambda: browser.execute_script(tries) >= 3, 10, "the read again", browser)
        wait_until(lambda: rows(browser, "#players") == 10, 10, "the top back", browser)

        post_score(stack, "dash-hero", "Dashboard Hero", 2)
        wait_until(
            lambda: "Dashboard Hero" in text_of(browser, "#players"), 15, "the new score", browser
        )
        assert wait_until(
            lambda: first_key(browser, "#players") == "dash-hero", 5, "it on top", browser
        )
        # The feed has no topic: it follows the pushes of the others.
        newest = first_key(browser, "#feed")
        wait_until(
            lambda: first_key(browser, "#feed") not in (None, newest), 10, "the feed", browser
        )
        wait_until(
            lambda: "dashboard-testers" in text_of(browser, "#teams"), 10, "the team", browser
        )
        assert browser.execute_script("return window.__sameDocument") is True

        # The API goes away: the page says so, reconnects by itself and moves on.
        stack.make("stop", "SERVICE=api")
        wait_until(lambda: status_of(browser) == "reconnecting", 15, "the drop noticed", browser)
        stack.make("start", "SERVICE=api")
        stack.wait_ready("api")
        wait_until(lambda: status_of(browser) == "live", 30, "the socket back", browser)
        post_score(stack, "dash-second", "Second Wind", 8)
        wait_until(
            lambda: "Second Wind" in text_of(browser, "#players"), 15, "a score after it", browser
        )
        assert browser.execute_script("return window.__sameDocument") is True

        # Another period: the views are read again and followed on that period's topics.
        Select(browser.find_element("css selector", "#period")).select_by_value("daily")
        wait_until(
            lambda: "period=daily" in browser.current_url, 5, "the period in the URL", browser
        )
        wait_until(lambda: rows(browser, "#players") == 10, 10, "the day's top players", browser)
        post_score(stack, "dash-third", "Third Act", 12)
        wait_until(
            lambda: "Third Act" in text_of(browser, "#players"), 15, "the day's new score", browser
        )

    finally:
        sim.send_signal(signal.SIGTERM)
        try:
            sim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()


COUNTDOWN = re.compile(r"season ends in (?:(\d+)d )?(\d{2}):(\d{2}):(\d{2})")


def season_left(driver: Any) -> int | None:
    """The seconds the countdown shows, or None when it shows none."""
    found = COUNTDOWN.fullmatch(text_of(driver, "#countdown").strip())
    if found is None:
        return None
    days, h, m, s = (int(part or 0) for part in found.groups())
    return ((days * 24 + h) * 60 + m) * 60 + s


@pytest.mark.stack
@pytest.mark.timeout(240)
def test_a_scheduled_board_offers_its_season_with_a_countdown(stack: Stack, browser: Any) -> None:
    made = httpx.put(
        f"{stack.api}/v1/boards/minutely",
        json={"schedule": "* * * * *"},
        headers={"Authorization": f"Bearer {DEV_ADMIN_KEY}"},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    browser.get(f"{stack.api}/?board=minutely&period=season")
    wait_until(lambda: status_of(browser) == "live", 15, "the socket open", browser)
    options = browser.execute_script(
        "return [...document.querySelectorAll('#period option')].map((o) => o.value)"
    )
    assert "season" in options, options
    assert browser.execute_script("return document.querySelector('#period').value") == "season"

    # A season of "* * * * *" lasts a minute: the countdown shows under a minute, and falls.
    # (Started with 30 s or more left, so that the score below lands in this season.)
    first = wait_until(
        lambda: (left := season_left(browser)) is not None and left >= 30 and left,
        70,
        "a countdown of 30 s",
    )
    assert first <= 60, text_of(browser, "#countdown")
    time.sleep(2.2)
    later = season_left(browser)
    assert later is not None and later < first, (first, later)

    # A score of this season shows; at zero the page reads again and the new season is empty.
    post_score(stack, "dash-season", "Season Opener", 1, board="minutely")
    wait_until(
        lambda: "Season Opener" in text_of(browser, "#players"), 15, "the season's score", browser
    )
    wait_until(lambda: (season_left(browser) or 60) <= 3, 70, "the season's last seconds", browser)
    wait_until(lambda: (season_left(browser) or 0) > 50, 15, "the next season's countdown", browser)
    wait_until(lambda: rows(browser, "#players") == 0, 10, "the new season empty", browser)


def reads_counted(driver: Any) -> None:
    """From the next page opened on: ``window.__reads`` lists the path of every read it makes."""
    driver.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument",
        {
            "source": "window.__reads = []; const real = window.fetch;"
            " window.fetch = (path, ...rest) => { window.__reads.push(String(path));"
            " return real(path, ...rest); };"
        },
    )


def reads_of(driver: Any, *parts: str) -> int:
    """How many of the page's reads so far have each of ``parts`` in their path."""
    paths = driver.execute_script("return window.__reads")
    return sum(all(part in path for part in parts) for path in paths)


@pytest.mark.stack
@pytest.mark.timeout(180)
def test_a_board_without_teams_neither_reads_nor_retries_them_nor_a_deleted_board(
    stack: Stack, browser: Any
) -> None:
    admin = {"Authorization": f"Bearer {DEV_ADMIN_KEY}"}
    made = httpx.put(f"{stack.api}/v1/boards/best", json={"operator": "best"}, headers=admin)
    assert made.status_code == 201, made.text
    post_score(stack, "best-one", "Best One", 1, board="best")
    reads_counted(browser)
    browser.get(f"{stack.api}/?board=best")
    wait_until(lambda: status_of(browser) == "live", 15, "the socket open", browser)
    wait_until(lambda: rows(browser, "#players") == 1, 10, "the top player", browser)
    # On a best board an event's value is the score sent, not an increment: no '+' before it.
    wait_until(lambda: rows(browser, "#feed") == 1, 10, "the feed", browser)
    assert text_of(browser, "#feed tr[data-key] td.num") == "1,000"
    # Pushes make the page read the views without a topic again (the teams among them, once).
    post_score(stack, "best-two", "Best Two", 1, board="best")
    wait_until(lambda: rows(browser, "#players") == 2, 15, "the second player", browser)
    time.sleep(RETRY_S * 2.5)
    assert reads_of(browser, "scope=teams") == 0
    assert reads_of(browser, "/mvps") == 0
    for panel in ("#panel-teams", "#panel-mvps"):
        assert "kept on incr boards only" in text_of(browser, panel)
        assert "off" in browser.execute_script(
            f"return document.querySelector('{panel}').className"
        )

    # A board deleted under the page: its reads answer 404, and are not tried again.
    gone = httpx.delete(f"{stack.api}/v1/boards/best", headers=admin)
    assert gone.status_code == 202, gone.text
    top = f"{stack.api}/v1/boards/best/leaderboard?scope=global"
    wait_until(lambda: httpx.get(top).status_code == 404, 15, "the board gone")
    before = reads_of(browser, "scope=global")
    browser.execute_script('load("players")')
    wait_until(lambda: rows(browser, "#players") == 0, 5, "the 404 shown", browser)
    time.sleep(RETRY_S * 2.5)
    assert reads_of(browser, "scope=global") == before + 1


# Reads of one period answered late: every read whose path names it waits arguments[1] ms.
SLOW_PERIOD = """
const real = window.fetch;
const slow = `period=${arguments[0]}`;
window.fetch = (path, ...rest) =>
  String(path).includes(slow)
    ? new Promise((done) => setTimeout(() => done(real(path, ...rest)), arguments[1]))
    : real(path, ...rest);
"""


@pytest.mark.stack
@pytest.mark.timeout(180)
def test_a_late_answer_of_the_period_left_does_not_replace_the_period_chosen(
    stack: Stack, browser: Any
) -> None:
    post_score(stack, "early-bird", "Early Bird", 1, board="main")
    browser.get(f"{stack.api}/?board=main&period=alltime")
    wait_until(lambda: status_of(browser) == "live", 15, "the socket open", browser)
    wait_until(lambda: rows(browser, "#players") == 1, 10, "the top player", browser)
    # alltime chosen again, its reads slow; daily chosen before they answer.
    browser.execute_script(SLOW_PERIOD, "alltime", 1500)
    browser.execute_script('choose("main", "alltime"); choose("main", "daily")')
    time.sleep(2.5)  # the alltime answers have landed
    day = httpx.get(f"{stack.api}/v1/boards/main/leaderboard?scope=global&period=daily").json()
    shown = browser.execute_script("return [state.period, state.periodId]")
    assert shown == ["daily", day["period_id"]], page_state(browser)
    # The day's pushes are shown, not dropped as older than the all-time's period id.
    post_score(stack, "late-riser", "Late Riser", 3, board="main")
    wait_until(lambda: "Late Riser" in text_of(browser, "#players"), 15, "the day's push", browser)

    # Names are the board's, and bounded: a choice starts them afresh; the oldest go past 5000.
    assert browser.execute_script("return state.names.get('late-riser')") == "Late Riser"
    capped = browser.execute_script(
        "for (let i = 0; i < 6000; i++) keep(state.names, `u-${i}`, 'someone');"
        " return [state.names.size, state.names.has('u-999'), state.names.has('u-1000')]"
    )
    assert capped == [5000, False, True]
    assert browser.execute_script(
        'choose("main", "weekly"); return [state.names.size, state.lookups.size]'
    ) == [0, 0]


# The page's first arguments[0] reads of the list of boards fail, as with the API away.
BOARDS_UNREADABLE = """
let failures = %d;
const real = window.fetch;
window.fetch = (path, ...rest) =>
  String(path) === "/v1/boards" && failures-- > 0
    ? Promise.reject(new Error("the API is away"))
    : real(path, ...rest);
"""


# A stand-in for the page's WebSocket (window.__fake says what it saw): in mode "1008" or "1013"
# it opens and is closed at once with that code, as a server refusing it would; in "try again"
# it answers the first subscription to a global topic with that error; in "silent" it opens and
# answers nothing, as a half-open socket. The page's current socket is closed to make it
# reconnect (to the stand-in); its backoff starts afresh.
FAKE_SOCKET = """
window.__fake = { opens: 0, sent: [], mode: arguments[0], closedBy: null };
class FakeSocket extends EventTarget {
  constructor(url) {
    super();
    this.readyState = 0;
    window.__fake.opens += 1;
    setTimeout(() => {
      this.readyState = 1;
      this.dispatchEvent(new Event("open"));
      const mode = window.__fake.mode;
      if (mode === "1008") this.closed(1008, "this Origin is not allowed");
      if (mode === "1013") this.closed(1013, "too slow to keep up");
    }, 20);
  }
  closed(code, reason) {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.dispatchEvent(new CloseEvent("close", { code, reason }));
  }
  answer(message) {
    setTimeout(() => this.dispatchEvent(
      new MessageEvent("message", { data: JSON.stringify(message) })), 10);
  }
  send(text) {
    const message = JSON.parse(text);
    window.__fake.sent.push(message);
    const refuse = window.__fake.mode === "try again" && !window.__fake.refused;
    if (refuse && message.op === "subscribe" && message.topic.includes(":global:")) {
      window.__fake.refused = true;
      this.answer({ type: "error", op: "subscribe", topic: message.topic, detail: "try again" });
    }
  }
  close(code, reason) {
    window.__fake.closedBy = reason || null;
    setTimeout(() => this.closed(code || 1005, reason || ""), 10);
  }
}
Object.assign(FakeSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
window.WebSocket = FakeSocket;
state.attempt = 0;
state.openedAt = null;
state.socket.close();
"""


def fake(driver: Any, what: str) -> Any:
    return driver.execute_script(f"return window.__fake.{what}")


@pytest.mark.stack
@pytest.mark.timeout(240)
def test_the_page_starts_once_it_can_keeps_its_socket_alive_and_backs_off_from_refusals(
    stack: Stack, browser: Any
) -> None:
    # Opened while the API cannot list the boards: it says so, and starts once it can.
    browser.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument", {"source": BOARDS_UNREADABLE % 2}
    )
    browser.get(f"{stack.api}/?board=main")
    wait_until(
        lambda: "cannot start" in text_of(browser, "#status"), 5, "the failed start", browser
    )
    wait_until(lambda: status_of(browser) == "live", 20, "the socket open", browser)
    assert browser.execute_script("return document.querySelector('#board').value") == "main"
    # The server answers the page's ping (op "ping", type "pong").
    assert browser.execute_script("ping(state.socket); return state.pongDue !== null")
    wait_until(
        lambda: browser.execute_script("return state.pongDue === null"), 3, "the pong", browser
    )

    # A subscription the server could not make for now ("try again") is asked for again.
    browser.execute_script(FAKE_SOCKET, "try again")
    global_topic = "leaderboard:main:global:alltime"

    def asked() -> int:
        sent = fake(browser, "sent")
        return sum(m == {"op": "subscribe", "topic": global_topic} for m in sent)

    wait_until(lambda: asked() == 2, 6, "the subscription asked for again", browser)

    # A socket that answers nothing is taken for dead after a ping and ten seconds, and the
    # page reconnects.
    browser.execute_script(FAKE_SOCKET, "silent")
    wait_until(lambda: fake(browser, "opens") == 2, 45, "a new socket", browser)
    assert {"op": "ping"} in fake(browser, "sent")
    assert fake(browser, "closedBy") == "no pong"

    # A server that accepts the socket and closes it at once (1013): the delays grow, they do
    # not start again at half a second each time the socket opens.
    browser.execute_script(FAKE_SOCKET, "1013")
    time.sleep(8)
    opens = fake(browser, "opens")
    assert 2 <= opens <= 6, opens
    # Refused by policy (1008): the longest delay, and the reason shown.
    browser.execute_script("window.__fake.mode = '1008'")
    wait_until(lambda: "1008" in text_of(browser, "#status"), 20, "the refusal shown", browser)
    assert "this Origin is not allowed" in text_of(browser, "#status")
    assert "reconnecting in 15.0 s" in text_of(browser, "#status")
    refused_at = fake(browser, "opens")
    time.sleep(5)
    assert fake(browser, "opens") == refused_at
