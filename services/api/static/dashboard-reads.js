// The dashboard's shared state and its REST reads (dashboard.js says how the page works). Loaded
// first; dashboard-render.js and dashboard.js use what it declares.
"use strict";

const PERIODS = ["alltime", "monthly", "weekly", "daily", "season"]; // season: boards with a schedule
const DEFAULT_BOARD = "arena";
const REFRESH_MS = 1000;
const NAME_RETRY_MS = 10000; // a player not found yet (not merged yet) is looked up again after this
const MAX_LOOKUPS = 8; // name look-ups in flight at once
const SEND_GAP_MS = 150; // stay well inside the socket's message rate
const MAX_BACKOFF_MS = 15000;
const RETRY_MS = 2000; // a read that failed (the API restarting, say) is tried again after this
const STABLE_MS = 5000; // a socket open this long resets the reconnection's backoff
const PING_MS = 25000; // the socket is pinged this often ...
const PONG_MS = 10000; // ... and, with no answer within this, taken for dead
const MAX_NAMES = 5000; // names (and look-ups) remembered; the oldest go past this
const INCR_ONLY = new Set(["teams", "mvps"]); // views kept on incr boards only (sums of members)

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
  endsAt: null, // when the shown period ends (ms since the epoch), from the global read; null: never
  periodId: null, // the period id of the global read
  rereadAt: 0, // when the countdown last re-read at its end
  retries: new Map(), // view name -> the timer of its next try after a failed read
  view: 0, // the choice of board and period, counted: a read answering an older one is dropped
  openedAt: null, // when the current socket opened
  pinger: null, // the timer of the socket's pings
  pongDue: null, // the timer that takes the socket for dead unless something arrives first
  startAttempt: 0, // failed starts in a row (the board list unreadable)
};

const $ = (selector) => document.querySelector(selector);

// -- REST ---------------------------------------------------------------------------------------

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
    const error = new Error(problem.detail || `${path}: ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

// The API away (no answer), busy (429) or failing (5xx) may answer later; any other refusal (a
// board deleted: 404; a view the board does not keep: 422) would answer the same again.
function worthRetrying(error) {
  return error.status === undefined || error.status === 429 || error.status >= 500;
}

// The growing, jittered delay after `attempt` failures: first/2 to first, doubling, up to
// MAX_BACKOFF_MS.
function backoff(attempt, first = 500) {
  return Math.min(MAX_BACKOFF_MS, first * 2 ** attempt) * (0.5 + Math.random() / 2);
}

// A bounded map: `key` set (as the newest), the oldest dropped past MAX_NAMES.
function keep(map, key, value) {
  map.delete(key);
  map.set(key, value);
  if (map.size > MAX_NAMES) map.delete(map.keys().next().value);
}

// Teams and MVPs are sums over teams' members, kept on incr boards only (the API answers 422
// elsewhere): on other boards they are neither read nor followed.
function kept(name) {
  return !INCR_ONLY.has(name) || state.boards.get(state.board)?.operator === "incr";
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

// A failed read says why in its table and, if another try may answer, is tried again, once at a
// time, until it answers or the board or period changes: a view does not wait for the next push
// to recover. Every read is of one choice of board and period (`state.view`): its answer, or its
// retry, is dropped once another is chosen, so that a late answer never shows the wrong period.
function retryLater(name, again, error) {
  clearTimeout(state.retries.get(name));
  state.retries.delete(name);
  if (!worthRetrying(error)) return;
  const view = state.view;
  state.retries.set(
    name,
    setTimeout(() => {
      state.retries.delete(name);
      if (view === state.view) again();
    }, RETRY_MS),
  );
}

async function load(name) {
  if (!kept(name)) return;
  const view = state.view;
  try {
    const answer = await readers[name]();
    if (view !== state.view) return;
    if (name === "players") noteEnd(answer);
    show(name, answer);
  } catch (error) {
    if (view !== state.view) return;
    console.warn(name, error.message);
    renderError(name, error);
    retryLater(name, () => load(name), error);
  }
}

async function loadRegion(region) {
  const view = state.view;
  const scope = `region:${region}`;
  try {
    const answer = await getJSON(
      boardPath(`/leaderboard?scope=${encodeURIComponent(scope)}&period=${state.period}&limit=5`),
    );
    if (view === state.view) show(scope, answer);
  } catch (error) {
    if (view !== state.view) return;
    console.warn(scope, error.message);
    retryLater(scope, () => loadRegion(region), error);
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
