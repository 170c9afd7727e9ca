-- Shared by the bench's wrk scripts: per-thread ids, an optional fixed request rate, and a JSON
-- summary on stdout that bench/load.py reads.
--
-- Environment: BENCH_RATE (requests a second over all connections, 0: as fast as possible),
-- BENCH_CONNECTIONS (to spread that rate), BENCH_USERS, BENCH_REGIONS, BENCH_RUN (a run id that
-- keeps event ids unique across runs), BENCH_BOARDS (see board_paths).

local threads = {}
local counter = 0

users = tonumber(os.getenv("BENCH_USERS") or "100000")
regions = tonumber(os.getenv("BENCH_REGIONS") or "8")
run = os.getenv("BENCH_RUN") or "r"
local rate = tonumber(os.getenv("BENCH_RATE") or "0")
local connections = tonumber(os.getenv("BENCH_CONNECTIONS") or "1")

function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
  table.insert(threads, thread)
end

function init(args)
  seq = 0
  math.randomseed(tid * 7919 + os.time())
end

-- The paths of BENCH_BOARDS (board names separated by spaces), or else of the one board named,
-- each followed by suffix; next_path takes them in turn, a thread starting at its own.
function board_paths(board, suffix)
  local found = {}
  for name in string.gmatch(os.getenv("BENCH_BOARDS") or board, "%S+") do
    table.insert(found, "/v1/boards/" .. name .. suffix)
  end
  return found
end

function next_path(paths)
  return paths[(tid + seq) % #paths + 1]
end

-- One score event as the API takes it, unique per run, thread and request.
function event()
  seq = seq + 1
  return string.format(
    '{"event_id":"%s-%d-%d","user_id":"u%d","region":"r%d","value":%d,"team_id":"t%d"}',
    run, tid, seq, math.random(0, users - 1), math.random(0, regions - 1),
    math.random(1, 100), math.random(0, 99))
end

if rate > 0 then
  -- Each connection waits its share of the interval before sending: an open-loop-ish fixed
  -- rate. wrk starts a request's latency clock when it is written, so the wait is not counted.
  local interval_ms = connections * 1000 / rate
  function delay()
    return interval_ms
  end
end

function done(summary, latency, requests)
  io.write(string.format(
    'BENCH-JSON {"requests":%d,"duration_us":%d,"non2xx":%d,"connect_errors":%d,' ..
    '"read_errors":%d,"write_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
