--[[
The aggregator's merged views (the global boards; docs/architecture.md).

Replace entries of a merged view, keeping its hash of records and distinct-score set right
(shared/ranking.py). KEYS: view, distinct, records. ARGV: expire-at (0: never), then fours of
id, signed score, tie key and metadata ('' for none; an empty score removes the id's entry).
Returns how many entries changed.
]]
local function put(keys, args)
  local v, at, changed = view_of(keys[1], keys[2], keys[3]), tonumber(args[1]), 0
  for j = 2, #args, 4 do
    local id, score, tie, meta = args[j], args[j + 1], args[j + 2], args[j + 3]
    local old = entry_in(v, id)
    if score == '' then
      if old then
        remove_entry(v, id, old)
        changed = changed + 1
      end
    elseif old == nil or old.signed ~= tonumber(score) or old.tie ~= tie or old.meta ~= meta then
      put_entry(v, id, old, tonumber(score), tie, meta)
      changed = changed + 1
    end
  end
  expire(keys, at)
  return changed
end

redis.register_function(FUNCTIONS.put, put)

--[[
The global merge (services/aggregator/merge.py), where the data is: a chunk of dirty marks of one
board period, each of whose users is combined from its records in the regions it played in
(combine() in services/aggregator/combine.py is the reference; the tests hold this to it) and
put in the global view.

KEYS: global view, its distinct set, its records, the set the marks are taken out of (the merging
set, or the dirty set for a round of fresh marks), the distinct set being built,
the board's dense marker, the board's hidden users, the board's merge lease, the board's
users' regions (shared/keys.py).
ARGV: expire-at (0: never; set only on those of the view's keys that have no expiry, so that a
period's keys keep the one they were made with after a change of retention), operator, the two ends
of a region view's records key (prefix, suffix: the key is prefix .. region .. suffix), the two
ends of a user's regions set of the layout before (read for a user the users' regions hash has no
field for yet), the two parts of a dirty mark (prefix, separator: the mark is prefix .. region ..
separator .. id), the marker's member for this scope ('global'), the token the caller holds the
lease with (lease.lua), how many users the marks name, then the marks in runs
(services/aggregator/marks.py in_runs()): how many runs, each run's region, each run's count of
marks, then the marks, as the merging set holds them, run by run, a run the marks of its region (a
user with marks in several regions has one in each of their runs). An error (FENCED) if the lease
is not held with that token: nothing is written. Returns {the ids whose global entry changed,
joined by '|' (which no id holds), ids whose sum was out of range (their entries held at the
range's end on the sum's side, reached when the latest of their regional entries was), how many
users were merged}. A user's field of the users' regions hash gains the regions where its marks
found a record that it lacks.

The distinct-score set is kept only where dense reads need it (kept_distinct()): the view's set
if it has one; else, if the marker names the scope, the set of a new view from its first member,
or the one the aggregator is building (dense_build below) for a view that has members.

This function builds key names, against common.lua's rule, from templates that shared/keys.py
made: which regions a user played in is read here (its field of the users' regions hash, with
its marks' regions), so the region keys are known only inside the call; passing them as KEYS
would take another round trip and a key per user and region. Every such key carries the
board's hash tag, the call stays in one slot.

Most users of a chunk played in one region and most records do not change: the function works
on records as the strings the hashes hold (tie|score|metadata, shared/ranking.py), so that a
user of one region takes its regional record as its global one as it is, and one whose global
record is that string already costs no write; records are split into fields (parsed()) only
where a combine or a replaced member needs them.
]]

-- A record's fields (shared/ranking.py), as entry_in() reads them; nil for none. Split with
-- plain finds: a pattern match costs several times as much.
local function parsed(rec, id)
  if not rec then return nil end
  local a = string.find(rec, '|', 1, true)
  local b = string.find(rec, '|', a + 1, true)
  local tie = string.sub(rec, 1, a - 1)
  return {tie = tie, member = tie .. id, signed = tonumber(string.sub(rec, a + 1, b - 1)),
          meta = string.sub(rec, b + 1), sub = sub_of(tie)}
end

-- The chunk's users from its runs of marks (mark j the j-th mark): c.ids (each user once, in
-- order of its first mark), c.user[j] (mark j's user, an index of c.ids; nil where each mark
-- names a user of its own: user j) and c.mark_ids[j] (its id), c.marked[i] (the first region a
-- mark of user i names), c.more[i] (a list of the others, if any), the runs (run k: marks
-- c.starts[k] to c.starts[k + 1] - 1, of region c.run_regions[k]) and c.first_mark (mark 1's
-- place in ARGV). A run's region says where its marks' ids start (no find, and no region cut
-- out, a mark); a table of ids tells a user's second mark only where there are fewer users
-- than marks.
local USERS, RUNS = 11, 12 -- merge()'s counts of users and of runs among its arguments

local function users_of(args)
  local sub, plen, seplen, runs = string.sub, #args[7], #args[8], tonumber(args[RUNS])
  local first_mark = RUNS + 2 * runs + 1
  local c = {ids = {}, marked = {}, more = {}, starts = {}, run_regions = {},
             first_mark = first_mark}
  local ids, marked, starts, n, m = c.ids, c.marked, c.starts, 0, 0
  local index, user, mark_ids = nil, nil, ids
  if tonumber(args[USERS]) < #args - first_mark + 1 then
    index, user, mark_ids = {}, {}, {}
    c.user = user
  end
  c.mark_ids = mark_ids
  for k = 1, runs do
    local region = args[RUNS + k]
    -- The run's count is a string: arithmetic reads it as a number without tonumber()'s call.
    local cut, last = plen + #region + seplen + 1, m + args[RUNS + runs + k]
    starts[k], c.run_regions[k] = m + 1, region
    for j = m + 1, last do
      local id = sub(args[first_mark + j - 1], cut)
      local i = index and index[id]
      if not i then
        n = n + 1
        ids[n], marked[n], i = id, region, n
      else
        c.more[i] = c.more[i] or {}
        c.more[i][#c.more[i] + 1] = region
      end
      if index then index[id], user[j], mark_ids[j] = i, i, id end
    end
    m = last
  end
  starts[runs + 1] = m + 1
  return c
end

-- Record rec of user i, found in region r: c.first[i] (the first found; its region is
-- c.first_region[i], or c.marked[i] where that is nil) or, past the first, one of the list
-- c.others[i] of {rec, region}.
local function add_record(c, i, rec, r)
  if c.first[i] == nil then
    c.first[i], c.first_region[i] = rec, r
  else
    c.others[i] = c.others[i] or {}
    c.others[i][#c.others[i] + 1] = {rec, r}
  end
end

-- The regions user i played in beyond those its marks name: those of its field of the users'
-- regions hash, or for a user with no field yet, of its set of the layout before. A region its
-- marks name where it has a record (read by then) but which the field lacks (the derive step
-- trailed) goes into the field here (t.fold, with the set of the layout before folded in and
-- gone, t.gone, as the derive step's add_regions() does): a later call given the user's mark
-- in another region then reads this one too, whichever call comes first.
local function unmarked(t, c, i, field)
  local legacy = not field and t.user_prefix .. c.ids[i] .. t.user_suffix
  local listed = field and regions_in(field) or redis.call('SMEMBERS', legacy)
  local seen, extra, all = {[c.marked[i]] = true}, {}, {}
  for _, r in ipairs(c.more[i] or {}) do seen[r] = true end
  for _, r in ipairs(listed) do
    if not all[r] then all[r], all[#all + 1] = true, r end
    if not seen[r] then seen[r], extra[#extra + 1] = true, r end
  end
  local n, found = #all, {c.first[i] ~= nil and (c.first_region[i] or c.marked[i]) or nil}
  for _, o in ipairs(c.others[i] or {}) do found[#found + 1] = o[2] end
  for _, r in ipairs(found) do
    if not all[r] then all[r], all[#all + 1] = true, r end
  end
  if #all > n then
    table.sort(all, bytes_less)
    local f = #t.fold
    t.fold[f + 1], t.fold[f + 2] = c.ids[i], table.concat(all, ' ')
    if legacy and #listed > 0 then t.gone[#t.gone + 1] = legacy end
  end
  return extra
end

-- Each user's regional records, as stored (add_record() says where), from the regions it played
-- in: those its marks name (so a mark is merged even if the derive step trailed, and its region
-- noted in the user's field, unmarked()), one HMGET a run of marks, and those of its field of the
-- users' regions hash (one HMGET for the chunk) that its marks do not, one HMGET a region of such
-- users. A region without a record of the user (never in this period, or its view expired) adds
-- nothing. Most users played in the one region their mark names, which is their field as it is:
-- nothing more to read, nothing to note.
local function read_records(t, c)
  local ids, mark_ids, user, starts, marked, more = c.ids, c.mark_ids, c.user, c.starts,
                                                    c.marked, c.more
  local first, first_region = {}, {}
  c.first, c.first_region, c.others = first, first_region, {}
  local fields = redis.call('HMGET', t.users_regions, unpack(ids))
  for k = 1, #c.run_regions do
    local r, s, e = c.run_regions[k], starts[k], starts[k + 1] - 1
    local recs = redis.call('HMGET', t.region_prefix .. r .. t.region_suffix,
                            unpack(mark_ids, s, e))
    for j = s, e do
      local rec, i = recs[j - s + 1], user and user[j] or j
      if rec then
        if first[i] ~= nil then
          add_record(c, i, rec, r)
        else
          -- A user of one mark (most) finds its first record in that mark's run, of region
          -- c.marked[i]: the region is kept only where some user has several marks.
          first[i] = rec
          if user then first_region[i] = r end
        end
      end
    end
  end
  local by_region, order = {}, {}
  for i = 1, #ids do
    if fields[i] ~= marked[i] or more[i] then
      for _, r in ipairs(unmarked(t, c, i, fields[i])) do
        if not by_region[r] then by_region[r], order[#order + 1] = {}, r end
        by_region[r][#by_region[r] + 1] = i
      end
    end
  end
  if #t.fold > 0 then redis.call('HSET', t.users_regions, unpack(t.fold)) end
  if #t.gone > 0 then redis.call('DEL', unpack(t.gone)) end
  for _, r in ipairs(order) do
    local at, wanted = by_region[r], {}
    for k, i in ipairs(at) do wanted[k] = ids[i] end
    local recs = redis.call('HMGET', t.region_prefix .. r .. t.region_suffix, unpack(wanted))
    for k, i in ipairs(at) do
      if recs[k] then add_record(c, i, recs[k], r) end
    end
  end
end

-- User i's global record combined from its regional ones (two or more: c.first[i] and
-- c.others[i]), then whether it is a sum past the range (held at the range's end). On set the
-- latest is the entry written last (written_of(): its record's written time, kept beside its
-- reach time, goes with it into the global record, as the meta field).
local function combined_record(op, c, i)
  local entries, first = {}, {c.first[i], c.first_region[i] or c.marked[i]}
  for _, found in ipairs({first, unpack(c.others[i])}) do
    local e = parsed(found[1], c.ids[i])
    e.region = found[2]
    e.time = op == 'set' and written_of(e) or tonumber(string.sub(e.tie, -12), 16)
    entries[#entries + 1] = e
  end
  local signed, tie, meta, past = combined(op, entries)
  return record_of(tie, signed, meta), past
end

-- One user's change to the global view, added to the batch w: its old record (as stored, nil
-- for none) out, its new one in (nil: none). Called only where the two differ.
local function plan_user(w, id, old_rec, rec)
  if rec == nil then
    local old = parsed(old_rec, id)
    w.removed[#w.removed + 1] = old.member
    w.dropped[#w.dropped + 1] = id
    if w.distinct then w.left[#w.left + 1] = old end
    return
  end
  -- Tie key and score compared as the strings the records hold, not parsed: tonumber() is libc's
  -- strtod, a good part of an entry's cost. Every record writes its score with fmt(), so equal
  -- scores are equal strings; were one not, the entry would only be written again as it is. Both
  -- cut out by one match (here cheaper than two finds and two cuts, counted), and a member (the
  -- tie key then the id) made only where it goes in or out.
  local match = string.match
  local tie, score = match(rec, '^([^|]*)|([^|]*)')
  local old_tie, old_score = nil, nil
  if old_rec then old_tie, old_score = match(old_rec, '^([^|]*)|([^|]*)') end
  if old_tie ~= tie or old_score ~= score then
    local added, n = w.added, #w.added
    added[n + 1], added[n + 2] = score, tie .. id
    if old_tie and old_tie ~= tie then w.removed[#w.removed + 1] = old_tie .. id end
  end
  local records, n = w.records, #w.records
  records[n + 1], records[n + 2] = id, rec
  if w.distinct then
    local old, signed, sub = parsed(old_rec, id), tonumber(score), sub_of(tie)
    if old == nil or old.signed ~= signed or old.sub ~= sub then
      w.pairs[#w.pairs + 1] = fmt(signed)
      w.pairs[#w.pairs + 1] = distinct_member(signed, sub)
      if old ~= nil then w.left[#w.left + 1] = old end
    end
  end
end

-- A hidden user's change (shared/lua/hide.lua): its record kept up to date, its member in no
-- view (taken out if there), so that showing it again puts back the very entry the merge made.
-- (Called only where the record changed.)
local function plan_hidden(w, id, old_rec, rec)
  local old = parsed(old_rec, id)
  if old ~= nil then
    w.removed[#w.removed + 1] = old.member
    if w.distinct then w.left[#w.left + 1] = old end
  end
  if rec == nil then
    w.dropped[#w.dropped + 1] = id
  else
    w.records[#w.records + 1] = id
    w.records[#w.records + 1] = rec
  end
end

-- A command on a key with a long flat list of arguments (items from items[first], the first
-- if not given), in calls of at most 4,000 (Lua's unpack() stops near 8,000); 4,000 keeps pairs
-- whole.
local function batched(command, key, items, first)
  for s = first or 1, #items, 4000 do
    redis.call(command, key, unpack(items, s, math.min(s + 3999, #items)))
  end
end

-- The batch's writes, as put_entry() and remove_entry() make them one by one: new members and
-- pairs added before old ones go (the distinct set is never emptied while the view has
-- members), then each old pair that nobody holds any more taken out of the distinct set
-- (w.distinct, nil where the view keeps none).
local function write_batch(v, w)
  batched('ZADD', v.view, w.added)
  if w.distinct then batched('ZADD', w.distinct, w.pairs) end
  batched('ZREM', v.view, w.removed)
  batched('HSET', v.ties, w.records)
  batched('HDEL', v.ties, w.dropped)
  local gone = {}
  for _, old in ipairs(w.left) do
    local pair = distinct_member(old.signed, old.sub)
    if not gone[pair] and not held(v.view, old.signed, old.sub) then
      gone[pair] = true
      redis.call('ZREM', w.distinct, pair)
    end
  end
end

-- Which distinct-score set the merge keeps for the global view (KEYS as merge()'s), nil for
-- none: the view's own if it has one; else, where the board is read densely (the marker names
-- the scope, marker_member), the view's own for a view not made yet (from its first member) or
-- the one being built for a view that has members.
local function kept_distinct(keys, marker_member)
  if redis.call('EXISTS', keys[2]) == 1 then return keys[2] end
  if redis.call('SISMEMBER', keys[6], marker_member) == 0 then return nil end
  if redis.call('EXISTS', keys[1]) == 0 then return keys[2] end
  return keys[5]
end

local function merge(keys, args)
  if not holds(keys[8], args[10]) then return fenced() end
  local v = view_of(keys[1], keys[2], keys[3])
  local t = {region_prefix = args[3], region_suffix = args[4], user_prefix = args[5],
             user_suffix = args[6], users_regions = keys[9], fold = {}, gone = {}}
  if #args < RUNS + 3 then return {'', {}, 0} end -- no marks
  local c = users_of(args)
  read_records(t, c)
  local olds = redis.call('HMGET', v.ties, unpack(c.ids))
  local w = {added = {}, pairs = {}, removed = {}, records = {}, dropped = {}, left = {},
             distinct = kept_distinct(keys, args[9])}
  -- Most boards hide nobody: asking whether the set is there costs less than asking for each id.
  local hidden = {}
  if redis.call('EXISTS', keys[7]) == 1 then
    hidden = redis.call('SMISMEMBER', keys[7], unpack(c.ids))
  end
  -- The ids whose entry changed are gathered at the front of ids as the loop walks it (each id
  -- read before its place is written): no table of them to grow, and one string to reply.
  local ids, refused, op, first, others, changed = c.ids, {}, args[2], c.first, c.others, 0
  for i = 1, #ids do -- (a numeric loop: ipairs() is a call from Lua a step)
    local id = ids[i]
    -- A user with one record (most) takes it as it is.
    local rec = first[i]
    if others[i] then
      local past
      rec, past = combined_record(op, c, i)
      -- A sum past the exact range is held at the range's end; the caller logs the user.
      if past then refused[#refused + 1] = id end
    end
    if rec ~= olds[i] and (rec ~= nil or olds[i]) then
      if hidden[i] == 1 then
        plan_hidden(w, id, olds[i] or nil, rec)
      else
        plan_user(w, id, olds[i] or nil, rec)
        changed = changed + 1
        ids[changed] = id
      end
    end
  end
  write_batch(v, w)
  -- The marks go in the step that merged them: a crash leaves them, never loses them.
  batched('SREM', keys[4], args, c.first_mark)
  local made = {keys[1], keys[3]}
  if w.distinct then made[3] = w.distinct end
  expire_new(made, tonumber(args[1]))
  return {table.concat(ids, '|', 1, changed), refused, #ids}
end

redis.register_function(FUNCTIONS.merge, merge)
