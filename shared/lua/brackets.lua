--[[
Whom a write moved across its board's notify brackets (docs/api.md section 9), read in the write's
atomic step (write.lua) for its outbox result. `e` is the write's event (write.lua event_of()):
e.brackets holds each bracket as a number then as its digits, and is empty for a hidden writer,
who moves nobody on the board as others see it; e.tie, the event's tie key, is as long as every
member's, so the id is what follows it. A hidden user's member is not on the board: neither
reads names one.
]]

-- The ids whose rank a move from prev (0-based, false: absent) to rank (1-based) pushed below
-- each bracket it crossed, as the members of the outbox result's JSON object "pushed_out" (the
-- bracket's digits, the id), '' for none.
local function pushed_out(e, board, rank, prev)
  local pushed, brackets = '', e.brackets
  for i = 1, #brackets, 2 do
    local t, name = brackets[i], brackets[i + 1]
    if rank <= t and (prev == false or prev + 1 > t) then
      local out = redis.call('ZREVRANGE', board, name, name)
      if out[1] then
        pushed = pushed .. (pushed == '' and '"' or ',"') .. name .. '":"' ..
                 string.sub(out[1], #e.tie + 1) .. '"'
      end
    end
  end
  return pushed
end

-- The ids a fall from prev (0-based) to rank (1-based, below prev + 1) moved up into each
-- bracket it left (prev + 1 <= T < rank): the user now at rank T, at T + 1 before. As the
-- outbox result's member "pulled_in" (the bracket's digits, the id), '' for none. Only a fall
-- calls it: a write that rises or stays pays nothing for it.
local function pulled_in(e, board, rank, prev)
  local pulled, brackets = '', e.brackets
  for i = 1, #brackets, 2 do
    local t = brackets[i]
    if prev < t and t < rank then
      local now = redis.call('ZREVRANGE', board, t - 1, t - 1)
      if now[1] then
        pulled = pulled .. (pulled == '' and '"' or ',"') .. brackets[i + 1] .. '":"' ..
                 string.sub(now[1], #e.tie + 1) .. '"'
      end
    end
  end
  if pulled == '' then return '' end
  return ',"pulled_in":{' .. pulled .. '}'
end
