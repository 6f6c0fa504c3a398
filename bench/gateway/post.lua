-- wrk script for bench/gateway: POSTs one completion per request.
-- Environment: LUPIN_BENCH_STREAM=1 adds "stream": true; LUPIN_BENCH_RATE=R
-- (requests/s over all connections, one wrk thread) paces requests with wrk's
-- delay() hook: each request is given the next slot of a schedule ticking at
-- R/s (monotonic clock through LuaJIT's ffi) and waits for it (whole
-- milliseconds, dithered so the mean is right); a connection whose slot has
-- passed sends at once, so the offered rate holds while answers are fast.
-- done() prints one machine-readable line: RESULT requests seconds p50_us
-- p99_us mean_us non2xx socket_errors.
local stream = os.getenv("LUPIN_BENCH_STREAM") == "1"
local rate = tonumber(os.getenv("LUPIN_BENCH_RATE") or "0") or 0
local model = os.getenv("LUPIN_BENCH_MODEL") or "meta-llama/Llama-3.1-8B-Instruct"

-- a ~1 KB prompt: what the prefix scorer hashes (16 blocks of 64 bytes)
local words = {}
for i = 1, 180 do words[i] = "tok" .. (i % 37) end
local prompt = "You are a helpful assistant. " .. table.concat(words, " ")

wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format('{"model":"%s","prompt":"%s","max_tokens":16%s}',
  model, prompt, stream and ',"stream":true' or "")

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } lupin_timespec;
  int clock_gettime(int clk, lupin_timespec *ts);
]]
local ts = ffi.new("lupin_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local interval_ms = rate > 0 and 1000 / rate or 0
local next_ms

function init()
  math.randomseed(os.time() + math.floor((os.clock() * 1e6) % 1e6))
end

if interval_ms > 0 then
  function delay()
    local now = now_ms()
    if not next_ms or next_ms < now - 50 then next_ms = now end -- no bursts to catch up
    local wait = next_ms - now
    next_ms = next_ms + interval_ms
    if wait <= 0 then return 0 end
    local whole = math.floor(wait)
    if math.random() < wait - whole then whole = whole + 1 end
    return whole
  end
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format("RESULT %d %.3f %d %d %.1f %d %d\n",
    summary.requests, summary.duration / 1e6,
    latency:percentile(50), latency:percentile(99), latency.mean,
    e.status, e.connect + e.read + e.write + e.timeout))
end
