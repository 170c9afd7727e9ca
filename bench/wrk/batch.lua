-- BENCH_BATCH scores per request: POST /v1/boards/<board>/scores/batch, the board BENCH_BOARD,
-- or each of BENCH_BOARDS (names separated by spaces) in turn.
package.path = debug.getinfo(1, "S").source:match("@(.*/)") .. "?.lua;" .. package.path
require("common")

local key = os.getenv("BENCH_KEY") or "dev-server-key"
local size = tonumber(os.getenv("BENCH_BATCH") or "500")
local paths = board_paths(os.getenv("BENCH_BOARD") or "bench-batch", "/scores/batch")
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}

function request()
  local events = {}
  for i = 1, size do events[i] = event() end
  local body = '{"events":[' .. table.concat(events, ",") .. ']}'
  return wrk.format("POST", next_path(paths), headers, body)
end
