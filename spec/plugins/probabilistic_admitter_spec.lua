-- probabilistic-admitter: a sheddable request (priority < 0) is refused with
-- 429 with probability min(saturation ^ power * k, 1), the saturation being
-- the candidates' mean of max(waiting / queueDepthThreshold, KV use /
-- kvCacheUtilThreshold).  The vectors marked "upstream" are those of
-- llm-d-router's pkg/epp/framework/plugins/requestcontrol/admitter/
-- probabilisticadmitter/plugin_test.go.
local K = require "plugins.kit"
local S = require "support"

local T = "probabilistic-admitter"

-- ep1..epn with these metrics, scraped now (false: never scraped), the
-- admitter (params) in a config with random-picker.
local function runtime(metrics, params)
  local rt = S.loaded(K.config({ { type = T, parameters = params }, { type = "random-picker" } },
    { { pluginRef = "random-picker" } }))
  S.endpoints(rt, #metrics, metrics)
  return rt
end

-- The instance's verdict for a request of a.priority (nil: none given) on
-- the endpoints a.names names (default all), its random draw fixed at
-- a.draw (nil: the real one); also the pool's saturation the message gives.
local CALL = [[
local a = require("cjson").decode(%q)
local eps, by = {}, {}
for _, ep in ipairs(require("lupin.runtime.pool").list) do
  by[ep.name] = ep
  eps[#eps + 1] = ep
end
if a.names then
  eps = {}
  for i, n in ipairs(a.names) do eps[i] = by[n] end
end
local rand = self.rand
if a.draw then
  self.rand = function() return a.draw end
end
local ok, status, reason = self:admit({ shared = {},
  request = { id = "spec", headers = {}, priority = a.priority } }, eps)
self.rand = rand
return { admitted = ok ~= false, status = status, reason = reason }
]]

local function admit(rt, a)
  local out = K.instance(rt, T, CALL:format(S.json.encode(a)))
  return out.admitted, out.status, out.reason
end

describe(T, function()
  it("has upstream's defaults and takes every parameter", function()
    local rt = S.runtime()
    assert.same({ queueDepthThreshold = 5, kvCacheUtilThreshold = 0.8, power = 5, k = 300 },
      K.params(rt, T))
    -- upstream TestFactory's parameters
    assert.same({ queueDepthThreshold = 10, kvCacheUtilThreshold = 0.9, power = 3, k = 100 },
      K.params(rt, T, { queueDepthThreshold = 10, kvCacheUtilThreshold = 0.9, power = 3, k = 100 }))
    rt:free()
  end)

  -- upstream TestFactory_Zero*, TestFactory_Negative*: every parameter must be > 0
  for _, c in ipairs({
    { '"queueDepthThreshold": 0', "queueDepthThreshold: must be an integer ≥ 1, got 0" },
    { '"queueDepthThreshold": 2.5', "queueDepthThreshold: must be an integer ≥ 1, got 2.5" },
    { '"kvCacheUtilThreshold": 0', "kvCacheUtilThreshold: must be a number > 0, got 0" },
    { '"power": -1', "power: must be a number > 0, got -1" },
    { '"power": 0', "power: must be a number > 0, got 0" },
    { '"k": -1', "k: must be a number > 0, got -1" },
    { '"k": 0', "k: must be a number > 0, got 0" },
    { '"k": "300"', 'k: must be a number > 0, got "300"' },
    { '"K": 300', 'K: unknown parameter "K"; known parameters: k, kvCacheUtilThreshold, power,'
      .. " queueDepthThreshold" },
  }) do
    it("refuses " .. c[1] .. " at its line", function()
      local err = K.load_error({ '{"type": "probabilistic-admitter", "parameters": {' .. c[1] .. "}}" })
      assert.matches("spec.json:3: plugins[0].parameters." .. c[2], err, 1, true)
    end)
  end

  it("always admits priority ≥ 0 and a request with none, however saturated (upstream)", function()
    local rt = runtime({ { waiting_queue_size = 100 } })
    assert.is_true(admit(rt, { priority = 0, draw = 0 }))
    assert.is_true(admit(rt, { priority = 100, draw = 0 }))
    assert.is_true(admit(rt, { draw = 0 }))
    assert.is_false(admit(rt, { priority = -1, draw = 0 }))
  end)

  it("refuses a sheddable request with 429 at high saturation, saying why (upstream)", function()
    -- waiting 100 / 5 = saturation 20: shed for sure, even at the highest draw
    local admitted, status, reason = admit(runtime({ { waiting_queue_size = 100 } }),
      { priority = -2, draw = 0.999999 })
    assert.is_false(admitted)
    assert.equal(429, status)
    assert.equal("sheddable request shed (priority -2 < 0): the pool's saturation is 20.000, so"
      .. " sheddable requests are shed with probability 1.00; retry later or raise its priority", reason)
  end)

  it("admits a sheddable request at zero saturation, and with no candidates (upstream)", function()
    local rt = runtime({ { waiting_queue_size = 0, kv_cache_usage = 0 } })
    assert.is_true(admit(rt, { priority = -1, draw = 0 }))
    assert.is_true(admit(rt, { priority = -1, draw = 0, names = {} }))
  end)

  it("counts a never-scraped endpoint, or a NaN metric, as fully saturated", function()
    -- upstream TestNilMetricsTreatedAsSaturated: saturation 1, probability 1
    local rt = runtime({ false, { waiting_queue_size = 0 / 0 }, { kv_cache_usage = 0 / 0 },
      { waiting_queue_size = 0, kv_cache_usage = 0 } })
    for _, name in ipairs({ "ep1", "ep2", "ep3" }) do
      local admitted, _, reason = admit(rt, { priority = -1, draw = 0.999999, names = { name } })
      assert.is_false(admitted)
      assert.matches("saturation is 1.000,", reason, 1, true)
    end
    -- averaged with an idle one: 0.5 ^ 5 * 300 > 1
    local _, _, reason = admit(rt, { priority = -1, draw = 0.99, names = { "ep1", "ep4" } })
    assert.matches("saturation is 0.500, so sheddable requests are shed with probability 1.00", reason,
      1, true)
  end)

  it("averages the candidates' saturations, each its larger ratio (upstream)", function()
    -- ep1: max(10 / 5, 0) = 2; ep2: 0; mean 1
    local rt = runtime({ { waiting_queue_size = 10 }, { waiting_queue_size = 0 },
      { waiting_queue_size = 1, kv_cache_usage = 0.4 } })
    local _, _, reason = admit(rt, { priority = -1, draw = 0, names = { "ep1", "ep2" } })
    assert.matches("saturation is 1.000,", reason, 1, true)
    -- ep3: max(1 / 5, 0.4 / 0.8) = 0.5; with ep2: 0.25 ^ 5 * 300 = 0.29
    _, _, reason = admit(rt, { priority = -1, draw = 0, names = { "ep2", "ep3" } })
    assert.matches("saturation is 0.250, so sheddable requests are shed with probability 0.29", reason,
      1, true)
    assert.is_true(admit(rt, { priority = -1, draw = 0.3, names = { "ep2", "ep3" } }))
  end)

  it("sheds for sure from saturation (1/k)^(1/power): 0.34 by default (upstream)", function()
    -- TestQuinticProperty: KV 0.272 / 0.8 = 0.34
    local rt = runtime({ { kv_cache_usage = 0.272 } })
    local admitted, _, reason = admit(rt, { priority = -1, draw = 0.999 })
    assert.is_false(admitted)
    assert.matches("saturation is 0.340, so sheddable requests are shed with probability 1.00", reason,
      1, true)
  end)

  it("sheds at random below that: the draw against the probability (upstream)", function()
    -- TestProbabilisticShedding: KV 0.16 / 0.8 = 0.2, 0.2 ^ 5 * 300 = 0.096
    local rt = runtime({ { kv_cache_usage = 0.16 } })
    assert.is_true(admit(rt, { priority = -1, draw = 0.9 }))
    assert.is_true(admit(rt, { priority = -1, draw = 0.096 }))
    local admitted, _, reason = admit(rt, { priority = -1, draw = 0.0959 })
    assert.is_false(admitted)
    assert.matches("with probability 0.10;", reason, 1, true)
    assert.is_false(admit(rt, { priority = -1, draw = 0 }))
  end)

  it("uses queueDepthThreshold, kvCacheUtilThreshold, power and k", function()
    local m = { { waiting_queue_size = 2, kv_cache_usage = 0.3 } }
    -- defaults: max(2 / 5, 0.3 / 0.8) = 0.4: 0.4 ^ 5 * 300 > 1
    assert.is_false(admit(runtime(m), { priority = -1, draw = 0.99 }))
    -- max(2 / 10, 0.3 / 0.8) = 0.375, 0.375 ^ 5 * 100 = 0.742
    local _, _, reason = admit(runtime(m, { queueDepthThreshold = 10, k = 100 }), { priority = -1, draw = 0 })
    assert.matches("saturation is 0.375, so sheddable requests are shed with probability 0.74", reason, 1, true)
    -- max(2 / 10, 0.3 / 1) = 0.3, 0.3 ^ 2 * 1 = 0.09
    local rt = runtime(m, { queueDepthThreshold = 10, kvCacheUtilThreshold = 1, power = 2, k = 1 })
    _, _, reason = admit(rt, { priority = -1, draw = 0 })
    assert.matches("saturation is 0.300, so sheddable requests are shed with probability 0.09", reason, 1, true)
    assert.is_true(admit(rt, { priority = -1, draw = 0.09 }))
  end)

  it("sheds about the curve's share of sheddable requests with its real draws", function()
    -- probability 0.096 (above): 2000 draws shed 192 ± 5 standard deviations
    local rt = runtime({ { kv_cache_usage = 0.16 } })
    local shed = K.instance(rt, T, [[
local eps = require("lupin.runtime.pool").list
local n = 0
for _ = 1, 2000 do
  if self:admit({ shared = {}, request = { id = "spec", headers = {}, priority = -1 } }, eps) == false then
    n = n + 1
  end
end
return n]])
    assert.is_true(shed > 192 - 66 and shed < 192 + 66, "shed " .. shed)
  end)

  it("refuses a request whose objective header makes it sheddable, end to end", function()
    local rt = runtime({ { waiting_queue_size = 100 } })
    local function status(headers)
      local req = assert(rt:begin({ path = "/v1/completions", headers = headers,
        body = '{"model":"m","prompt":"hello"}' }))
      local res = req:schedule()
      req:finish(res.status == 200 and "ok" or "rejected")
      return res.status, res
    end
    local code, res = status({ ["x-llm-d-inference-objective"] = "-1" })
    assert.equal(429, code)
    assert.matches("sheddable request shed (priority -1 < 0)", S.json.encode(res), 1, true)
    assert.equal(429, (status({ ["x-gateway-inference-objective"] = "-3" })))
    assert.equal(200, (status({ ["x-llm-d-inference-objective"] = "0" })))
    assert.equal(200, (status({})))
  end)
end)
