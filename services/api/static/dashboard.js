// Ladder's dashboard: one page, no build step, no library. It reads the current state over REST
// when it opens, then moves with the WebSocket's pushes (no polling):
//
//   leaderboard:{board}:global:{period}     top players
//   leaderboard:{board}:region:{r}:{period} each region's top (regions seen in the feed)
//   leaderboard:{board}:hot:10 / hot:60     hot streaks
//   leaderboard:{board}:mvps:{period}       team MVPs
//
// Views that have no topic of their own (top teams, the activity feed, the counts) are read
// again over REST after a push arrives, at most once a second. On `resync`, and after the socket
// comes back (it reconnects with a growing, jittered delay), everything is read again.
// The page carries no credential: public reads need none.
"use strict";

const PERIODS = ["alltime", "monthly", "weekly", "daily"];
const DEFAULT_BOARD = "arena";
const REFRESH_MS = 1000;
const NAME_RETRY_MS = 10000; // a player not found yet (not merged yet) is looked up again after this
const MAX_LOOKUPS = 8; // name look-ups in flight at once
const SEND_GAP_MS = 150; // stay well inside the socket's message rate
const MAX_BACKOFF_MS = 15000;

const state = {
  board: null,
  boards: new Map(),
  period: "alltime",
  regions: new Set(),
  names: new Map(),
  socket: null,
  topics: new Set(),
  attempt: 0,
  refreshTimer: null,
  outbox: [],
  sending: null,
  previous: new Map(),
  shown: new Map(), // the last view each table showed, to show again once names are known
  lookups: new Map(), // user_id -> when its name was last looked up
  inFlight: 0,
  renameTimer: null,
};

const $ = (selector) => document.querySelector(selector);

// -- REST ---------------------------------------------------------------------------------------

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
    throw new Error(problem.detail || `${path}: ${response.status}`);
  }
  return response.json();
}

function boardPath(suffix) {
  return `/v1/boards/${encodeURIComponent(state.board)}${suffix}`;
}

const readers = {
  // A hundred, so that the names of players in the other views are known too; ten are shown.
  players: () => getJSON(boardPath(`/leaderboard?scope=global&period=${state.period}&limit=100`)),
  teams: () => getJSON(boardPath(`/leaderboard?scope=teams&period=${state.period}&limit=10`)),
  hot10: () => getJSON(boardPath("/hot?window=10")),
  hot60: () => getJSON(boardPath("/hot?window=60")),
  mvps: () => getJSON(boardPath(`/mvps?period=${state.period}`)),
  feed: () => getJSON(boardPath("/feed?limit=15")),
  stats: () => getJSON(boardPath(`/stats?period=${state.period}`)),
};

async function load(name) {
  const board = state.board;
  try {
    const view = await readers[name]();
    if (board === state.board) show(name, view);
  } catch (error) {
    if (board === state.board) renderError(name, error);
  }
}

async function loadRegion(region) {
  const board = state.board;
  try {
    const scope = `region:${region}`;
    const view = await getJSON(
      boardPath(`/leaderboard?scope=${encodeURIComponent(scope)}&period=${state.period}&limit=5`),
    );
    if (board === state.board) show(`region:${region}`, view);
  } catch (error) {
    console.warn("region", region, error);
  }
}

function loadAll() {
  for (const name of Object.keys(readers)) load(name);
  for (const region of state.regions) loadRegion(region);
}

// Views without a topic follow the pushes of the others, at most once per REFRESH_MS.
function scheduleRefresh() {
  if (state.refreshTimer !== null) return;
  state.refreshTimer = setTimeout(() => {
    state.refreshTimer = null;
    load("teams");
    load("feed");
    load("stats");
  }, REFRESH_MS);
}

// -- rendering ----------------------------------------------------------------------------------

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function show(name, view) {
  state.shown.set(name, view);
  if (name.startsWith("region:")) renderRegion(name.slice("region:".length), view.entries);
  else renderers[name](view);
}

// Hot streaks, MVPs and the feed carry user ids only: names come from the boards' entries, or
// are looked up once (the player's global standing) and the tables shown again with them.
function nameOf(userId) {
  const known = state.names.get(userId);
  if (known) return known;
  const last = state.lookups.get(userId);
  if (state.inFlight < MAX_LOOKUPS && (last === undefined || Date.now() - last > NAME_RETRY_MS)) {
    lookUp(userId);
  }
  return userId;
}

async function lookUp(userId) {
  state.lookups.set(userId, Date.now());
  state.inFlight += 1;
  try {
    const path = boardPath(`/users/${encodeURIComponent(userId)}?scope=global&around=0`);
    const standing = await getJSON(path);
    const me = standing.around.find((e) => e.user_id === userId);
    if (me && me.display_name) {
      state.names.set(userId, me.display_name);
      scheduleRename();
    }
  } catch (error) {
    // Not on the merged board yet: tried again later.
  } finally {
    state.inFlight -= 1;
  }
}

