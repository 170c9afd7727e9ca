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
one token from each. A refusal by either bucket writes nothing (an event answered already is
answered again first); so does every other refusal of submit(), which leaves the buckets as
they were. Both buckets are the board's own ({P:B}:rate:...), so that the whole call stays in
the board's hash slot.

KEYS: the user's bucket, the credential's bucket, then submit()'s keys, lean (write) or
      journaled (write_journaled): write.lua.
ARGV: user rate a second, user burst, credential rate, credential burst, now in ms, then
      submit()'s arguments.
Returns submit()'s answer, or {'limited', '<user | credential> <ms until a token is there>'}.
]]
-- The ms until a bucket holding `tokens` has one (0: it has).
local function wait_ms(tokens, rate)
  if tokens >= 1 then return 0 end
  return math.ceil((1 - tokens) * 1000 / rate)
end

-- The refusal when either bucket is short of a token, nil if neither is. The credential is named
-- whenever it is short, the user's bucket too or not: a batch all of whose events the credential
-- refused is refused as a whole (services/api/routes/scores.py). The wait is until both have one.
local function short(user, user_rate, credential, key_rate)
  local for_user, for_credential = wait_ms(user, user_rate), wait_ms(credential, key_rate)
  if for_credential > 0 then
    return {'limited', 'credential ' .. math.max(for_user, for_credential)}
  end
  if for_user > 0 then return {'limited', 'user ' .. for_user} end
  return nil
end

local function limited(keys, args, layout)
  local now = tonumber(args[5])
  local states = redis.call('MGET', keys[1], keys[2])
  local user_rate, user_burst = tonumber(args[1]), tonumber(args[2])
  local key_rate, key_burst = tonumber(args[3]), tonumber(args[4])
  local user = tokens_in(states[1], user_rate, user_burst, now)
  local credential = tokens_in(states[2], key_rate, key_burst, now)
  local refused = short(user, user_rate, credential, key_rate)
  -- A retry of an event answered already is answered again (its duplicate, or 409 for another
  -- body) with no token to spare: a client retrying a timed-out burst learns what was stored.
  if refused then return answered({unpack(keys, 3)}, {unpack(args, 6)}) or refused end
  local result = submit({unpack(keys, 3)}, {unpack(args, 6)}, layout)
  if result[1] == 'ok' then
    keep_tokens(keys[1], user - 1, args[5], user_rate, user_burst)
    keep_tokens(keys[2], credential - 1, args[5], key_rate, key_burst)
  end
  return result
end

local function write(keys, args) return limited(keys, args, LEAN) end
local function write_journaled(keys, args) return limited(keys, args, JOURNALED) end

redis.register_function(FUNCTIONS.write, write)
redis.register_function(FUNCTIONS.write_journaled, write_journaled)
