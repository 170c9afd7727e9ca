-- One score per request: POST /v1/boards/<board>/scores, the board BENCH_BOARD, or each of
-- BENCH_BOARDS (names separated by spaces) in turn.
package.path = debug.getinfo(1, "S").source:match("@(.*/)") .. "?.lua;" .. package.path
require("common")

local key = os.getenv("BENCH_KEY") or "dev-server-key"
local paths = board_paths(os.getenv("BENCH_BOARD") or "bench-single", "/scores")
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}

function request()
  return wrk.format("POST", next_path(paths), headers, event())
end
