local K = require "plugins.kit"
local S = require "support"
local native = require "lupin_native"

local T = "saturation-detector"
local SHED = { ["x-gateway-inference-objective"] = "-1" } -- a sheddable request
local REASON = "system saturated, sheddable request dropped"

-- Freshness without timing: a scrape an hour in the future is fresh under any
-- threshold, one 100 s ago is stale under the default 200 ms.
local function fresh(m)
  m.scraped_at = native.now() + 3600
  return m
end

local function stale(m)
  m.scraped_at = native.now() - 100
  return m
end

local function admit(rt, params, headers, names)
  local out = K.call(rt, { type = T, params = params, point = "admit", headers = headers or SHED,
    names = names })
  return out.admitted, out.status, out.reason
end

describe(T, function()
  -- llm-d-router's legacy admission with its utilization-detector: the
  -- level is the mean of max(queue / 5, kv / 0.8), stale endpoints 1
  it("admits while the candidates' mean level is under 1", function()
    local rt = K.pool(2, { fresh({ waiting_queue_size = 9, kv_cache_usage = 0.1 }), -- 1.8
      fresh({ waiting_queue_size = 0, kv_cache_usage = 0.08 }) }) -- 0.1
    assert.is_true(admit(rt))
  end)

  it("rejects with 429 once the mean level reaches 1, one endpoint idle or not", function()
    local rt = K.pool(2, { fresh({ waiting_queue_size = 10, kv_cache_usage = 0 }), -- 2
      fresh({ waiting_queue_size = 0, kv_cache_usage = 0 }) }) -- 0
    local admitted, status, reason = admit(rt)
    assert.is_false(admitted)
    assert.equal(429, status)
    assert.equal(REASON, reason)
    rt = K.pool(1, { fresh({ waiting_queue_size = 5, kv_cache_usage = 0.1 }) }) -- exactly 1
    assert.is_false(admit(rt))
  end)

  it("scores stale and never-scraped endpoints 1, and rejects with no candidates", function()
    local rt = K.pool(3, { stale({ waiting_queue_size = 0, kv_cache_usage = 0 }),
      fresh({ waiting_queue_size = 1, kv_cache_usage = 0 }) }) -- ep3 never scraped
    assert.is_true(admit(rt)) -- (1 + 0.2 + 1) / 3
    assert.is_false(admit(rt, nil, nil, { "ep1", "ep3" })) -- (1 + 1) / 2
    assert.is_false(admit(rt, nil, nil, { "ep3" }))
    assert.is_false(admit(rt, nil, nil, {}))
    assert.is_true(admit(rt, nil, nil, { "ep1", "ep2" })) -- (1 + 0.2) / 2
    -- the stale endpoint is fresh again under a threshold it is within
    assert.is_true(admit(rt, { metricsStalenessThreshold = "1h" }, nil, { "ep1", "ep2" }))
    assert.is_true(admit(rt, { metricsStalenessThreshold = "1h" }, nil, { "ep1" }))
    assert.is_false(admit(rt, { metricsStalenessThreshold = "1m" }, nil, { "ep1" }))
    assert.is_true(admit(rt, { metricsStalenessThreshold = 101000 }, nil, { "ep1" }))
  end)

  it("scores an endpoint with NaN metrics 1", function()
    local rt = K.pool(2, { fresh({ waiting_queue_size = 0 / 0 }), fresh({ kv_cache_usage = 0 / 0 }) })
    assert.is_false(admit(rt))
  end)

  it("uses queueDepthThreshold and kvCacheUtilThreshold", function()
    local rt = K.pool(1, { fresh({ waiting_queue_size = 1, kv_cache_usage = 0.5 }) })
    assert.is_true(admit(rt))
    assert.is_false(admit(rt, { queueDepthThreshold = 1 }))
    assert.is_true(admit(rt, { queueDepthThreshold = 2, kvCacheUtilThreshold = 0.51 }))
    assert.is_false(admit(rt, { kvCacheUtilThreshold = 0.5 }))
  end)

  it("never sheds a request whose priority is ≥ 0, absent, or an objective name", function()
    local rt = K.pool(1, { fresh({ waiting_queue_size = 100, kv_cache_usage = 1 }) })
    local H = "x-gateway-inference-objective"
    assert.is_true(admit(rt, nil, {}))
    assert.is_true(admit(rt, nil, { [H] = "0" }))
    assert.is_true(admit(rt, nil, { [H] = "7" }))
    assert.is_true(admit(rt, nil, { [H] = "+2" }))
    assert.is_true(admit(rt, nil, { [H] = "premium" })) -- unknown objective: priority 0
    assert.is_true(admit(rt, nil, { [H] = "-1.5" }))
    assert.is_true(admit(rt, nil, { [H] = "" }))
    assert.is_false(admit(rt, nil, { [H] = "-1" }))
    assert.is_false(admit(rt, nil, { [H] = " -20 " }))
    assert.is_true(admit(rt, nil, {}, {})) -- even with no candidates
  end)

  it("reads metricsStalenessThreshold as milliseconds or a Go duration", function()
    local rt = S.runtime()
    local function seconds(v)
      return S.eval(rt, ([[
        local m = require("lupin.generation.loader").load(%q, "saturation-detector")
        local s = m.seconds(require("cjson").decode(%q))
        return s == nil and "nil" or ("=%%.17g"):format(s)
      ]]):format(S.ROOT .. "/plugins/saturation-detector.lua", S.json.encode(v)))
    end
    assert.equal("=" .. ("%.17g"):format(0.2), seconds(200))
    assert.equal("=0", seconds(0))
    assert.equal("=" .. ("%.17g"):format(200 * 1e-3), seconds("200ms"))
    assert.equal("=1.5", seconds("1.5s"))
    assert.equal("=90", seconds("1m30s"))
    assert.equal("=7200", seconds("2h"))
    assert.equal("=0", seconds("0"))
    assert.equal(("=%.17g"):format(3 * 1e-6), seconds("3µs"))
    assert.equal(("=%.17g"):format(3 * 1e-6), seconds("3us"))
    for _, bad in ipairs({ -1, "", "200", "fast", "-1s", "1d", "1s ", true }) do
      assert.equal("nil", seconds(bad), tostring(bad))
    end
  end)

  it("defaults 5, 0.8 and 200 ms; refuses values out of bounds", function()
    assert.same({ queueDepthThreshold = 5, kvCacheUtilThreshold = 0.8,
      metricsStalenessThreshold = 200 }, K.params(S.runtime(), T))
    local err = K.load_error({ '{"type": "saturation-detector", "parameters": {"queueDepthThreshold": -1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.queueDepthThreshold: must be an integer"
      .. " ≥ 1, got %-1", err)
    err = K.load_error({ '{"type": "queue-scorer"}',
      '{"type": "saturation-detector", "parameters": {"kvCacheUtilThreshold": 1.2}}' })
    assert.matches("^spec%.json:4: plugins%[1%]%.parameters%.kvCacheUtilThreshold: must be a number"
      .. " > 0 and ≤ 1, got 1.2", err)
    err = K.load_error({ '{"type": "saturation-detector", "parameters": {"metricsStalenessThreshold": "soon"}}' })
    assert.matches('^spec%.json:3: plugins%[0%]: plugin "saturation%-detector" %(saturation%-detector%)'
      .. ' failed to start: metricsStalenessThreshold must be a number of milliseconds > 0 or a'
      .. ' duration such as "200ms", got soon', err)
    err = K.load_error({ '{"type": "saturation-detector", "parameters": {"metricsStalenessThreshold": "0s"}}' })
    assert.matches('^spec%.json:3: plugins%[0%]: plugin "saturation%-detector" %(saturation%-detector%)'
      .. ' failed to start: metricsStalenessThreshold must be a number of milliseconds > 0 or a'
      .. ' duration such as "200ms", got 0s', err)
  end)

  it("sheds end to end with 429 naming the plugin, admits once the level is under 1", function()
    local rt = S.loaded(K.config({ { type = T }, { type = "active-request-scorer" } },
      { { pluginRef = "active-request-scorer" } }))
    S.endpoints(rt, 2, { fresh({ waiting_queue_size = 10 }), fresh({ kv_cache_usage = 0.95 }) })
    local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}',
      headers = { ["X-Gateway-Inference-Objective"] = "-2" } }))
    local res = req:schedule()
    req:finish("ok")
    assert.equal(429, res.status)
    assert.equal(T, res.plugin)
    assert.equal(REASON, res.message)
    local names, ok = K.picks(rt) -- no priority header: priority 0, admitted
    assert.equal(200, ok.status)
    assert.equal(1, #names)
    rt:set_metrics("ep1", fresh({ waiting_queue_size = 2 }))
    names, ok = K.picks(rt, { path = "/v1/completions", body = '{"model":"m"}',
      headers = { ["x-gateway-inference-objective"] = "-2" } })
    assert.equal(200, ok.status)
    assert.equal(1, #names)
    assert.equal(0, (rt:check_leaks()))
  end)

  it("serves flow control as its detector, counting what was sent since a scrape", function()
    local P = dofile("plugins/saturation-detector.lua")
    local now = 1000
    local d = P.new({ queueDepthThreshold = 2, kvCacheUtilThreshold = 0.8,
      metricsStalenessThreshold = 200 }, { now = function() return now end })
    local ep = { waiting_queue_size = 1, kv_cache_usage = 0.1, scraped_at = now }
    local sat, level = P.saturated(d, { ep }, { since_scrape = function() return 0 end })
    assert.is_false(sat)
    assert.equal(0.5, level)
    sat, level = P.saturated(d, { ep }, { since_scrape = function() return 1 end })
    assert.is_true(sat) -- (1 + 1) / 2
    assert.equal(1, level)
  end)
end)
