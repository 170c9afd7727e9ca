#!lua name=ladder_v1

--[[
The atomic write of one accepted score (API.md section 4; DESIGN.md invariant 1).

One call: check the idempotency record and the outbox bound; compute the new score of every
period's regional board (refusing the whole call if any leaves its encodable range); write them;
read rank and previous rank; name whoever this write pushed out of each notify bracket; record
the answer under the event id; append the event to the outbox. Every key shares one hash tag.

KEYS: idem, outbox, names, then for each period: its regional board, its regions set.
ARGV: 1 body hash, 2 operator, 3 value, 4 user_id, 5 region, 6 display_name ('' for none),
      7 the event as JSON without its closing brace, 8 period count, 9 idempotency ttl,
      10 outbox max, 11 brackets (comma-separated), 12 '1' descending / '0' ascending,
      then six per period: name, id, scale (2^time bits), tick, max score, expire-at (0: never).
Returns {status, payload}: ok / duplicate with the outbox entry, conflict, range, outbox_full.
]]

local function decode_score(composite, scale, desc)
  local signed = math.floor(tonumber(composite) / scale)
  if desc then return signed end
  return -signed
end

local function submit(keys, args)
  local stored = redis.call('GET', keys[1])
  if stored then
    local sep = string.find(stored, '\n', 1, true)
    if string.sub(stored, 1, sep - 1) == args[1] then
      return {'duplicate', string.sub(stored, sep + 1)}
    end
    return {'conflict', ''}
  end
  if redis.call('XLEN', keys[2]) >= tonumber(args[10]) then
    return {'outbox_full', ''}
  end

  local op, value, user = args[2], tonumber(args[3]), args[4]
  local region, display = args[5], args[6]
  local n, desc = tonumber(args[8]), args[12] == '1'
  local brackets = {}
  for t in string.gmatch(args[11], '%d+') do brackets[#brackets + 1] = tonumber(t) end

  -- First pass: decide every period's new score; refuse before writing anything.
  local plan = {}
  for i = 1, n do
    local a = 12 + (i - 1) * 6
    local p = {name = args[a + 1], id = args[a + 2], scale = tonumber(args[a + 3]),
               tick = tonumber(args[a + 4]), max = tonumber(args[a + 5]),
               expire = tonumber(args[a + 6]),
               board = keys[2 + 2 * i], regions = keys[3 + 2 * i]}
    local old = redis.call('ZSCORE', p.board, user)
    local old_score = nil
    if old then old_score = decode_score(old, p.scale, desc) end
    if op == 'incr' then
      p.score = (old_score or 0) + value
      p.changed = old_score == nil or value ~= 0
    elseif op == 'best' then
      if old_score == nil or (desc and value > old_score) or ((not desc) and value < old_score) then
        p.score, p.changed = value, true
      else
        p.score, p.changed = old_score, false
      end
    else
      p.score = value
      p.changed = old_score == nil or value ~= old_score
    end
    if p.score > p.max or p.score < -p.max then
      return {'range', p.name .. ' score would be ' .. string.format('%.17g', p.score) ..
              ', beyond the largest encodable ' .. string.format('%.17g', p.max)}
    end
    plan[i] = p
  end

  -- Second pass: write, and read what the write did.
  local periods = {}
  for i = 1, n do
    local p = plan[i]
    local prev = redis.call('ZREVRANK', p.board, user)
    if p.changed then
      local signed = p.score
      if not desc then signed = -signed end
      local composite = signed * p.scale + (p.scale - 1 - p.tick)
      redis.call('ZADD', p.board, string.format('%.17g', composite), user)
    end
    redis.call('SADD', p.regions, region)
    if p.expire > 0 then
      redis.call('EXPIREAT', p.board, p.expire)
      redis.call('EXPIREAT', p.regions, p.expire)
    end
    local rank = redis.call('ZREVRANK', p.board, user) + 1
    local pushed = {}
    for _, t in ipairs(brackets) do
      if rank <= t and (prev == false or prev + 1 > t) then
        local out = redis.call('ZREVRANGE', p.board, t, t)
        if out[1] then pushed[tostring(t)] = out[1] end
      end
    end
    local previous = cjson.null
    if prev then previous = prev + 1 end
    periods[p.name] = {period_id = p.id, score = p.score, rank = rank,
                       previous_rank = previous, improved = p.changed, pushed_out = pushed}
  end

  if display ~= '' then redis.call('HSET', keys[3], user, display) end
  local entry = args[7] .. ',"periods":' .. cjson.encode(periods) .. '}'
  redis.call('SET', keys[1], args[1] .. '\n' .. entry, 'EX', tonumber(args[9]))
  redis.call('XADD', keys[2], '*', 'e', entry)
  return {'ok', entry}
end

--[[
A token bucket (API.md section 9a): KEYS[1] the bucket; ARGV rate a second, burst, now in ms,
cost. Takes the tokens and returns {1, 0}, or takes nothing and returns {0, ms until enough}.
]]
local function take(keys, args)
  local rate, burst = tonumber(args[1]), tonumber(args[2])
  local now, cost = tonumber(args[3]), tonumber(args[4])
  local state = redis.call('HMGET', keys[1], 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if tokens == nil then tokens, at = burst, now end
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
  local ttl = math.ceil(burst / rate * 1000) + 1000
  if tokens < cost then
    redis.call('HSET', keys[1], 'tokens', tostring(tokens), 'at', tostring(now))
    redis.call('PEXPIRE', keys[1], ttl)
    return {0, math.ceil((cost - tokens) * 1000 / rate)}
  end
  redis.call('HSET', keys[1], 'tokens', tostring(tokens - cost), 'at', tostring(now))
  redis.call('PEXPIRE', keys[1], ttl)
  return {1, 0}
end

redis.register_function('ladder_submit_v1', submit)
redis.register_function('ladder_take_v1', take)
