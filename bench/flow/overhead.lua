-- What flow control costs a request, in µs (docs/flow-control.md): the
-- runtime alone through lupin_native, one endpoint, the config of
-- bench/flow/run.sh.  N requests begun, scheduled and ended:
--   off:      no flowControl section
--   through:  flow control on, the gate open (the detector asked, no queue)
--   queued:   every request waits and leaves by a request's end (enqueue,
--             fairness, ordering, dispatch callback)
-- luajit bench/flow/overhead.lua [N]   (from the repository root, after make)
package.cpath = (os.getenv("B") or "build") .. "/?.so;" .. package.cpath
package.path = "spec/?.lua;" .. package.path
local native = require "lupin_native"
local cjson = require "cjson"

local N = tonumber(arg[1]) or 20000

local function runtime(flow, limit)
  local cfg = {
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
      { type = "concurrency-detector", parameters = { maxConcurrency = limit } },
      { type = "round-robin-fairness-policy" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
  }
  if flow then
    cfg.saturationDetector = { pluginRef = "concurrency-detector" }
    cfg.flowControl = { defaultPriorityBand = { fairnessPolicyRef = "round-robin-fairness-policy" } }
  end
  local rt = assert(native.new({ home = os.getenv("PWD") or "." }))
  assert(rt:load_string(cjson.encode(cfg), "bench.json"))
  assert(rt:upsert({ name = "ep1", address = "10.0.0.1", port = 8000 }))
  rt:set_metrics("ep1", { waiting_queue_size = 0, kv_cache_usage = 0 })
  return rt
end

local BODY = '{"model":"m","prompt":"hello"}'
local TENANTS = { "a", "b", "c", "d" }

local function desc(i)
  return { path = "/v1/completions", body = BODY,
    headers = { ["x-gateway-inference-fairness-id"] = TENANTS[i % 4 + 1] } }
end

local function straight(rt)
  local t0 = native.now()
  for i = 1, N do
    local r = rt:begin(desc(i))
    assert(r:schedule().status == 200)
    r:finish("ok")
  end
  return (native.now() - t0) / N * 1e6
end

-- one request holds the endpoint; each one queued behind it leaves when the
-- one before it ends (the callback ends nothing: the loop does)
local function queued(rt)
  local pending = {}
  rt:set_dispatch(function(id) pending[#pending + 1] = id end)
  local hold = rt:begin(desc(0))
  assert(hold:schedule().status == 200)
  local t0 = native.now()
  local cur = hold
  for i = 1, N do
    local r = rt:begin(desc(i))
    assert(r:schedule().status == 0)
    cur:finish("ok") -- r leaves the queue here
    cur = r
  end
  cur:finish("ok")
  assert(#pending == N)
  return (native.now() - t0) / N * 1e6
end

-- the best of 5 rounds each (the first warms the JIT; the rest is noise)
local best = { off = math.huge, through = math.huge, queued = math.huge }
for _ = 1, 5 do
  best.off = math.min(best.off, straight(runtime(false, 1000000)))
  local on = runtime(true, 1000000)
  on:set_dispatch(function() end)
  best.through = math.min(best.through, straight(on))
  best.queued = math.min(best.queued, queued(runtime(true, 1)))
  collectgarbage()
end
print(("per request (begin, schedule, end), best of 5 x %d: off %.2f µs, through the open"
  .. " gate %.2f µs (+%.2f), queued and dispatched %.2f µs (+%.2f)"):format(N, best.off,
  best.through, best.through - best.off, best.queued, best.queued - best.off))
