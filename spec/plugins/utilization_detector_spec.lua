-- utilization-detector: llm-d-router's saturation level, the mean over the
-- candidates of max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold),
-- stale endpoints and no candidates scoring 1.  The vectors are upstream's
-- (pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/
-- detector_test.go: TestUtilizationDetectorFactory, TestDetector_Saturation,
-- TestDetector_Filter); lupin's own: requests sent since a scrape wait.
local schema = require "lupin.schema"
local P = dofile("plugins/utilization-detector.lua")

local NOW = 1000

local function detector(params)
  local p = assert(schema.validate(P.schema, params or {}))
  return P.new(p, { now = function() return NOW end })
end

-- age in milliseconds, as upstream's vectors give it
local function ep(q, kv, age)
  return { name = "e", waiting_queue_size = q, kv_cache_usage = kv,
    scraped_at = NOW - (age or 0) / 1000 }
end

local function load(since)
  return { since_scrape = function() return since or 0 end }
end

local function level(d, eps, since)
  local sat, l = P.saturated(d, eps, load(since))
  assert.equal(l >= 1, sat)
  return l
end

describe("utilization-detector", function()
  -- TestDetector_Saturation: queue 5, KV 0.9, staleness 100 ms
  local VECTORS = {
    { "no candidates (fail closed)", {}, 1.0 },
    { "single pod with good capacity", { ep(2, 0.5) }, 0.5 / 0.9 },
    { "single pod with stale metrics", { ep(1, 0.1, 200) }, 1.0 },
    { "single pod with high queue depth", { ep(10, 0.1) }, 2.0 },
    { "single pod with high KV cache use", { ep(1, 0.95) }, 0.95 / 0.90 },
    { "multiple pods, all good", { ep(1, 0.1), ep(0, 0.2) }, (0.2 + 0.2 / 0.9) / 2 },
    { "one good, one stale", { ep(1, 0.1), ep(0, 0.2, 300) }, 0.6 },
    { "one good, one with a high queue", { ep(1, 0.1), ep(15, 0.2) }, 1.6 },
    { "all bad", { ep(1, 0.1, 200), ep(20, 0.2), ep(1, 0.99) }, (1.0 + 4.0 + 1.1) / 3 },
    { "queue exactly at the threshold", { ep(5, 0.1) }, 1.0 },
    { "metrics just over the staleness", { ep(1, 0.1, 101) }, 1.0 },
  }
  for _, v in ipairs(VECTORS) do
    it("levels upstream's vector: " .. v[1], function()
      local d = detector({ queueDepthThreshold = 5, kvCacheUtilThreshold = 0.9,
        metricsStalenessThreshold = "100ms" })
      assert.near(v[3], level(d, v[2]), 1e-4)
    end)
  end

  it("scores never-scraped endpoints and NaN metrics 1 (upstream: nil metrics)", function()
    local d = detector({ metricsStalenessThreshold = "1h" })
    local never = ep(0, 0)
    never.scraped_at = 0
    assert.equal(1, level(d, { never }))
    assert.equal(0.5, level(d, { ep(0 / 0, 0), ep(0, 0) }))
    assert.equal(0.5, level(d, { ep(0, 0 / 0), ep(0, 0) }))
  end)

  it("saturates on the mean, not on the best endpoint", function()
    local d = detector({}) -- queue 5, KV 0.8
    assert.equal(1, level(d, { ep(10, 0), ep(0, 0) })) -- one endpoint idle, still full
    assert.is_true(P.saturated(d, { ep(10, 0), ep(0, 0) }, load()))
    assert.is_false(P.saturated(d, { ep(9, 0), ep(0, 0) }, load()))
  end)

  it("counts requests sent since the last scrape as waiting", function()
    local d = detector({ queueDepthThreshold = 2 })
    assert.equal(1, level(d, { ep(1, 0) }, 1))
    assert.equal(1.5, level(d, { ep(1, 0) }, 2))
    assert.equal(0.5, level(d, { ep(1, 0) }, 0))
  end)

  it("keeps lupin.utilization.room, GIE v1's any-endpoint-has-room test", function()
    local U = require "lupin.utilization"
    local d = detector({})
    assert.is_true(U.room(d, { ep(9, 0), ep(5, 0.8) }))
    assert.is_false(U.room(d, { ep(6, 0), ep(0, 0.81), ep(0, 0, 300) }))
    assert.is_false(U.room(d, { ep(4, 0) }, function() return 2 end))
  end)

  -- TestUtilizationDetectorFactory
  it("refuses upstream's invalid configurations with the field and bound", function()
    local function refused(params, field, message)
      local ok, err, f = schema.validate(P.schema, params)
      assert.is_nil(ok)
      assert.equal(field, f)
      assert.equal(message, err)
    end
    refused({ queueDepthThreshold = "invalid_type" }, "queueDepthThreshold",
      'must be an integer ≥ 1, got "invalid_type"')
    refused({ queueDepthThreshold = 0 }, "queueDepthThreshold", "must be an integer ≥ 1, got 0")
    refused({ kvCacheUtilThreshold = 1.5 }, "kvCacheUtilThreshold", "must be a number > 0 and ≤ 1, got 1.5")
    refused({ kvCacheUtilThreshold = 0 }, "kvCacheUtilThreshold", "must be a number > 0 and ≤ 1, got 0")
    refused({ headroom = -0.5 }, "headroom", "must be a number ≥ 0, got -0.5")
    assert.has_error(function() detector({ metricsStalenessThreshold = "0s" }) end,
      'metricsStalenessThreshold must be a number of milliseconds > 0 or a duration such as "200ms", got 0s')
    assert.has_error(function() detector({ metricsStalenessThreshold = "soon" }) end,
      'metricsStalenessThreshold must be a number of milliseconds > 0 or a duration such as "200ms", got soon')
    assert.truthy(detector({ headroom = 2.0 })) -- high, but allowed
    assert.truthy(detector({ queueDepthThreshold = 5, kvCacheUtilThreshold = 0.8 }))
  end)

  -- TestDetector_Filter: queue 5, KV 0.8, staleness 100 ms, headroom 0.2
  -- (limits: queue 6, KV 0.96)
  local FILTER = {
    { "all pass under the thresholds", { ep(1, 0.1), ep(4, 0.7) }, 2 },
    { "at the threshold but under the burst", { ep(5, 0.8) }, 1 },
    { "in the headroom burst", { ep(5, 0.9) }, 1 },
    { "over the queue burst", { ep(7, 0.1), ep(1, 0.1) }, 1 },
    { "over the KV burst", { ep(1, 0.97), ep(1, 0.5) }, 1 },
    { "all stale: all kept (fail open)", { ep(1, 0.1, 200), ep(1, 0.1, 200) }, 2 },
    { "all saturated: all kept (fail open)", { ep(10, 0.1), ep(1, 0.99) }, 2 },
  }
  for _, v in ipairs(FILTER) do
    it("filters upstream's vector: " .. v[1], function()
      local d = detector({ queueDepthThreshold = 5, kvCacheUtilThreshold = 0.8,
        metricsStalenessThreshold = "100ms", headroom = 0.2 })
      assert.equal(v[3], #P.filter(d, nil, v[2]))
    end)
  end

  it("filters out the over-limit endpoint, not the other", function()
    local d = detector({ headroom = 0.2 })
    local ok = ep(1, 0.1)
    local out = P.filter(d, nil, { ep(7, 0.1), ok, ep(0, 0, 300) })
    assert.equal(1, #out)
    assert.equal(ok, out[1])
  end)
end)
