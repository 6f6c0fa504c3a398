-- Flow control (lua/lupin/runtime/flow.lua, core/flow.c): requests wait between
-- admission and scheduling while the pool is saturated and leave by band,
-- fairness and ordering; every way out answers once and runs finish once.
local S = require "support"

local dir
setup(function()
  dir = S.tmpdir()
  -- counts finish per outcome, in the runtime's own state
  S.write(dir .. "/finish-count.lua", [[
local counts = {}
return {
  type = "finish-count",
  finish = function(_, ctx, outcome)
    if outcome ~= "dry_run" then counts[outcome] = (counts[outcome] or 0) + 1 end
  end,
  counts = counts,
}
]])
  -- a fairness policy written against the queue API: always the flow with
  -- the longest queue (what a spec author would write)
  S.write(dir .. "/longest-queue-fairness.lua", [[
return {
  type = "longest-queue-fairness",
  pick_flow = function(_, band, flows)
    local best = flows[1]
    for _, f in ipairs(flows) do
      if f.len > best.len then best = f end
    end
    return best
  end,
}
]])
  -- a scorer calling what a spec hands it (obj.probe), from inside scheduling
  S.write(dir .. "/window-probe.lua", [[
return {
  type = "window-probe",
  score = function(self, _, endpoints)
    if self.probe then self.probe(endpoints) end
    local s = {}
    for i = 1, #endpoints do s[i] = 0 end
    return s
  end,
}
]])
  S.write(dir .. "/broken-fairness.lua", [[
return { type = "broken-fairness", pick_flow = function() error("broken on purpose") end }
]])
end)

-- One endpoint taking one request at a time (concurrency-detector), so
-- the second request waits.
-- Moves the runtime's queue clock on instead of sleeping (lupin.runtime.flow).
local function advance(rt, seconds)
  S.eval(rt, ("require('lupin.runtime.flow')._advance(%s)"):format(seconds))
end

