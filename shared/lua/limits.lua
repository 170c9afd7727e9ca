--[[
Rate limits (docs/api.md section 9a): token buckets, each a string "<tokens>|<at>" (at: the
time of the last take, in ms), refilled at `rate` a second up to `burst`, kept until a full
refill (plus a second) after the last take. The buckets of a write are read together, in one
MGET, and each taken with one SET: three commands a write, where a hash a bucket took six.
(MGET reads a key of another type as none: a bucket left as a hash by the code before counts as
full once, and the next SET replaces it.)
]]

-- A token bucket's tokens at `now` (ms), refilled since its last take, from its value (nil or
-- false: a full bucket).
local function tokens_in(state, rate, burst, now)
  if not state then return burst end
  local tokens, at = string.match(state, '^([^|]*)|(.*)$')
  return math.min(burst, tonumber(tokens) + math.max(0, now - tonumber(at)) * rate / 1000)
end

local function keep_tokens(bucket, tokens, now, rate, burst)
  redis.call('SET', bucket, tostring(tokens) .. '|' .. now, 'PX',
             math.ceil(burst / rate * 1000) + 1000)
end

--[[
A rate-limited score write, in one call (docs/api.md sections 4 and 9a): the user's and the
credential's token buckets are checked, then submit() runs, and only a write it accepted takes
one token from each. A refusal by either bucket returns before anything is read or written; so
does every other refusal of submit(), which leaves the buckets as they were. Both buckets are
the board's own ({P:B}:rate:...), so that the whole call stays in the board's hash slot.

KEYS: the user's bucket, the credential's bucket, then submit()'s keys, lean (write) or
      journaled (write_journaled): write.lua.
ARGV: user rate a second, user burst, credential rate, credential burst, now in ms, then
      submit()'s arguments.
Returns submit()'s answer, or {'limited', '<user | credential> <ms until a token is there>'}.
]]
local function limited(keys, args, layout)
  local now = tonumber(args[5])
  local states = redis.call('MGET', keys[1], keys[2])
  local limits = {{'user', keys[1], tonumber(args[1]), tonumber(args[2])},
                  {'credential', keys[2], tonumber(args[3]), tonumber(args[4])}}
  local left = {}
  for i, limit in ipairs(limits) do
    local tokens = tokens_in(states[i], limit[3], limit[4], now)
    if tokens < 1 then
      return {'limited', limit[1] .. ' ' .. math.ceil((1 - tokens) * 1000 / limit[3])}
    end
    left[i] = tokens - 1
  end
  local result = submit({unpack(keys, 3)}, {unpack(args, 6)}, layout)
  if result[1] == 'ok' then
    for i, limit in ipairs(limits) do
      keep_tokens(limit[2], left[i], args[5], limit[3], limit[4])
    end
  end
  return result
end

local function write(keys, args) return limited(keys, args, LEAN) end
local function write_journaled(keys, args) return limited(keys, args, JOURNALED) end

redis.register_function(FUNCTIONS.write, write)
redis.register_function(FUNCTIONS.write_journaled, write_journaled)
