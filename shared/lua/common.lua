--[[
What the library's files share. shared/redis.py loads every file of shared/lua/ as ONE library,
in one FUNCTION LOAD, in a fixed order (this file first), so that loading stays atomic and a
file may use the local functions of the files before it. The loader puts FUNCTIONS before this
file: the name of each Redis Function, from shared/functions.py, keyed by the Lua function that
implements it; each file registers its functions as FUNCTIONS.<that key>. (While a library
loads, only `redis` is there: no pairs() or error(), hence one register_function call a line.)

Every key a function touches comes in KEYS, built by shared/keys.py: the Lua builds no key name.
A board's keys share its hash tag, so that each call stays in one hash slot.
]]

local function fmt(n) return string.format('%.17g', n) end

-- Whether any member of a view still holds the signed score (the view's scores are exact).
local function held(view, signed)
  local k = fmt(signed)
  return redis.call('ZCOUNT', view, k, k) > 0
end

-- A view's keys: the sorted set, its distinct-score set, its hash of tie keys.
local function view_of(view, distinct, ties)
  return {view = view, distinct = distinct, ties = ties}
end

-- An id's entry in a view: {tie, member, signed}, or nil if it has none. A member is the id's
-- tie key then the id (shared/ranking.py); the view's hash holds each id's current tie key.
local function entry_in(v, id)
  local tie = redis.call('HGET', v.ties, id)
  if not tie then return nil end
  local score = redis.call('ZSCORE', v.view, tie .. id)
  if not score then return nil end
  return {tie = tie, member = tie .. id, signed = tonumber(score)}
end

-- Put an id's entry in a view at new_signed, reached at tie (a tie key), in place of old (its
-- entry_in(), nil: none), keeping the view's hash of tie keys and distinct-score set right: the
-- new score is added (a no-op if someone holds it already), the old one removed once nobody
-- holds it. Added before the old one goes, so the distinct set is never emptied (and so deleted
-- by Redis) while the view has members: the three keys are made together, by a view's first
-- member.
local function put_entry(v, id, old, new_signed, tie)
  local member = tie .. id
  redis.call('ZADD', v.view, fmt(new_signed), member)
  if old == nil or old.member ~= member then
    if old then redis.call('ZREM', v.view, old.member) end
    redis.call('HSET', v.ties, id, tie)
  end
  if old ~= nil and old.signed == new_signed then return end
  local k = fmt(new_signed)
  redis.call('ZADD', v.distinct, k, k)
  if old ~= nil and not held(v.view, old.signed) then
    redis.call('ZREM', v.distinct, fmt(old.signed))
  end
end

-- Take an id's entry (old, its entry_in()) out of a view, with its tie key and, once nobody
-- holds it, its score in the distinct set.
local function remove_entry(v, id, old)
  redis.call('ZREM', v.view, old.member)
  redis.call('HDEL', v.ties, id)
  if not held(v.view, old.signed) then redis.call('ZREM', v.distinct, fmt(old.signed)) end
end

local function expire(keys, at)
  if at > 0 then
    for _, key in ipairs(keys) do redis.call('EXPIREAT', key, at) end
  end
end

-- expire(), when `made` says the write just made the keys. A period's keys all expire at the
-- same moment, so a key needs it once, when it is made; setting it on every write was a third
-- of a write's Redis commands. (A changed retention therefore applies to keys made after it.)
local function expire_made(made, keys, at)
  if made then expire(keys, at) end
end