local function config(fc, extra)
  local c = {
    plugins = {
      { type = "queue-scorer" }, { type = "max-score-picker" }, { type = "finish-count" },
      { type = "concurrency-detector", parameters = { maxConcurrency = 1 } },
      { type = "round-robin-fairness-policy" }, { type = "edf-ordering-policy" },
      { type = "longest-queue-fairness" }, { type = "broken-fairness" }, { type = "window-probe" },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
    saturationDetector = { pluginRef = "concurrency-detector" },
    flowControl = fc or {},
  }
  for k, v in pairs(extra or {}) do
    c[k] = v
  end
  return c
end

-- A runtime with one endpoint and a dispatch callback recording results.
local function setup_rt(fc, extra, shared)
  local rt = S.loaded(config(fc, extra), { plugin_dirs = { S.FIXTURES, dir }, shared = shared })
  S.endpoints(rt, 1)
  local got = {}
  rt:set_dispatch(function(id, res)
    got[#got + 1] = { id = id, status = res.status, outcome = res.outcome, message = res.message,
      picks = res.picks }
  end)
  return rt, got
end

local function begin(rt, id, headers, body)
  return assert(rt:begin({ id = id, path = "/v1/completions", headers = headers,
    body = body or '{"model":"m","prompt":"hello"}' }))
end

local function counts(rt)
  return S.eval(rt, "return require('lupin.runtime').current.by_name['finish-count'].obj.counts")
end

local function ids(got)
  local out = {}
  for i, g in ipairs(got) do
    out[i] = g.id
  end
  return table.concat(out, " ")
end

describe("flow control", function()
  it("reads llm-d-router's objective header, and GIE's older one, the first winning", function()
    local rt = S.loaded({ plugins = { { type = "test-picker", name = "p" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "p" } } } } })
    finally(function() rt:free() end)
    assert.same({ -2, -3, 5, 0 }, S.eval(rt, [[
      local f, g = require "lupin.runtime.flow", require("lupin.runtime").current
      return { f.priority_of(g, { ["x-llm-d-inference-objective"] = "-2" }),
        f.priority_of(g, { ["x-gateway-inference-objective"] = "-3" }),
        f.priority_of(g, { ["x-llm-d-inference-objective"] = "5",
          ["x-gateway-inference-objective"] = "-3" }),
        f.priority_of(g, {}) }]]))
  end)

  it("is off without a flowControl section: a request is scheduled at once", function()
    local c = config()
    c.flowControl, c.saturationDetector = nil, nil
    local rt = S.loaded(c, { plugin_dirs = { S.FIXTURES, dir } })
    S.endpoints(rt, 1)
    rt:set_dispatch(function() error("no dispatch expected") end)
    local a, b = begin(rt, "a"), begin(rt, "b")
    assert.equal(200, a:schedule().status)
    assert.equal(200, b:schedule().status) -- nothing held, though the endpoint is busy
    assert.is_nil(rt:flows())
    a:finish("ok")
    b:finish("ok")
  end)

  it("holds nothing without a dispatch callback", function()
    local rt = S.loaded(config(), { plugin_dirs = { S.FIXTURES, dir } })
    S.endpoints(rt, 1)
    local a, b = begin(rt, "a"), begin(rt, "b")
    assert.equal(200, a:schedule().status)
    assert.equal(200, b:schedule().status)
    a:finish("ok")
    b:finish("ok")
  end)

  it("queues while saturated and dispatches on the end of a request", function()
    local rt, got = setup_rt()
    local a, b = begin(rt, "a"), begin(rt, "b")
    assert.equal(200, a:schedule().status)
    local res = b:schedule()
    assert.equal(0, res.status) -- LUPIN_QUEUED
    assert.is_true(b:flow().queued)
    assert.equal(0, b:schedule().status) -- asking again changes nothing
    assert.equal(0, #got)
    a:finish("ok")
    assert.equal("b", ids(got))
    assert.equal(200, got[1].status, got[1].message)
    assert.equal("ep1", got[1].picks[1].name)
    assert.is_false(b:flow().queued)
    assert.equal(200, b:schedule().status) -- the same answer, read again
    b:finish("ok")
    assert.same({ ok = 2 }, counts(rt))
  end)

  -- the detector reads ep.in_flight: every runtime (worker) of the process
  -- counts there, through flow control or not
  it("holds a request while another runtime sharing the state fills the endpoint", function()
    local shared = require("lupin_native").shared()
    local rt, got = setup_rt({}, nil, shared)
    local other = S.loaded(config(), { plugin_dirs = { S.FIXTURES, dir }, shared = shared })
    S.endpoints(other, 1)
    local x = begin(other, "x") -- no dispatch callback there: scheduled at once, counted
    assert.equal(200, x:schedule().status)
    assert.same({ ep1 = 1 }, S.in_flight(rt))
    local a = begin(rt, "a")
    assert.equal(0, a:schedule().status)
    x:finish("ok")
    assert.same({}, S.in_flight(rt))
    assert.equal(0, #got) -- this runtime hears of it on its own next event
    rt:tick()
    assert.equal("a", ids(got))
    assert.same({ ep1 = 1 }, S.in_flight(other))
    a:finish("ok")
    assert.same({}, S.in_flight(other))
    other:free()
    rt:free()
  end)

  it("dispatches on a metrics update and on a tick once the gate opens", function()
    local rt, got = setup_rt({}, { plugins = {
      { type = "queue-scorer" }, { type = "max-score-picker" }, { type = "finish-count" },
      { type = "utilization-detector", parameters = { queueDepthThreshold = 2,
        metricsStalenessThreshold = "1h" } } },
      saturationDetector = { pluginRef = "utilization-detector" } })
    rt:set_metrics("ep1", { waiting_queue_size = 5, kv_cache_usage = 0.1 })
    local a = begin(rt, "a")
    assert.equal(0, a:schedule().status)
    rt:tick()
    assert.equal(0, #got) -- still saturated: level 5 / 2
    rt:set_metrics("ep1", { waiting_queue_size = 0, kv_cache_usage = 0.1 })
    assert.equal("a", ids(got))
    -- sent since the scrape counts as waiting: a and b make the level 2 / 2,
    -- so c waits for a scrape
    local b, c = begin(rt, "b"), begin(rt, "c")
    assert.equal(200, b:schedule().status)
    assert.equal(0, c:schedule().status)
    rt:tick()
    assert.equal("a", ids(got))
    rt:set_metrics("ep1", { waiting_queue_size = 0, kv_cache_usage = 0.1 })
    assert.equal("a c", ids(got))
    for _, r in ipairs({ a, b, c }) do
      r:finish("ok")
    end
  end)

  it("serves bands by priority, objectives naming them", function()
    local rt, got = setup_rt({}, { objectives = { { name = "critical", priority = 10 },
      { name = "batch", priority = -1 } } })
    local first = begin(rt, "first")
    assert.equal(200, first:schedule().status)
    local low = begin(rt, "low", { ["x-gateway-inference-objective"] = "batch" })
    local mid = begin(rt, "mid")
    local high = begin(rt, "high", { ["x-gateway-inference-objective"] = "critical" })
    for _, r in ipairs({ low, mid, high }) do
      assert.equal(0, r:schedule().status)
    end
    assert.equal(10, high:flow().priority)
    assert.equal(-1, low:flow().priority)
    first:finish("ok")
    assert.equal("high", ids(got))
    high:finish("ok")
    mid:finish("ok")
    low:finish("ok")
    assert.equal("high mid low", ids(got))
    local flows = rt:flows()
    assert.equal(10, flows[1].priority)
    assert.equal(1, flows[1].dispatched)
  end)

  it("round-robin serves flows in turn; global-strict serves the oldest", function()
    for _, case in ipairs({ { "round-robin-fairness-policy", "a1 b1 a2 b2 a3" },
      { "global-strict-fairness-policy", "a1 a2 a3 b1 b2" } }) do
      local rt, got = setup_rt({ defaultPriorityBand = { fairnessPolicyRef = case[1] } })
      local first = begin(rt, "first")
      assert.equal(200, first:schedule().status)
      local reqs = {}
      for _, id in ipairs({ "a1", "a2", "a3", "b1", "b2" }) do
        local r = begin(rt, id, { ["x-gateway-inference-fairness-id"] = id:sub(1, 1) })
        assert.equal(0, r:schedule().status)
        reqs[id] = r
      end
      first:finish("ok")
      while #got < 5 do
        reqs[got[#got].id]:finish("ok")
      end
      reqs[got[#got].id]:finish("ok")
      assert.equal(case[2], ids(got), case[1])
    end
  end)

  it("edf serves the earliest deadline first; fcfs the first come", function()
    for _, case in ipairs({ { "edf-ordering-policy", "short long none" },
      { "fcfs-ordering-policy", "none long short" } }) do
      -- "none": no TTL, the 60 s default turned off
      local rt, got = setup_rt({ defaultRequestTTL = "0s",
        defaultPriorityBand = { orderingPolicyRef = case[1] } })
      local first = begin(rt, "first")
      assert.equal(200, first:schedule().status)
      local reqs = {}
      for _, x in ipairs({ { "none" }, { "long", "60s" }, { "short", "30" } }) do
        reqs[x[1]] = begin(rt, x[1], { ["x-lupin-request-ttl"] = x[2] })
        assert.equal(0, reqs[x[1]]:schedule().status)
      end
      first:finish("ok")
      while #got < 3 do
        reqs[got[#got].id]:finish("ok")
      end
      reqs[got[#got].id]:finish("ok")
      assert.equal(case[2], ids(got), case[1])
    end
  end)

  it("runs a fairness policy written in Lua against the queue API", function()
    local rt, got = setup_rt({ defaultPriorityBand = { fairnessPolicyRef = "longest-queue-fairness" } })
    local first = begin(rt, "first")
    assert.equal(200, first:schedule().status)
    local reqs = {}
    for _, id in ipairs({ "a1", "b1", "b2", "b3" }) do
      reqs[id] = begin(rt, id, { ["x-gateway-inference-fairness-id"] = id:sub(1, 1) })
      reqs[id]:schedule()
    end
    first:finish("ok")
    assert.equal("b1", ids(got))
    for _, r in pairs(reqs) do
      r:finish("ok")
    end
  end)

  it("falls back to the first flow when a policy fails, and logs it", function()
    local rt, got = setup_rt({ defaultPriorityBand = { fairnessPolicyRef = "broken-fairness" } })
    local first = begin(rt, "first")
    first:schedule()
    local b = begin(rt, "b", { ["x-gateway-inference-fairness-id"] = "z" })
    b:schedule()
    first:finish("ok")
    assert.equal("b", ids(got))
    local logs = table.concat((function()
      local out = {}
      for _, l in ipairs(rt:logs()) do
        out[#out + 1] = l[2]
      end
      return out
    end)(), "\n")
    assert.matches("broken on purpose", logs, 1, true)
    b:finish("ok")
  end)

  it("answers 429 queue_ttl past the TTL, sheddable or not, finish once", function()
    local rt, got = setup_rt({ defaultRequestTTL = "1ms" })
    local first = begin(rt, "first")
    first:schedule()
    local a = begin(rt, "a")
    local s = begin(rt, "s", { ["x-gateway-inference-objective"] = "-1" })
    assert.equal(0, a:schedule().status)
    assert.equal(0, s:schedule().status)
    advance(rt, 0.01)
    rt:tick()
    assert.equal("a s", ids(got))
    assert.equal(429, got[1].status, got[1].message) -- upstream's: the pool has endpoints
    assert.equal("queue_ttl", got[1].outcome)
    assert.matches("past its TTL", got[1].message)
    assert.equal(429, got[2].status, got[2].message)
    a:finish("ok") -- the host's outcome: the queue's wins
    s:finish("ok")
    first:finish("ok")
    assert.same({ ok = 1, queue_ttl = 2 }, counts(rt))
    assert.equal(2, rt:flows()[1].ttl + rt:flows()[2].ttl)
  end)

  -- llm-d-router's in-flight eviction: a sheddable request sent takes the
  -- blame when a higher band waits on a saturated pool; one at a time
  it("with enableEviction, ends a sent sheddable request for a higher band waiting", function()
    local SHED = { ["x-llm-d-inference-objective"] = "-1" }
    for _, on in ipairs({ false, true }) do
      local rt, got = setup_rt({ enableEviction = on })
      local evicted = {}
      rt:set_evict(function(id, message)
        evicted[#evicted + 1] = { id = id, message = message }
      end)
      local low = begin(rt, "low", SHED)
      assert.equal(200, low:schedule().status)
      local high = begin(rt, "high")
      assert.equal(0, high:schedule().status)
      rt:tick()
      if not on then
        assert.same({}, evicted)
        low:finish("ok")
        assert.equal("high", ids(got))
        high:finish("ok")
      else
        assert.equal(1, #evicted)
        assert.equal("low", evicted[1].id)
        assert.matches("evicted by flow control after it was sent (priority -1), to make room"
          .. " for a request of priority 0", evicted[1].message, 1, true)
        rt:tick() -- asked once: the host ends it
        assert.equal(1, #evicted)
        assert.equal("", ids(got))
        low:finish("evicted")
        assert.equal("high", ids(got)) -- into the freed place at once
        high:finish("ok")
        assert.same({ ok = 1, evicted = 1 }, counts(rt))
      end
      rt:free()
    end
  end)

  it("evicts the newest of the lowest band, never one at or above the band waiting", function()
    local rt, got = setup_rt({ enableEviction = true },
      { objectives = { { name = "scrap", priority = -2 }, { name = "batch", priority = -1 } } })
    S.eval(rt, [[require("lupin.runtime").current.by_name["concurrency-detector"].obj.max = 3]])
    local evicted = {}
    rt:set_evict(function(id)
      evicted[#evicted + 1] = id
    end)
    local reqs = {}
    for _, x in ipairs({ { "m2", "-2" }, { "m1a", "-1" }, { "m1b", "-1" } }) do
      reqs[x[1]] = begin(rt, x[1], { ["x-llm-d-inference-objective"] = x[2] })
      assert.equal(200, reqs[x[1]]:schedule().status)
    end
    -- a sheddable band waiting takes no place from its own band or above
    local w = begin(rt, "w", { ["x-llm-d-inference-objective"] = "-2" })
    assert.equal(0, w:schedule().status)
    rt:tick()
    assert.same({}, evicted)
    local h1, h2 = begin(rt, "h1"), begin(rt, "h2")
    assert.equal(0, h1:schedule().status)
    assert.equal(0, h2:schedule().status)
    rt:tick()
    assert.same({ "m2" }, evicted) -- the lowest priority first
    reqs.m2:finish("evicted")
    assert.equal("h1", ids(got))
    rt:tick() -- the grace after an eviction's end: nothing yet
    assert.same({ "m2" }, evicted)
    advance(rt, 0.6)
    rt:tick()
    assert.same({ "m2", "m1b" }, evicted) -- then the newest of the next band
    reqs.m1b:finish("evicted")
    assert.equal("h1 h2", ids(got))
    for _, r in ipairs({ reqs.m1a, h1, h2, w }) do
      r:finish("ok")
    end
    rt:free()
  end)

  it("reports the detector's level, and nil with flow control off", function()
    local rt = setup_rt({}, { plugins = {
      { type = "queue-scorer" }, { type = "max-score-picker" }, { type = "finish-count" },
      { type = "utilization-detector", parameters = { metricsStalenessThreshold = "1h" } } },
      saturationDetector = { pluginRef = "utilization-detector" } })
    rt:set_metrics("ep1", { waiting_queue_size = 2, kv_cache_usage = 0.4 })
    assert.near(0.5, rt:flow_saturation(), 1e-9) -- max(2 / 5, 0.4 / 0.8)
    rt:set_metrics("ep1", { waiting_queue_size = 15, kv_cache_usage = 0.4 })
    assert.near(3, rt:flow_saturation(), 1e-9)
    rt:free()
    local off = S.loaded({ plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } } })
    assert.is_nil(off:flow_saturation())
    off:free()
  end)

  -- upstream's sizing: the level's excess over 1, each request in flight
  -- weighing level / requests in flight, at least 1 and at most 2
  it("evicts as many as the level is over 1, at most two a decision", function()
    local rt, got = setup_rt({ enableEviction = true }, { objectives = { { name = "batch", priority = -1 } } })
    local function max(n)
      S.eval(rt, ([[require("lupin.runtime").current.by_name["concurrency-detector"].obj.max = %d]]):format(n))
    end
    max(4)
    local evicted, low = {}, {}
    rt:set_evict(function(id)
      evicted[#evicted + 1] = id
    end)
    for i = 1, 4 do
      low[i] = begin(rt, "l" .. i, { ["x-llm-d-inference-objective"] = "-1" })
      assert.equal(200, low[i]:schedule().status)
    end
    max(2) -- level 4 / 2: two requests over
    local h = begin(rt, "h")
    assert.equal(0, h:schedule().status)
    rt:tick()
    assert.same({ "l4", "l3" }, evicted) -- the last sent first, both in one decision
    rt:tick()
    assert.equal(2, #evicted) -- the next decision waits for both ends
    low[4]:finish("evicted")
    advance(rt, 0.6)
    rt:tick()
    assert.equal(2, #evicted)
    low[3]:finish("evicted") -- level 2 / 2 now: h waits, one more after the grace
    rt:tick()
    assert.equal(2, #evicted)
    advance(rt, 0.6)
    rt:tick()
    assert.same({ "l4", "l3", "l2" }, evicted) -- level 1: one
    low[2]:finish("evicted")
    assert.equal("h", ids(got))
    for _, r in ipairs({ low[1], h }) do
      r:finish("ok")
    end
    rt:free()
  end)

  it("hands over every one of many evicted requests, in order", function()
    local rt, got = setup_rt({ defaultRequestTTL = "1ms" })
    local first = begin(rt, "first")
    first:schedule()
    local reqs = {}
    for i = 1, 100 do
      reqs[i] = begin(rt, "r" .. i)
      assert.equal(0, reqs[i]:schedule().status)
    end
    reqs[50]:finish("cancelled") -- gone before its eviction is handed over
    advance(rt, 0.01)
    rt:tick()
    assert.equal(99, #got)
    for i, g in ipairs(got) do
      assert.equal("r" .. (i < 50 and i or i + 1), g.id)
      assert.equal("queue_ttl", g.outcome)
    end
    -- and again, with the list emptied in between
    local more = { begin(rt, "m1"), begin(rt, "m2") }
    more[1]:schedule()
    more[2]:schedule()
    advance(rt, 0.01)
    rt:tick()
    assert.equal(101, #got)
    for i, r in ipairs(reqs) do
      if i ~= 50 then
        r:finish("ok")
      end
    end
    more[1]:finish("ok")
    more[2]:finish("ok")
    first:finish("ok")
    assert.same({ ok = 1, cancelled = 1, queue_ttl = 101 }, counts(rt))
    assert.equal(0, rt:stats().live_requests)
  end)

  it("hands over an eviction whose request ended before the pump: skipped", function()
    local rt, got = setup_rt({ maxRequests = 1 })
    local first = begin(rt, "first")
    first:schedule()
    local s1 = begin(rt, "s1", { ["x-gateway-inference-objective"] = "-5" })
    s1:schedule()
    local hi = begin(rt, "hi")
    hi:schedule() -- sheds s1, handed over on the next pump
    s1:finish("cancelled")
    rt:tick()
    assert.equal(0, #got)
    first:finish("ok")
    assert.equal("hi", ids(got))
    hi:finish("ok")
  end)

  it("answers queue_full at once when a band or the whole queue is full", function()
    local rt = setup_rt({ maxRequests = 2, defaultPriorityBand = { maxBytes = "1Ki" } })
    local first = begin(rt, "first")
    first:schedule()
    local big = begin(rt, "big", nil, '{"model":"m","prompt":"' .. ("x"):rep(2000) .. '"}')
    local res = big:schedule()
    assert.equal(429, res.status)
    assert.equal("queue_full", res.outcome)
    assert.matches("queue is full for priority 0", res.message)
    local a, b, c = begin(rt, "a"), begin(rt, "b"), begin(rt, "c")
    assert.equal(0, a:schedule().status)
    assert.equal(0, b:schedule().status)
    res = c:schedule()
    assert.equal("queue_full", res.outcome)
    for _, r in ipairs({ first, big, a, b, c }) do
      r:finish("ok")
    end
    local n = counts(rt)
    assert.equal(2, n.queue_full)
    assert.equal(2, rt:flows()[1].full)
  end)

  it("sheds the newest sheddable request for a higher priority when full", function()
    local rt, got = setup_rt({ maxRequests = 2 })
    local first = begin(rt, "first")
    first:schedule()
    local s1 = begin(rt, "s1", { ["x-gateway-inference-objective"] = "-5" })
    local s2 = begin(rt, "s2", { ["x-gateway-inference-objective"] = "-5" })
    s1:schedule()
    s2:schedule()
    local hi = begin(rt, "hi")
    assert.equal(0, hi:schedule().status)
    assert.equal(0, #got) -- handed over on the next pump, never inside schedule
    rt:tick()
    assert.equal("s2", ids(got))
    assert.equal(429, got[1].status, got[1].message)
    assert.equal("shed", got[1].outcome)
    -- a sheddable request finds no one lower to shed: full
    local s3 = begin(rt, "s3", { ["x-gateway-inference-objective"] = "-5" })
    assert.equal("queue_full", s3:schedule().outcome)
    for _, r in ipairs({ first, s1, s2, hi, s3 }) do
      r:finish("ok")
    end
    assert.same({ ok = 3, shed = 1, queue_full = 1 }, counts(rt))
  end)

  it("removes a cancelled request from the queue at once, finish cancelled", function()
    local rt, got = setup_rt()
    local first = begin(rt, "first")
    first:schedule()
    local a, b = begin(rt, "a"), begin(rt, "b")
    a:schedule()
    b:schedule()
    assert.equal(2, rt:flows()[1].queued)
    a:finish("cancelled")
    assert.equal(1, rt:flows()[1].queued)
    assert.equal(1, rt:flows()[1].cancelled)
    first:finish("ok")
    assert.equal("b", ids(got))
    b:finish("ok")
    assert.same({ ok = 2, cancelled = 1 }, counts(rt))
  end)

  it("drains: every queued request answered 503 shed with the message", function()
    local rt, got = setup_rt()
    local first = begin(rt, "first")
    first:schedule()
    local a, b = begin(rt, "a"), begin(rt, "b")
    a:schedule()
    b:schedule()
    assert.equal(2, rt:flow_drain("shutting down"))
    assert.equal("a b", ids(got))
    assert.equal(503, got[1].status, got[1].message)
    assert.equal("shutting down", got[1].message)
    for _, r in ipairs({ first, a, b }) do
      r:finish("ok")
    end
    assert.same({ ok = 1, shed = 2 }, counts(rt))
  end)

  it("lets a callback end the request it is given, and others begin", function()
    local rt = S.loaded(config(), { plugin_dirs = { S.FIXTURES, dir } })
    S.endpoints(rt, 1)
    local reqs, order = {}, {}
    rt:set_dispatch(function(id)
      order[#order + 1] = id
      reqs[id]:finish("ok") -- ends at once: the next one is dispatched after
    end)
    local first = begin(rt, "first")
    first:schedule()
    for _, id in ipairs({ "a", "b", "c" }) do
      reqs[id] = begin(rt, id)
      reqs[id]:schedule()
    end
    first:finish("ok")
    assert.equal("a b c", table.concat(order, " "))
    assert.same({ ok = 4 }, counts(rt))
    assert.equal(0, rt:stats().live_requests)
  end)

  it("keeps queued requests on their generation over a reload", function()
    local rt, got = setup_rt()
    local first = begin(rt, "first")
    first:schedule()
    local a = begin(rt, "a")
    a:schedule()
    local c = config()
    c.plugins[#c.plugins + 1] = { type = "random-picker", name = "other" }
    assert(rt:load_string(S.json.encode(c), "spec2.json"))
    local gens = {}
    for _, g in ipairs(rt:generations()) do
      gens[#gens + 1] = g.number .. ":" .. g.pinned
    end
    assert.equal("2:0 1:2", table.concat(gens, " "))
    first:finish("ok")
    assert.equal("a", ids(got))
    assert.equal(200, got[1].status, got[1].message)
    a:finish("ok")
    assert.equal(1, #rt:generations())
  end)

  it("drops a band a reload no longer configures once nothing is in it", function()
    local rt, got = setup_rt({ flowGCTimeout = "1ms", priorityBands = { { priority = 7 } } })
    local first = begin(rt, "first")
    first:schedule()
    local a = begin(rt, "a", { ["x-gateway-inference-objective"] = "7" })
    assert.equal(0, a:schedule().status)
    assert(rt:load_string(S.json.encode(config({ flowGCTimeout = "1ms" })), "no7.json"))
    advance(rt, 0.01)
    rt:tick()
    assert.equal(7, rt:flows()[1].priority) -- a waits in it
    first:finish("ok")
    assert.equal("a", ids(got))
    a:finish("ok") -- no request left: the tick looks all the same
    advance(rt, 0.06) -- past flowGCTimeout and the 50 ms between two looks
    rt:tick()
    for _, f in ipairs(rt:flows()) do
      assert.is_not.equal(7, f.priority)
    end
    assert.equal(0, S.eval(rt, "return require('lupin.runtime.flow').state()").bands)
  end)

  it("lets everything waiting go when a reload turns flow control off", function()
    local rt, got = setup_rt()
    local first = begin(rt, "first")
    first:schedule()
    local a = begin(rt, "a")
    a:schedule()
    local c = config()
    c.flowControl, c.saturationDetector = nil, nil
    assert(rt:load_string(S.json.encode(c), "off.json"))
    rt:tick()
    assert.equal("a", ids(got))
    first:finish("ok")
    a:finish("ok")
  end)

  it("shows the wait in the explain record, apart from scheduling's time", function()
    local rt, got = setup_rt()
    local first = begin(rt, "first")
    first:schedule()
    local a = assert(rt:begin({ id = "a", path = "/v1/completions", explain = true,
      body = '{"model":"m","prompt":"hello"}' }))
    assert.equal(0, a:schedule().status)
    first:finish("ok")
    assert.equal("a", ids(got))
    local x = S.json.decode(a:explain("json"))
    assert.equal(200, x.status)
    assert.is_number(x.queue_wait_us)
    assert.matches("after [%d.e+]+ us in the flow%-control queue", a:explain("text"))
    a:finish("ok")
  end)

  -- A hostile client (docs/flow-control.md, "What a client can make"):
  -- thousands of distinct integer objectives and fairness ids, each queued
  -- and then abandoned, leave the bands those the config names and the
  -- flows reaped once idle; the configured bands keep their order.
  it("keeps bands to the configured priorities and reaps idle flows", function()
    local rt, got = setup_rt({ flowGCTimeout = "1ms", priorityBands = { { priority = 5 } } },
      { objectives = { { name = "critical", priority = 10 }, { name = "batch", priority = -1 } } })
    local first = begin(rt, "first")
    assert.equal(200, first:schedule().status)
    local want = { ["-1000"] = -1, ["-2"] = -1, ["3"] = 0, ["7"] = 5, ["11"] = 10, ["99999"] = 10,
      ["5"] = 5, ["-1"] = -1, ["0"] = 0 }
    for v, p in pairs(want) do
      local r = begin(rt, "probe", { ["x-gateway-inference-objective"] = v })
      assert.equal(0, r:schedule().status)
      assert.equal(p, r:flow().priority, v)
      r:finish("cancelled")
    end
    for i = 1, 3000 do
      local r = begin(rt, "spam" .. i, { ["x-gateway-inference-objective"] = tostring(i * 7 - 9000),
        ["x-gateway-inference-fairness-id"] = "tenant-" .. i })
      assert.equal(0, r:schedule().status)
      r:finish("cancelled")
    end
    local state = S.eval(rt, "return require('lupin.runtime.flow').state()")
    assert.equal(4, state.bands) -- 10, 5, 0, -1
    assert.is_true(state.flows >= 3000) -- not reaped yet: no tick since
    local prios, clamped = {}, 0
    for _, f in ipairs(rt:flows()) do
      if not f.flow then
        prios[#prios + 1] = f.priority
        clamped = clamped + f.clamped
      end
    end
    assert.same({ 10, 5, 0, -1 }, prios)
    assert.equal(6 + 3000, clamped) -- all but "5", "-1" and "0" (no i * 7 - 9000 is configured)
    advance(rt, 0.01)
    rt:tick()
    state = S.eval(rt, "return require('lupin.runtime.flow').state()")
    assert.equal(0, state.flows)
    assert.equal(4, state.bands)
    -- the configured bands, and an integer naming one, still in order
    local low = begin(rt, "low", { ["x-gateway-inference-objective"] = "batch" })
    local mid = begin(rt, "mid", { ["x-gateway-inference-fairness-id"] = "tenant-1" })
    local five = begin(rt, "five", { ["x-gateway-inference-objective"] = "5" })
    local high = begin(rt, "high", { ["x-gateway-inference-objective"] = "critical" })
    for _, r in ipairs({ low, mid, five, high }) do
      assert.equal(0, r:schedule().status)
    end
    first:finish("ok")
    for _, r in ipairs({ high, five, mid, low }) do
      r:finish("ok")
    end
    assert.equal("high five mid low", ids(got))
  end)

  it("ends queued requests as cancelled when the runtime is freed, no callback", function()
    local rt, got = setup_rt()
    local first = begin(rt, "first")
    first:schedule()
    local a = begin(rt, "a")
    a:schedule()
    rt:free()
    assert.equal(0, #got)
  end)
end)

-- Two runtimes made with one lupin_shared, as two workers of lupin serve
-- (docs/workers.md): each queues its own requests; limits, band precedence
-- and which runtime sends next are the process's.
describe("flow control across runtimes sharing their state", function()
  local function pair(fc, extra)
    local shared = require("lupin_native").shared()
    local rt1, got1 = setup_rt(fc, extra, shared)
    local rt2, got2 = setup_rt(fc, extra, shared)
    return rt1, got1, rt2, got2
  end

  it("counts a band's and the whole queue's limits over every runtime", function()
    local rt1, _, rt2 = pair({ maxRequests = 2, defaultPriorityBand = { maxRequests = 1 } },
      { objectives = { { name = "gold", priority = 5 } } })
    local first = begin(rt1, "first")
    assert.equal(200, first:schedule().status)
    local a = begin(rt1, "a")
    assert.equal(0, a:schedule().status)
    assert.equal(1, rt2:flow_elsewhere())
    assert.equal(0, rt1:flow_elsewhere())
    local b = begin(rt2, "b")
    local res = b:schedule()
    assert.equal(429, res.status)
    assert.equal("queue_full", res.outcome)
    assert.matches("queue is full for priority 0 (band: 1 requests", res.message, 1, true)
    -- another band has room, the whole queue one place: taken on rt2, full on rt1
    local g1 = begin(rt2, "g1", { ["x-gateway-inference-objective"] = "gold" })
    assert.equal(0, g1:schedule().status)
    local g2 = begin(rt1, "g2", { ["x-gateway-inference-objective"] = "gold" })
    res = g2:schedule()
    assert.equal("queue_full", res.outcome)
    assert.matches("all bands: 2 requests", res.message, 1, true)
    -- a place freed in one runtime is free in the other
    a:finish("cancelled")
    local c = begin(rt2, "c")
    assert.equal(0, c:schedule().status)
    for _, r in ipairs({ first, b, g1, g2, c }) do
      r:finish("ok")
    end
    assert.equal(0, rt1:flow_elsewhere())
    assert.equal(0, rt2:flow_elsewhere())
    assert.same({ 5, 1 }, { rt1:flows()[1].priority, rt1:flows()[1].full }) -- g2
    assert.same({ 0, 1 }, { rt2:flows()[2].priority, rt2:flows()[2].full }) -- b
    rt1:free()
    rt2:free()
  end)

  -- rt1's endpoint busy with "first", "plain" queued on rt1, "gold" (a
  -- higher band) queued on rt2
  local function plain_and_gold(extra)
    extra = extra or {}
    extra.objectives = { { name = "gold", priority = 5 } }
    local rt1, got1, rt2, got2 = pair({}, extra)
    local first = begin(rt1, "first")
    assert.equal(200, first:schedule().status)
    local plain = begin(rt1, "plain")
    assert.equal(0, plain:schedule().status)
    local gold = begin(rt2, "gold", { ["x-gateway-inference-objective"] = "gold" })
    assert.equal(0, gold:schedule().status)
    return rt1, got1, rt2, got2, first, plain, gold
  end

  -- gold ends: rt1's next tick sends plain; then both runtimes go
  local function gold_then_plain(rt1, got1, rt2, plain, gold)
    gold:finish("ok")
    rt1:tick()
    assert.equal("plain", ids(got1))
    plain:finish("ok")
    rt1:free()
    rt2:free()
  end

  it("sends no band while a higher one waits in another runtime", function()
    local rt1, got1, rt2, got2, first, plain, gold = plain_and_gold()
    first:finish("ok")
    assert.equal("", ids(got1)) -- gold waits on rt2: plain stays
    assert.equal(1, rt1:flow_elsewhere())
    rt2:tick() -- what lupin serve posts to the other workers when a request ends
    assert.equal("gold", ids(got2))
    gold_then_plain(rt1, got1, rt2, plain, gold)
  end)

  it("orders a configured band across runtimes after a client sent 5000 priorities", function()
    local rt1, got1, rt2, got2, first, plain, gold = plain_and_gold()
    for i = 1, 5000 do
      local r = begin(rt1, "spam" .. i, { ["x-gateway-inference-objective"] = tostring(i + 6) })
      assert.equal(0, r:schedule().status)
      r:finish("cancelled")
    end
    -- the process's dict lists the priorities queued (0 and 5), not one per value
    assert.equal(2, S.eval(rt1, "return require('lupin.shared')._runtime_dict('lupin.flow'):get('prios')"))
    assert.equal(5000, rt1:flows()[1].clamped) -- all clamped to gold's 5
    first:finish("ok")
    assert.equal("", ids(got1)) -- gold waits on rt2: plain stays
    rt2:tick()
    assert.equal("gold", ids(got2))
    gold_then_plain(rt1, got1, rt2, plain, gold)
  end)

  it("counts a request it lets through as waiting until it is counted in flight", function()
    local profiles = { { name = "default", plugins = { { pluginRef = "window-probe" },
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } }
    local rt1, got1, rt2, got2, first, plain, gold = plain_and_gold({
      schedulingProfiles = profiles })
    -- what rt1's gate reads of gold (its band's count, its published arrival)
    -- and of the endpoint, at the moment rt2 schedules it out of its queue
    S.eval(rt2, [[
      local obj = require('lupin.runtime').current.by_name['window-probe'].obj
      local d = require('lupin.shared')._runtime_dict('lupin.flow')
      obj.probe = function(eps)
        obj.seen = { waiting = d:get('n:5'), arrival = d:get('o:5:2') ~= nil,
          in_flight = eps[1].in_flight }
      end]])
    first:finish("ok")
    rt2:tick()
    assert.equal("gold", ids(got2))
    assert.same({ waiting = 1, arrival = true, in_flight = 0 }, S.eval(rt2,
      "return require('lupin.runtime').current.by_name['window-probe'].obj.seen"))
    -- after: out of the counts, in flight, so the endpoint holds plain
    assert.equal(0, rt1:flow_elsewhere())
    rt1:tick()
    assert.equal("", ids(got1))
    gold_then_plain(rt1, got1, rt2, plain, gold)
  end)

  it("lets the runtime holding the band's oldest request send next", function()
    local rt1, got1, rt2, got2 = pair()
    local first = begin(rt1, "first")
    assert.equal(200, first:schedule().status)
    local a = begin(rt2, "a")
    assert.equal(0, a:schedule().status)
    local b = begin(rt1, "b")
    assert.equal(0, b:schedule().status)
    local c = begin(rt2, "c")
    assert.equal(0, c:schedule().status)
    first:finish("ok")
    assert.equal("", ids(got1)) -- a, on rt2, came first
    rt2:tick()
    assert.equal("a", ids(got2))
    a:finish("ok") -- rt2 frees the place; b, on rt1, is the oldest now
    assert.equal("a", ids(got2))
    rt1:tick()
    assert.equal("b", ids(got1))
    b:finish("ok")
    rt2:tick()
    assert.equal("a c", ids(got2))
    c:finish("ok")
    rt1:free()
    rt2:free()
  end)

  it("leaves no count behind when a runtime is freed with requests queued", function()
    local rt1, _, rt2 = pair()
    local first = begin(rt1, "first")
    first:schedule()
    local a = begin(rt1, "a")
    assert.equal(0, a:schedule().status)
    assert.equal(1, rt2:flow_elsewhere())
    rt1:free()
    assert.equal(0, rt2:flow_elsewhere())
    local b = begin(rt2, "b")
    assert.equal(200, b:schedule().status) -- nothing waits ahead of it, the endpoint is free
    b:finish("ok")
    rt2:free()
  end)
end)
