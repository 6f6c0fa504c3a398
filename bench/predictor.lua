-- Micro-benchmark (not a test) of the latency models (lupin.predictor over
-- core/latency_model.c), inside a runtime's Lua state as a plugin runs it:
-- the cost of one training sample at 8 features (the C call alone, then
-- through m:train), of predicting 100 endpoints (100 models) through a batch
-- with its Lua side (reset, 100 adds, one predict, 100 gets), and of the C
-- call alone; single-thread throughput.  `make bench-predictor`; each figure
-- is the median of 7 runs of 0.2 s, after a warm-up.
--   B=build luajit bench/predictor.lua
package.path = "lua/?.lua;" .. package.path
package.cpath = (os.getenv("B") or "build") .. "/?.so;" .. package.cpath
local native = require "lupin_native"
local cjson = require "cjson"

local CODE = [==[
local ffi = require "ffi"
local capi = require "lupin.runtime.capi"
local predictor = require "lupin.predictor"
local clock = capi.clock
local D, ENDPOINTS, RUNS, SECONDS = 8, 100, 7, 0.2

math.randomseed(42)
local ROWS = 1024 -- features and latencies, made once
local xs, ys, cx = {}, {}, ffi.new("double[?]", ROWS * D)
for r = 1, ROWS do
  local x = { 1 }
  for j = 2, D do
    x[j] = math.random() * (j == 2 and 8000 or 1) -- tokens, then fractions
  end
  xs[r], ys[r] = x, 20 + 0.01 * x[2] + 30 * x[3] + 5 * x[4]
  for j = 1, D do
    cx[(r - 1) * D + j - 1] = x[j]
  end
end

-- The median over RUNS of what one call of body(n) costs, in seconds per
-- unit: body(n) runs n units (n doubles until a run lasts SECONDS).
local function measure(body)
  body(1000) -- warm-up: compiled before the clock starts
  local n, took = 1000, 0
  repeat
    n = n * 2
    local t0 = clock()
    body(n)
    took = clock() - t0
  until took >= SECONDS / 4
  n = math.ceil(n * SECONDS / took)
  local runs = {}
  for r = 1, RUNS do
    local t0 = clock()
    body(n)
    runs[r] = (clock() - t0) / n
  end
  table.sort(runs)
  return runs[(RUNS + 1) / 2]
end

local function spec(group)
  return { plugin = "bench", target = "ttft", group = group, features = D, halfLife = 60 }
end

-- 1. training through the C call alone, then through m:train
local cspec = ffi.new("lupin_latency_spec", { "bench", "ttft", "c-train", D, 0, 60, 0 })
local cm = capi.shared.latency_open(capi.rt, cspec)
local train = capi.shared.latency_train
local t = 0
local c_train = measure(function(n)
  for i = 1, n do
    local r = i % ROWS
    t = t + 0.001
    train(cm, cx + r * D, ys[r + 1], t)
  end
end)
local m = assert(predictor.model(spec("lua-train")))
local lua_train = measure(function(n)
  for i = 1, n do
    local r = i % ROWS + 1
    t = t + 0.001
    m:train(xs[r], ys[r], t)
  end
end)

-- 2. predicting 100 endpoints, a model each, trained a little
local models, rows = {}, {}
for e = 1, ENDPOINTS do
  models[e] = assert(predictor.model(spec("endpoint=" .. e)))
  for s = 1, 20 do
    local r = (e * 7 + s) % ROWS + 1
    models[e]:train(xs[r], ys[r] * (1 + e / 100), s)
  end
  rows[e] = xs[e]
end
local b = predictor.batch(D, ENDPOINTS)
local sink = 0
local batch = measure(function(n)
  for _ = 1, n do
    b:reset()
    for e = 1, ENDPOINTS do
      b:add(models[e], rows[e])
    end
    b:predict()
    for e = 1, ENDPOINTS do
      local ms = b:get(e)
      sink = sink + ms
    end
  end
end)
-- the C call alone, on the same models (the same names: the same pointers)
local ptrs = ffi.new("lupin_latency_model *[?]", ENDPOINTS)
local out, trained = ffi.new("double[?]", ENDPOINTS), ffi.new("uint64_t[?]", ENDPOINTS)
for e = 1, ENDPOINTS do
  local s = ffi.new("lupin_latency_spec", { "bench", "ttft", "endpoint=" .. e, D, 0, 60, 0 })
  ptrs[e - 1] = capi.shared.latency_open(capi.rt, s)
end
local predict = capi.shared.latency_predict
local c_batch = measure(function(n)
  for _ = 1, n do
    predict(ptrs, ENDPOINTS, cx, D, out, trained)
    sink = sink + out[0]
  end
end)
assert(sink == sink, "predictions are numbers")

return { c_train = c_train, lua_train = lua_train, batch = batch, c_batch = c_batch }
]==]

