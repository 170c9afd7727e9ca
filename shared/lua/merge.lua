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
ARGV: expire-at (0: never), operator, the two ends of a region view's records key (prefix,
suffix: the key is prefix .. region .. suffix), the two ends of a user's regions set of the
layout before (read for a user the users' regions hash has no field for yet), the two
parts of a dirty mark (prefix, separator: the mark is prefix .. region .. separator .. id), the
marker's member for this scope ('global'), the token the caller holds the lease with (lease.lua),
then the marks, as the merging set holds them. An error (FENCED) if the lease is not held with
that token: nothing is written. Returns {ids whose global entry changed, ids whose sum was out of
range, the regions the marks name, how many users were merged}.

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

local B32 = 4294967296
local HI = 2097152 -- 2**21: |total| <= 2**53 - 1 = (2**21 - 1) * 2**32 + (2**32 - 1)

-- The exact sum of signed scores, each within +-(2**53 - 1), or nil past that range. Doubles
-- add integers exactly only below 2**53: each score is split at 2**32, and the parts summed.
local function exact_sum(entries)
  local hi, lo = 0, 0
  for _, e in ipairs(entries) do
    local h = math.floor(e.signed / B32)
    hi, lo = hi + h, lo + (e.signed - h * B32)
  end
  local carry = math.floor(lo / B32)
  hi, lo = hi + carry, lo - carry * B32 -- now 0 <= lo < 2**32
  if hi >= HI or hi < -HI or (hi == -HI and lo == 0) then return nil end
  return hi * B32 + lo
end

-- Whether entry a comes before b where combine() takes the first of equals: regions in
-- Python's sorted order.
local function before(a, b) return bytes_less(a.region, b.region) end

-- A user's global entry (signed, tie, meta) from its regional ones (at least one), as
-- combine() makes it; nil for a sum out of range.
local function combined(op, entries)
  local pick = entries[1]
  if #entries == 1 then return pick.signed, pick.tie, pick.meta end
  if op == 'best' then
    for i = 2, #entries do
      local e = entries[i]
      if e.signed > pick.signed or (e.signed == pick.signed and (bytes_less(pick.tie, e.tie)
          or (e.tie == pick.tie and before(e, pick)))) then pick = e end
    end
    return pick.signed, pick.tie, pick.meta
  end
  -- The latest reached: the smallest time part (the tie key's last 12 hex digits).
  for i = 2, #entries do
    local e = entries[i]
    if e.time < pick.time or (e.time == pick.time and before(e, pick)) then pick = e end
  end
  if op == 'set' then return pick.signed, pick.tie, pick.meta end
  local total = exact_sum(entries)
  if total == nil then return nil end
  return total, string.sub(pick.tie, -12), pick.meta
end

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

-- The chunk's users from its marks (ARGV from 10): c.ids (in order of their first mark),
-- c.marked[i] (the first region a mark of user i names), c.more[i] (a list of the others, if
-- any), and c.regions (each region the marks name, once).
local FIRST_MARK = 11 -- merge()'s first mark among its arguments

local function users_of(args)
  local plen, sep = #args[7], args[8]
  local c = {ids = {}, marked = {}, more = {}, regions = {}}
  local index, named, n = {}, {}, 0
  for j = FIRST_MARK, #args do
    local mark = args[j]
    local at = string.find(mark, sep, plen + 1, true)
    local region, id = string.sub(mark, plen + 1, at - 1), string.sub(mark, at + #sep)
    if not named[region] then
      named[region] = true
      c.regions[#c.regions + 1] = region
    end
    local i = index[id]
    if i == nil then
      n = n + 1
      index[id], c.ids[n], c.marked[n] = n, id, region
    elseif c.marked[i] ~= region then
      local more = c.more[i] or {}
      more[#more + 1] = region
      c.more[i] = more
    end
  end
  return c
end

-- Each user's regional records, as stored: c.first[i] (the first found, with its region in
-- c.first_region[i]) and c.others[i] (a list of {rec, region} for the rest, if any), from the
-- regions it played in: those of its field of the users' regions hash (one HMGET for the
-- chunk; for a user with no field yet, its set of the layout before) and those its marks name
-- (so a mark is merged even if the derive step trailed). One HMGET a region of the chunk, of
-- the chunk's users who played there; a region without a record of the user (never in this
-- period, or its view expired) adds nothing.
local NONE = {}

local function read_records(t, c)
  local by_region, order = {}, {}
  local function add(r, i)
    local at = by_region[r]
    if not at then
      at = {}
      by_region[r] = at
      order[#order + 1] = r
    end
    at[#at + 1] = i
  end
  local fields = redis.call('HMGET', t.users_regions, unpack(c.ids))
  for i, id in ipairs(c.ids) do
    local field, mine, more = fields[i], c.marked[i], c.more[i]
    local listed = NONE
    if field == mine and more == nil then
      -- the common case: one region, marked and listed
    elseif field then
      listed = regions_in(field)
    else
      listed = redis.call('SMEMBERS', t.user_prefix .. id .. t.user_suffix)
    end
    if more == nil and (#listed == 0 or (#listed == 1 and listed[1] == mine)) then
      add(mine, i)
    else
      local seen = {[mine] = true}
      add(mine, i)
      for _, r in ipairs(listed) do
        if not seen[r] then
          seen[r] = true
          add(r, i)
        end
      end
      for _, r in ipairs(more or {}) do
        if not seen[r] then
          seen[r] = true
          add(r, i)
        end
      end
    end
  end
  c.first, c.first_region, c.others = {}, {}, {}
  for _, r in ipairs(order) do
    local at, ids = by_region[r], {}
    for k, i in ipairs(at) do ids[k] = c.ids[i] end
    local recs = redis.call('HMGET', t.region_prefix .. r .. t.region_suffix, unpack(ids))
    for k, i in ipairs(at) do
      local rec = recs[k]
      if rec then
        if c.first[i] == nil then
          c.first[i], c.first_region[i] = rec, r
        else
          local others = c.others[i] or {}
          others[#others + 1] = {rec, r}
          c.others[i] = others
        end
      end
    end
  end
end

-- User i's global record from its regional ones: the one as it is, or combined (nil: none, or
-- a sum out of range; refused says which).
local function new_record(op, c, i)
  local first = c.first[i]
  if first == nil or c.others[i] == nil then return first, false end
  local entries = {}
  for _, found in ipairs({{first, c.first_region[i]}, unpack(c.others[i])}) do
    local e = parsed(found[1], c.ids[i])
    e.region, e.time = found[2], tonumber(string.sub(e.tie, -12), 16)
    entries[#entries + 1] = e
  end
  local signed, tie, meta = combined(op, entries)
  if signed == nil then return nil, true end
  return record_of(tie, signed, meta), false
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
  -- Member and score compared as the strings the records hold, not parsed: tonumber() is libc's
  -- strtod, a good part of an entry's cost. Every record writes its score with fmt(), so equal
  -- scores are equal strings; were one not, the entry would only be written again as it is.
  local a = string.find(rec, '|', 1, true)
  local b = string.find(rec, '|', a + 1, true)
  local tie, score = string.sub(rec, 1, a - 1), string.sub(rec, a + 1, b - 1)
  local member, old_member, old_score = tie .. id, nil, nil
  if old_rec then
    local oa = string.find(old_rec, '|', 1, true)
    local ob = string.find(old_rec, '|', oa + 1, true)
    old_member = string.sub(old_rec, 1, oa - 1) .. id
    old_score = string.sub(old_rec, oa + 1, ob - 1)
  end
  if old_member ~= member or old_score ~= score then
    local added = w.added
    added[#added + 1] = score
    added[#added + 1] = member
    if old_member and old_member ~= member then w.removed[#w.removed + 1] = old_member end
  end
  w.records[#w.records + 1] = id
  w.records[#w.records + 1] = rec
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
             user_suffix = args[6], users_regions = keys[9]}
  if #args < FIRST_MARK then return {{}, {}, {}, 0} end
  local c = users_of(args)
  read_records(t, c)
  local olds = redis.call('HMGET', v.ties, unpack(c.ids))
  local w = {added = {}, pairs = {}, removed = {}, records = {}, dropped = {}, left = {},
             distinct = kept_distinct(keys, args[9])}
  local hidden = redis.call('SMISMEMBER', keys[7], unpack(c.ids))
  local changed, refused, op = {}, {}, args[2]
  for i, id in ipairs(c.ids) do
    local rec, out_of_range = new_record(op, c, i)
    if out_of_range then refused[#refused + 1] = id end
    if rec ~= olds[i] and (rec ~= nil or olds[i]) then
      if hidden[i] == 1 then
        plan_hidden(w, id, olds[i] or nil, rec)
      else
        plan_user(w, id, olds[i] or nil, rec)
        changed[#changed + 1] = id
      end
    end
  end
  write_batch(v, w)
  -- The marks go in the step that merged them: a crash leaves them, never loses them.
  batched('SREM', keys[4], args, FIRST_MARK)
  local made = {keys[1], keys[3]}
  if w.distinct then made[3] = w.distinct end
  expire(made, tonumber(args[1]))
  return {changed, refused, c.regions, #c.ids}
end

redis.register_function(FUNCTIONS.merge, merge)
