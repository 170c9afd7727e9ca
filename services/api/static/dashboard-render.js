// The dashboard's tables: each view rendered into its table, rows that changed flashing, and
// players' names looked up where a view carries only ids.
"use strict";

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

// Names are the board's (a choice of board starts them afresh), at most MAX_NAMES of them.
async function lookUp(userId) {
  const view = state.view;
  keep(state.lookups, userId, Date.now());
  state.inFlight += 1;
  try {
    const path = boardPath(`/users/${encodeURIComponent(userId)}?scope=global&around=0`);
    const standing = await getJSON(path);
    const me = standing.around.find((e) => e.user_id === userId);
    if (me && me.display_name && view === state.view) {
      keep(state.names, userId, me.display_name);
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

// A name learnt from a board's entries shows in the other tables too (hot streaks, MVPs, the
// feed may hold the player by id, its look-up having come before the merge): shown again.
function remember(entries) {
  let learnt = false;
  for (const e of entries) {
    if (!e.user_id || !e.display_name) continue;
    // A name the page did not have: one it had differently (an entry of a view not pushed
    // since a rename) is kept as the newest, and draws nothing again, or two views would
    // take turns.
    learnt ||= !state.names.has(e.user_id);
    keep(state.names, e.user_id, e.display_name);
  }
  if (learnt) scheduleRename();
}

// An event's value: on an incr board what it adds (+40, −90), on best and set the score sent.
function valueText(value) {
  if (state.boards.get(state.board)?.operator !== "incr") return number.format(value);
  return value < 0 ? `−${number.format(-value)}` : `+${number.format(value)}`;
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

// The panels of views the board does not keep (teams and MVPs off incr boards) say so, dimmed.
function markPanels() {
  const operator = state.boards.get(state.board)?.operator;
  for (const name of INCR_ONLY) {
    const panel = document.getElementById(`panel-${name}`);
    const wasOff = panel.classList.contains("off");
    panel.classList.toggle("off", !kept(name));
    if (!kept(name)) fill(name, [], `kept on incr boards only (this board's operator is ${operator})`);
    else if (wasOff) document.getElementById(name).replaceChildren(); // until its read answers
  }
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
      // An event is its user and id (an id belongs to its board and user).
      key: `${e.event_id}:${e.user_id}`,
      robot: isRobot(e.user_id),
      cells: [
        [new Date(e.occurred_at).toLocaleTimeString(), "muted"],
        [nameOf(e.user_id), "name"],
        [e.region, "muted"],
        [valueText(e.value), "num"],
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