local rt = assert(native.new({ home = os.getenv("LUPIN_HOME") or "." }))
local r = cjson.decode(rt:eval(CODE))
rt:free()

print("lupin.predictor, one thread, 8 features, median of 7 runs")
print(("%-50s %11s %20s"):format("", "cost", "throughput"))
local function row(what, seconds, unit, scale, per, per_unit)
  print(("%-50s %8.1f %s %12.2f M %s/s"):format(what, seconds * scale, unit, per / seconds / 1e6,
    per_unit))
end
row("train, the C call (latency_train)", r.c_train, "ns", 1e9, 1, "samples")
row("train, m:train(x, y, now)", r.lua_train, "ns", 1e9, 1, "samples")
row("predict 100 endpoints: b:reset, add, predict, get", r.batch, "us", 1e6, 100, "rows")
row("predict 100 endpoints: the C call alone", r.c_batch, "us", 1e6, 100, "rows")
print(("goals: train <= 2000 ns (%s), 100 endpoints <= 20 us with Lua (%s)"):format(
  r.lua_train <= 2e-6 and "met" or "MISSED", r.batch <= 20e-6 and "met" or "MISSED"))

-- 3. predicted-latency-producer as a request pays it: a request's scheduling
-- over 100 endpoints whose models are warm, with the producer and without
-- (max-score-picker alone), the difference its cost; and its finish (two
-- models trained, an error observed) the same way.
local BODY = '{"model":"m","prompt":"' .. ("abcd"):rep(500) .. '","max_tokens":8,"stream":true}'

local function lifecycle(rt2, to, id)
  local req = assert(rt2:begin({ id = id, path = "/v1/completions", body = BODY,
    subset = to and { to } }))
  local t0 = native.now()
  req:schedule()
  local t1 = native.now()
  req:response_header(200, {})
  req:response_chunk("data: 1\n\ndata: 2\n\n")
  req:response_chunk("data: 3\n\ndata: [DONE]\n\n")
  local t2 = native.now()
  req:finish("ok")
  return t1 - t0, native.now() - t2
end

local function per_request(producer)
  local plugins = { { type = "max-score-picker" } }
  if producer then
    table.insert(plugins, 1, { type = "predicted-latency-producer",
      parameters = { streamingMode = true, minSamples = 1 } })
  end
  local rt2 = assert(native.new({ home = os.getenv("LUPIN_HOME") or "." }))
  assert(rt2:load_string(cjson.encode({ plugins = plugins, schedulingProfiles = { { name = "default",
    plugins = { { pluginRef = "max-score-picker" } } } } }), "bench.json"))
  for i = 1, 100 do
    assert(rt2:upsert({ name = "ep" .. i, address = "10.0.0." .. i, port = 8000 }))
    rt2:set_metrics("ep" .. i, { waiting_queue_size = i % 5, running_requests = i % 9,
      kv_cache_usage = i / 200 })
  end
  for i = 1, 300 do -- every endpoint's own model warm
    lifecycle(rt2, "ep" .. (i % 100 + 1), "w" .. i)
  end
  local sched, fin = {}, {}
  for i = 1, 2000 do
    sched[i], fin[i] = lifecycle(rt2, nil, "r" .. i)
  end
  rt2:free()
  table.sort(sched)
  table.sort(fin)
  return sched[1000], fin[1000]
end

local s0, f0 = per_request(false)
local s1, f1 = per_request(true)
print(("predicted-latency-producer, 100 warm endpoints (p50 of 2000 requests): scheduling"
  .. " %.1f us with it, %.1f us without (+%.1f us); finish +%.1f us"):format(s1 * 1e6, s0 * 1e6,
  (s1 - s0) * 1e6, (f1 - f0) * 1e6))
