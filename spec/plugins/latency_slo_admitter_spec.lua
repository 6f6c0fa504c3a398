-- latency-slo-admitter: a sheddable request is refused with 429 when no
-- candidate has a valid prediction, none is idle and none is cold; the
-- others, and requests it cannot judge, are admitted.  The predictions are
-- put in ctx.shared under lupin.slo.KEY as predicted-latency-producer
-- publishes them, and ctx.request.priority as flow control computes it.
local K = require "plugins.kit"
local S = require "support"

local T = "latency-slo-admitter"

-- ep1..ep3 with these metrics (warm by default), the admitter in the config
-- and header-based-testing-filter to put requests in flight where a spec
-- wants them.
local function runtime(params, metrics)
  local rt = S.loaded(K.config({ { type = "header-based-testing-filter" }, { type = T, parameters = params },
    { type = "max-score-picker" } }, { { pluginRef = "header-based-testing-filter" },
    { pluginRef = "max-score-picker" } }))
  local warm = { kv_cache_usage = 0.5, waiting_queue_size = 1 }
  metrics = metrics or {}
  S.endpoints(rt, 3, { metrics[1] or warm, metrics[2] or warm, metrics[3] or warm })
  return rt
end

-- Holds a request in flight on the endpoint named (admitted: no producer).
local function hold(rt, name)
  local req = assert(rt:begin({ path = "/v1/completions", headers = { ["test-epp-endpoint-selection"] = name },
    body = '{"model":"m","prompt":"hello"}' }))
  assert.equal(200, req:schedule().status)
  return req
end

-- The instance's verdict with predictions `pl` (endpoints keyed by name;
-- nil: no producer) for a request of `priority` (nil: none given) on the
-- endpoints named (default all).
local CALL = K.PREDICTED .. [[
local ok, status, reason = self:admit({ shared = shared,
  request = { id = "spec", headers = {}, priority = a.priority } }, eps)
return { admitted = ok ~= false, status = status, reason = reason }
]]

local function admit(rt, a)
  local out = K.instance(rt, T, CALL:format(S.json.encode(a)))
  return out.admitted, out.status, out.reason
end

local function pred(valid, dispatched)
  local h = valid and 10 or -10
  return { ttft = 100 - h, tpot = 20, ttft_headroom = h, tpot_headroom = 0, ttft_valid = valid,
    tpot_valid = true, valid = valid, dispatched = dispatched or 2 }
end

local SLO = { ttft = 100, tpot = 20 }
-- every candidate predicted to miss, busy and warm
local MISS = { slo = SLO, endpoints = { ep1 = pred(false), ep2 = pred(false), ep3 = pred(false) } }
local REASON = "no endpoint can meet the request's latency objectives (ttft 100 ms, tpot 20 ms): none is"
  .. " predicted within them, none is idle, none is cold; the request is sheddable (priority -1 < 0);"
  .. " retry later or raise its priority"

