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
The global merge (services/aggregator/merge.py), where the data is: a chunk of dirty users of one
board period, each combined from its records in the regions it played in (combine() in merge.py
is the reference; the tests hold this to it) and put in the global view.

KEYS: global view, its distinct set, its records, the merging set. ARGV: expire-at (0: never),
operator, the two ends of a region view's records key (prefix, suffix: the key is prefix ..
region .. suffix), the two ends of a user's regions key, the two parts of a dirty mark (prefix,
separator: the mark is prefix .. region .. separator .. id), then per user: id, n, and the n
regions its marks name. Returns {ids whose global entry changed, ids whose sum was out of range}.

This function builds key names, against common.lua's rule, from templates that shared/keys.py
made: which regions a user played in is read here (its regions set, with its marks' regions),
so the region keys are known only inside the call; passing them as KEYS would take another
round trip and a key per user and region. Every such key carries the board's hash tag, the
call stays in one slot.
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

-- A record's fields (shared/ranking.py), as entry_in() reads them; nil for none.
local function parsed(rec, id)
  if not rec then return nil end
  local tie, score, meta = string.match(rec, '^([^|]*)|([^|]*)|(.*)$')
  return {tie = tie, member = tie .. id, signed = tonumber(score), meta = meta, sub = sub_of(tie)}
end

-- Each user's entries (users[i].entries) from its records in the regions it played in: those
-- of its regions set and those its marks name (so a mark is merged even if the set trailed).
-- One HMGET a region of the chunk, of the chunk's users who played there; a region without a
-- record of the user (never in this period, or its view expired) adds nothing.
local function read_entries(t, users)
  local by_region, order = {}, {}
  for i, u in ipairs(users) do
    local seen = {}
    for _, r in ipairs(redis.call('SMEMBERS', t.user_prefix .. u.id .. t.user_suffix)) do
      seen[r] = true
    end
    for _, r in ipairs(u.marked) do seen[r] = true end
    for r in pairs(seen) do
      if not by_region[r] then
        by_region[r] = {}
        order[#order + 1] = r
      end
      table.insert(by_region[r], i)
    end
    u.entries = {}
  end
  for _, r in ipairs(order) do
    local at, ids = by_region[r], {}
    for k, i in ipairs(at) do ids[k] = users[i].id end
    local recs = redis.call('HMGET', t.region_prefix .. r .. t.region_suffix, unpack(ids))
    for k, i in ipairs(at) do
      local e = parsed(recs[k], ids[k])
      if e then
        e.region, e.time = r, tonumber(string.sub(e.tie, -12), 16)
        table.insert(users[i].entries, e)
      end
    end
  end
end

-- One user's change to the global view, added to the batch w: its old entry (parsed()) out,
-- its combined one in (nil: none, or a sum out of range). Whether anything changed.
local function plan_user(w, id, old, signed, tie, meta)
  if signed == nil then
    if old == nil then return false end
    table.insert(w.removed, old.member)
    table.insert(w.dropped, id)
    table.insert(w.left, old)
    return true
  end
  if old ~= nil and old.signed == signed and old.tie == tie and old.meta == meta then
    return false
  end
  local member, sub = tie .. id, sub_of(tie)
  if old == nil or old.member ~= member or old.signed ~= signed then
    table.insert(w.added, fmt(signed))
    table.insert(w.added, member)
    if old ~= nil and old.member ~= member then table.insert(w.removed, old.member) end
  end
  table.insert(w.records, id)
  table.insert(w.records, record_of(tie, signed, meta))
  if old == nil or old.signed ~= signed or old.sub ~= sub then
    table.insert(w.pairs, fmt(signed))
    table.insert(w.pairs, distinct_member(signed, sub))
    if old ~= nil then table.insert(w.left, old) end
  end
  return true
end

-- A command on a key with a long flat list of arguments, in calls of at most 4,000 (Lua's
-- unpack() stops near 8,000); 4,000 keeps pairs whole.
local function batched(command, key, items)
  for s = 1, #items, 4000 do
    redis.call(command, key, unpack(items, s, math.min(s + 3999, #items)))
  end
end

-- The batch's writes, as put_entry() and remove_entry() make them one by one: new members and
-- pairs added before old ones go (the distinct set is never emptied while the view has
-- members), then each old pair that nobody holds any more taken out of the distinct set.
local function write_batch(v, w)
  batched('ZADD', v.view, w.added)
  batched('ZADD', v.distinct, w.pairs)
  batched('ZREM', v.view, w.removed)
  batched('HSET', v.ties, w.records)
  batched('HDEL', v.ties, w.dropped)
  local gone = {}
  for _, old in ipairs(w.left) do
    local pair = distinct_member(old.signed, old.sub)
    if not gone[pair] and not held(v.view, old.signed, old.sub) then
      gone[pair] = true
      redis.call('ZREM', v.distinct, pair)
    end
  end
end

-- The users of ARGV (from 9): {id, marked = the regions its marks name}, and those marks.
local function users_of(args)
  local users, marks, j = {}, {}, 9
  while j <= #args do
    local id, n = args[j], tonumber(args[j + 1])
    local u = {id = id, marked = {}}
    for k = 1, n do
      u.marked[k] = args[j + 1 + k]
      marks[#marks + 1] = args[7] .. u.marked[k] .. args[8] .. id
    end
    users[#users + 1] = u
    j = j + 2 + n
  end
  return users, marks
end

local function merge(keys, args)
  local v = view_of(keys[1], keys[2], keys[3])
  local t = {region_prefix = args[3], region_suffix = args[4], user_prefix = args[5],
             user_suffix = args[6]}
  local users, marks = users_of(args)
  if #users == 0 then return {{}, {}} end
  read_entries(t, users)
  local ids = {}
  for i, u in ipairs(users) do ids[i] = u.id end
  local olds = redis.call('HMGET', v.ties, unpack(ids))
  local w = {added = {}, pairs = {}, removed = {}, records = {}, dropped = {}, left = {}}
  local changed, refused = {}, {}
  for i, u in ipairs(users) do
    local signed, tie, meta = nil, nil, nil
    if #u.entries > 0 then
      signed, tie, meta = combined(args[2], u.entries)
      if signed == nil then refused[#refused + 1] = u.id end
    end
    if plan_user(w, u.id, parsed(olds[i], u.id), signed, tie, meta) then
      changed[#changed + 1] = u.id
    end
  end
  write_batch(v, w)
  -- The marks go in the step that merged them: a crash leaves them, never loses them.
  batched('SREM', keys[4], marks)
  expire({keys[1], keys[2], keys[3]}, tonumber(args[1]))
  return {changed, refused}
end

redis.register_function(FUNCTIONS.merge, merge)
