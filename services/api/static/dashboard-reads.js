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

// A failed read says why in its table and is tried again, once at a time, until it answers or
// the board changes: a view does not wait for the next push to recover.
function retryLater(name, again) {
  const board = state.board;
  clearTimeout(state.retries.get(name));
  state.retries.set(
    name,
    setTimeout(() => {
      state.retries.delete(name);
      if (board === state.board) again();
    }, RETRY_MS),
  );
}

async function load(name) {
  const board = state.board;
  try {
    const view = await readers[name]();
    if (board !== state.board) return;
    if (name === "players") noteEnd(view);
    show(name, view);
  } catch (error) {
    if (board !== state.board) return;
    console.warn(name, error.message);
    renderError(name, error);
    retryLater(name, () => load(name));
  }
}

async function loadRegion(region) {
  const board = state.board;
  const scope = `region:${region}`;
  try {
    const view = await getJSON(
      boardPath(`/leaderboard?scope=${encodeURIComponent(scope)}&period=${state.period}&limit=5`),
    );
    if (board === state.board) show(scope, view);
  } catch (error) {
    if (board !== state.board) return;
    console.warn(scope, error.message);
    retryLater(scope, () => loadRegion(region));
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