describe(T, function()
  it("sheds by default only priority < 0, and takes an integer priorityThreshold", function()
    local rt = S.runtime()
    assert.same({ priorityThreshold = 0 }, K.params(rt, T))
    rt:free()
    assert.matches("parameters.priorityThreshold: must be an integer, got 0.5",
      K.load_error({ '{"type": "latency-slo-admitter", "parameters": {"priorityThreshold": 0.5}}' }), 1, true)
  end)

  it("refuses a sheddable request with 429 when no endpoint is valid, idle or cold", function()
    local admitted, status, reason = admit(runtime(), { pl = MISS, priority = -1 })
    assert.is_false(admitted)
    assert.equal(429, status)
    assert.equal(REASON, reason)
  end)

  it("names only the objectives the request set", function()
    local pl = { slo = { tpot = 12.5 }, endpoints = MISS.endpoints }
    local _, _, reason = admit(runtime(), { pl = pl, priority = -3 })
    assert.matches("latency objectives (tpot 12.5 ms): ", reason, 1, true)
    assert.matches("(priority -3 < 0)", reason, 1, true)
  end)

  it("admits when one candidate has a valid prediction", function()
    local rt = runtime()
    local pl = { slo = SLO, endpoints = { ep1 = pred(false), ep2 = pred(true), ep3 = pred(false) } }
    assert.is_true(admit(rt, { pl = pl, priority = -1 }))
    -- only the candidates count
    assert.is_false(admit(rt, { pl = pl, priority = -1, names = { "ep1", "ep3" } }))
  end)

  it("admits when one candidate is idle: nothing dispatched, or nothing in flight without a prediction", function()
    local rt = runtime()
    local pl = { slo = SLO, endpoints = { ep1 = pred(false), ep2 = pred(false, 0), ep3 = pred(false) } }
    assert.is_true(admit(rt, { pl = pl, priority = -1 }))
    -- ep3 without a prediction: idle while nothing is in flight there
    pl = { slo = SLO, endpoints = { ep1 = pred(false), ep2 = pred(false) } }
    assert.is_true(admit(rt, { pl = pl, priority = -1 }))
    local held = hold(rt, "ep3")
    local admitted, status = admit(rt, { pl = pl, priority = -1 })
    assert.is_false(admitted)
    assert.equal(429, status)
    held:finish("ok")
    assert.is_true(admit(rt, { pl = pl, priority = -1 }))
  end)

  it("admits when one candidate is cold: KV cache under 2% used, or never scraped", function()
    assert.is_true(admit(runtime(nil, { nil, { kv_cache_usage = 0.019 } }), { pl = MISS, priority = -1 }))
    assert.is_false(admit(runtime(nil, { nil, { kv_cache_usage = 0.02 } }), { pl = MISS, priority = -1 }))
    local rt = S.loaded(K.config({ { type = T } }))
    S.endpoints(rt, 3, { { kv_cache_usage = 0.5 }, { kv_cache_usage = 0.5 } }) -- ep3 never scraped
    assert.is_true(admit(rt, { pl = MISS, priority = -1 }))
    assert.is_false(admit(rt, { pl = MISS, priority = -1, names = { "ep1", "ep2" } }))
  end)

  it("admits requests it cannot judge: no producer, no objective, no prediction, no candidate", function()
    local rt = runtime()
    assert.is_true(admit(rt, { priority = -1 }))
    assert.is_true(admit(rt, { pl = { slo = {}, endpoints = MISS.endpoints }, priority = -1 }))
    local held = { hold(rt, "ep1"), hold(rt, "ep2"), hold(rt, "ep3") } -- nothing idle
    assert.is_true(admit(rt, { pl = { slo = SLO, endpoints = {} }, priority = -1 }))
    assert.is_true(admit(rt, { pl = MISS, priority = -1, names = {} }))
    for _, req in ipairs(held) do
      req:finish("ok")
    end
  end)

  it("always admits a request at or over priorityThreshold, priority 0 when none is given", function()
    local rt = runtime()
    assert.is_true(admit(rt, { pl = MISS, priority = 0 }))
    assert.is_true(admit(rt, { pl = MISS, priority = 7 }))
    assert.is_true(admit(rt, { pl = MISS }))
    rt = runtime({ priorityThreshold = 5 })
    assert.is_true(admit(rt, { pl = MISS, priority = 5 }))
    local admitted, status, reason = admit(rt, { pl = MISS, priority = 4 })
    assert.is_false(admitted)
    assert.equal(429, status)
    assert.matches("(priority 4 < 5)", reason, 1, true)
    assert.is_false(admit(rt, { pl = MISS })) -- none given: 0 < 5
    rt = runtime({ priorityThreshold = -2 })
    assert.is_true(admit(rt, { pl = MISS, priority = -1 }))
    assert.is_false(admit(rt, { pl = MISS, priority = -3 }))
  end)
end)
