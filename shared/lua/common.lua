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

local function signed_of(composite, scale)
  return math.floor(tonumber(composite) / scale)
end

-- Whether any member of a view still holds the signed score: its composites are the half-open
-- range [signed * scale, (signed + 1) * scale).
local function held(view, signed, scale)
  return redis.call('ZCOUNT', view, fmt(signed * scale), '(' .. fmt((signed + 1) * scale)) > 0
end

-- Move one member of a view from old_signed (nil: absent) to new_signed, keeping the view's
-- distinct-score set right: the new score is added (a no-op if someone holds it already), the
-- old one removed once nobody holds it. Added before the old one goes, so the distinct set is
-- never emptied (and so deleted by Redis) while the view has members: both keys are made
-- together, by a view's first member. Returns 1 if the member is new to the view, else 0.
local function put_entry(view, distinct, member, composite, old_signed, new_signed, scale)
  local added = redis.call('ZADD', view, fmt(composite), member)
  if old_signed == new_signed then return added end
  local k = fmt(new_signed)
  redis.call('ZADD', distinct, k, k)
  if old_signed ~= nil and not held(view, old_signed, scale) then
    redis.call('ZREM', distinct, fmt(old_signed))
  end
  return added
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