function scheduleRename() {
  if (state.renameTimer !== null) return;
  state.renameTimer = setTimeout(() => {
    state.renameTimer = null;
    for (const [name, view] of state.shown) show(name, view);
  }, 300);
}

function remember(entries) {
  for (const e of entries) if (e.user_id && e.display_name) state.names.set(e.user_id, e.display_name);
}

// Rows are keyed; a row whose key or value changed since the last render flashes.
function fill(tableId, rows, empty) {
  const table = document.getElementById(tableId);
  // The first render of a table flashes nothing: only changes do.
  const before = state.previous.get(tableId);
  const after = new Map();
  const body = document.createElement("tbody");
  rows.forEach((row, i) => {
    const tr = document.createElement("tr");
    tr.dataset.key = row.key;
    const signature = row.cells.map((c) => c[0]).join("|");
    after.set(row.key, [i, signature]);
    const seen = before?.get(row.key);
    if (before && (!seen || seen[0] !== i || seen[1] !== signature)) tr.className = "moved";
    for (const [text, className] of row.cells) tr.appendChild(cell(text, className));
    if (row.robot) tr.classList.add("robot");
    body.appendChild(tr);
  });
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    tr.appendChild(cell(empty, "empty"));
    body.appendChild(tr);
  }
  table.replaceChildren(body);
  state.previous.set(tableId, after);
}

const number = new Intl.NumberFormat();
const isRobot = (userId) => userId.startsWith("bot-");

function playerRows(entries) {
  remember(entries);
  return entries.map((e) => ({
    key: e.user_id,
    robot: isRobot(e.user_id),
    cells: [[e.rank, "rank"], [nameOf(e.user_id), "name"], [number.format(e.score), "num"]],
  }));
}

function renderError(name, error) {
  const tableId = name === "stats" ? null : name;
  if (tableId && document.getElementById(tableId)) fill(tableId, [], String(error.message));
}

const renderers = {
  players(view) {
    fill("players", playerRows(view.entries).slice(0, 10), "no scores yet");
  },
  teams(view) {
    const rows = view.entries.map((e) => ({
      key: e.team_id,
      cells: [[e.rank, "rank"], [e.team_id, "name"], [number.format(e.score), "num"]],
    }));
    fill("teams", rows, "no teams yet");
  },
  hot10(view) {
    renderHot("hot10", view.entries);
  },
  hot60(view) {
    renderHot("hot60", view.entries);
  },
  mvps(view) {
    const rows = view.entries.map((e) => ({
      key: e.user_id,
      robot: isRobot(e.user_id),
      cells: [
        [e.rank, "rank"],
        [nameOf(e.user_id), "name"],
        [e.team_id, "name muted"],
        [`${(100 * e.share).toFixed(1)}%`, "num"],
      ],
    }));
    fill("mvps", rows, "no team scores yet");
  },
  feed(view) {
    const rows = view.events.map((e) => ({
      key: e.event_id,
      robot: isRobot(e.user_id),
      cells: [
        [new Date(e.occurred_at).toLocaleTimeString(), "muted"],
        [nameOf(e.user_id), "name"],
        [e.region, "muted"],
        [`+${number.format(e.value)}`, "num"],
      ],
    }));
    fill("feed", rows, "nothing yet");
    for (const e of view.events) discoverRegion(e.region);
  },
  stats(view) {
    $("#stats").textContent =
      `${number.format(view.players)} players · ${number.format(view.events)} scores (${view.period_id})`;
  },
};

function renderHot(tableId, entries) {
  const rows = entries.map((e) => ({
    key: e.user_id,
    robot: isRobot(e.user_id),
    cells: [[e.rank, "rank"], [nameOf(e.user_id), "name"], [e.score.toFixed(1), "num"]],
  }));
  fill(tableId, rows, "nobody in this window");
}

function renderRegion(region, entries) {
  let box = document.getElementById(`region-${region}`);
  if (!box) {
    box = document.createElement("div");
    box.id = `region-${region}`;
    const title = document.createElement("h3");
    title.textContent = region;
    const table = document.createElement("table");
    table.id = `region-table-${region}`;
    box.append(title, table);
    const boxes = [...$("#regions").children, box].sort((a, b) => a.id.localeCompare(b.id));
    $("#regions").replaceChildren(...boxes);
  }
  fill(`region-table-${region}`, playerRows(entries.slice(0, 5)), "no scores");
}

// -- the WebSocket ------------------------------------------------------------------------------

