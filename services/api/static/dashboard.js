// Ladder's dashboard: one page, no build step, no library. It reads the current state over REST
// when it opens, then moves with the WebSocket's pushes (no polling):
//
//   leaderboard:{board}:global:{period}     top players
//   leaderboard:{board}:region:{r}:{period} each region's top (regions seen in the feed)
//   leaderboard:{board}:hot:10 / hot:60     hot streaks
//   leaderboard:{board}:mvps:{period}       team MVPs
//
// A board with a schedule also offers the period `season`; a countdown shows when the chosen
// period ends (from the global read's `period_ends_at`) and everything is read again at zero.
//
// Views that have no topic of their own (top teams, the activity feed, the counts) are read
// again over REST after a push arrives, at most once a second. On `resync`, and after the socket
// comes back (it reconnects with a growing, jittered delay, reset only once a socket stayed open
// STABLE_MS), everything is read again. The socket is pinged every PING_MS and taken for dead
// when nothing answers within PONG_MS. Teams and MVPs are read on incr boards only.
// The page carries no credential: public reads need none.
//
// The page loads dashboard-reads.js (state and REST), dashboard-render.js (the tables), then this
// file (the socket, the period's countdown, the choice of board and period, the start).
"use strict";

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
    // The backoff is not reset here: a server that accepts and then closes at once (a refused
    // Origin, 1008; "try again", 1013) would be asked again every half second.
    state.openedAt = Date.now();
    state.topics = new Set();
    state.outbox = [];
    state.pinger = setInterval(() => ping(socket), PING_MS);
    resubscribe();
    loadAll(); // whatever changed while the socket was away
    setStatus("live", "live");
  });
  socket.addEventListener("message", (event) => {
    if (state.socket !== socket) return;
    clearTimeout(state.pongDue); // anything from the server says the socket is alive
    state.pongDue = null;
    onMessage(JSON.parse(event.data));
  });
  socket.addEventListener("close", (event) => {
    lost(socket, event.reason ? `${event.code}: ${event.reason}` : String(event.code), event.code);
  });
}

// A half-open socket (the network gone without a word) would stay "live" forever: a ping
// unanswered within PONG_MS closes it, and the page reconnects as after any close.
function ping(socket) {
  if (state.socket !== socket || socket.readyState !== WebSocket.OPEN || state.pongDue !== null) {
    return;
  }
  socket.send(JSON.stringify({ op: "ping" }));
  state.pongDue = setTimeout(() => {
    lost(socket, `no answer to a ping within ${PONG_MS / 1000} s`, null);
    socket.close(4000, "no pong");
  }, PONG_MS);
}

// The socket is gone: reconnect after the backoff, or after the longest delay when the server
// refused the socket by policy (1008: a foreign Origin, say), saying why.
function lost(socket, why, code) {
  if (state.socket !== socket) return;
  state.socket = null;
  clearInterval(state.pinger);
  clearTimeout(state.pongDue);
  state.pinger = state.pongDue = null;
  clearTimeout(state.sending);
  state.sending = null;
  if (state.openedAt !== null && Date.now() - state.openedAt >= STABLE_MS) state.attempt = 0;
  state.openedAt = null;
  const delay = code === 1008 ? MAX_BACKOFF_MS : backoff(state.attempt);
  state.attempt += 1;
  setStatus("reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)} s (closed ${why})`);
  setTimeout(connect, delay);
}

function onMessage(message) {
  if (message.type === "resync") {
    loadAll();
    return;
  }
  if (message.type === "error") {
    console.warn("websocket:", message.detail, message.topic || "");
    // The server could not make the subscription for now (Redis busy): ask again later.
    if (message.op === "subscribe" && message.detail === "try again" && message.topic) {
      retrySubscription(message.topic);
    }
    return;
  }
  if (message.type !== "leaderboard" || message.board_id !== state.board) return;
  const scope = message.scope;
  if (scope === "hot") {
    show(`hot${message.window}`, message);
  } else if (message.period !== state.period || olderPeriod(message.period_id)) {
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

function retrySubscription(topic) {
  state.topics.delete(topic);
  const socket = state.socket;
  setTimeout(() => {
    const open = state.socket === socket && socket?.readyState === WebSocket.OPEN;
    if (open && topicsOf().includes(topic)) subscribe(topic);
  }, RETRY_MS);
}

function discoverRegion(region) {
  if (!region || state.regions.has(region)) return;
  state.regions.add(region);
  loadRegion(region);
  if (state.socket && state.socket.readyState === WebSocket.OPEN) resubscribe();
}

// -- the period's countdown --------------------------------------------------------------------
// The global read's `period_ends_at` says when the period ends; the countdown ticks each second.
// At zero a new period has begun (empty): everything is read again, then again every
// REREAD_MS while the read still names the old end (the page's clock may run ahead).

const REREAD_MS = 2000;

function noteEnd(view) {
  state.endsAt = view.period_ends_at ? Date.parse(view.period_ends_at) : null;
  state.periodId = view.period_id;
  tick();
}

// A late push of a period already over (the merge of its last moments) is not shown over the
// next one's; ids of one kind sort as their periods do.
function olderPeriod(periodId) {
  return Boolean(periodId && state.periodId && periodId < state.periodId);
}

function remaining(ms) {
  const s = Math.floor(ms / 1000);
  const pad = (n) => String(n).padStart(2, "0");
  const clock = `${pad(Math.floor(s / 3600) % 24)}:${pad(Math.floor(s / 60) % 60)}:${pad(s % 60)}`;
  return s >= 86400 ? `${Math.floor(s / 86400)}d ${clock}` : clock;
}

function tick() {
  const out = $("#countdown");
  if (state.endsAt === null) {
    out.textContent = "";
    return;
  }
  const left = state.endsAt - Date.now();
  if (left > 0) {
    out.textContent = `${state.period} ends in ${remaining(left)}`;
    return;
  }
  out.textContent = `${state.period} ended; the next begins`;
  if (Date.now() - state.rereadAt < REREAD_MS) return;
  state.rereadAt = Date.now();
  state.previous = new Map(); // a new period starts empty: no moves from the last one
  loadAll();
}

setInterval(tick, 1000);

// -- choosing a board and a period --------------------------------------------------------------

function choose(board, period) {
  state.view += 1; // reads (and their retries) of the previous choice are dropped
  for (const timer of state.retries.values()) clearTimeout(timer);
  state.retries = new Map();
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
  state.endsAt = null;
  state.periodId = null;
  state.names = new Map(); // a name is the board's
  state.lookups = new Map();
  tick();
  markPanels();
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
  if (board) choose(board, query.get("period") || "alltime");
  connect();
}

// The list of boards unreadable (the API away): tried again with a growing delay.
function begin() {
  start().catch((error) => {
    const delay = backoff(state.startAttempt, RETRY_MS);
    state.startAttempt += 1;
    setStatus("reconnecting", `cannot start: ${error.message}; again in ${(delay / 1000).toFixed(1)} s`);
    setTimeout(begin, delay);
  });
}

$("#board").addEventListener("change", (e) => choose(e.target.value, state.period));
$("#period").addEventListener("change", (e) => choose(state.board, e.target.value));
begin();