function topicsOf() {
  const b = state.board;
  const topics = [
    `leaderboard:${b}:global:${state.period}`,
    `leaderboard:${b}:hot:10`,
    `leaderboard:${b}:hot:60`,
  ];
  if (state.boards.get(b)?.operator === "incr") topics.push(`leaderboard:${b}:mvps:${state.period}`);
  for (const region of state.regions) topics.push(`leaderboard:${b}:region:${region}:${state.period}`);
  return topics;
}

// Client messages leave one at a time, spaced, so a board change never floods the socket.
function send(message) {
  state.outbox.push(JSON.stringify(message));
  if (state.sending === null) pump();
}

function pump() {
  const socket = state.socket;
  if (!state.outbox.length || !socket || socket.readyState !== WebSocket.OPEN) {
    state.sending = null;
    return;
  }
  socket.send(state.outbox.shift());
  state.sending = setTimeout(pump, SEND_GAP_MS);
}

function subscribe(topic) {
  if (state.topics.has(topic)) return;
  state.topics.add(topic);
  send({ op: "subscribe", topic });
}

function resubscribe() {
  const wanted = new Set(topicsOf());
  for (const topic of state.topics) {
    if (!wanted.has(topic)) send({ op: "unsubscribe", topic });
  }
  state.topics = new Set([...state.topics].filter((t) => wanted.has(t)));
  for (const topic of wanted) subscribe(topic);
}

function setStatus(kind, text) {
  const status = $("#status");
  status.dataset.state = kind;
  status.textContent = text;
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/v1/ws`);
  state.socket = socket;
  setStatus("connecting", "connecting…");
  socket.addEventListener("open", () => {
    state.attempt = 0;
    state.topics = new Set();
    state.outbox = [];
    resubscribe();
    loadAll(); // whatever changed while the socket was away
    setStatus("live", "live");
  });
  socket.addEventListener("message", (event) => onMessage(JSON.parse(event.data)));
  socket.addEventListener("close", (event) => {
    if (state.socket !== socket) return;
    state.socket = null;
    clearTimeout(state.sending);
    state.sending = null;
    const delay = Math.min(MAX_BACKOFF_MS, 500 * 2 ** state.attempt) * (0.5 + Math.random() / 2);
    state.attempt += 1;
    setStatus("reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)} s (closed ${event.code})`);
    setTimeout(connect, delay);
  });
}

function onMessage(message) {
  if (message.type === "resync") {
    loadAll();
    return;
  }
  if (message.type === "error") {
    console.warn("websocket:", message.detail, message.topic || "");
    return;
  }
  if (message.type !== "leaderboard" || message.board_id !== state.board) return;
  const scope = message.scope;
  if (scope === "hot") {
    show(`hot${message.window}`, message);
  } else if (message.period !== state.period) {
    return;
  } else if (scope === "global") {
    show("players", message);
  } else if (scope === "mvps") {
    show("mvps", message);
  } else if (scope.startsWith("region:")) {
    show(scope, message);
  }
  scheduleRefresh();
}

function discoverRegion(region) {
  if (!region || state.regions.has(region)) return;
  state.regions.add(region);
  loadRegion(region);
  if (state.socket && state.socket.readyState === WebSocket.OPEN) resubscribe();
}

// -- choosing a board and a period --------------------------------------------------------------

function choose(board, period) {
  state.board = board;
  const periods = state.boards.get(board)?.periods || PERIODS;
  state.period = periods.includes(period) ? period : PERIODS.find((p) => periods.includes(p));
  const select = $("#period");
  select.replaceChildren(...PERIODS.filter((p) => periods.includes(p)).map((p) => new Option(p, p)));
  select.value = state.period;
  $("#board").value = board;
  const url = new URL(location.href);
  url.searchParams.set("board", board);
  url.searchParams.set("period", state.period);
  history.replaceState(null, "", url);
  state.regions = new Set();
  state.previous = new Map();
  state.shown = new Map();
  $("#regions").replaceChildren();
  $("#stats").textContent = "";
  if (state.socket && state.socket.readyState === WebSocket.OPEN) resubscribe();
  loadAll();
}

async function start() {
  const query = new URLSearchParams(location.search);
  const { boards } = await getJSON("/v1/boards");
  for (const b of boards) state.boards.set(b.board_id, b);
  const select = $("#board");
  select.replaceChildren(...boards.map((b) => new Option(b.board_id, b.board_id)));
  const wanted = query.get("board");
  const board = state.boards.has(wanted)
    ? wanted
    : state.boards.has(DEFAULT_BOARD)
      ? DEFAULT_BOARD
      : boards[0]?.board_id;
  select.addEventListener("change", () => choose(select.value, state.period));
  $("#period").addEventListener("change", (e) => choose(state.board, e.target.value));
  if (board) choose(board, query.get("period") || "alltime");
  connect();
}

start().catch((error) => setStatus("reconnecting", `cannot start: ${error.message}`));
