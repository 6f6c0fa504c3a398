-- concurrency-detector: llm-d-router's saturation level from what is in
-- flight — requests or tokens over candidates × the limit, or (hybrid) the
-- mean of each endpoint's larger ratio.  The vectors are upstream's
-- (pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency/
-- detector_test.go: TestConcurrencyDetectorFactory, TestDetector_Saturation,
-- TestDetector_Configuration, TestDetector_TokenSaturation,
-- TestDetector_TokenFilter, TestDetector_HybridSaturation,
-- TestDetector_HybridFilter).  Upstream's token vectors estimate 10 tokens
-- per request; here the tokens in flight are given directly.
local schema = require "lupin.schema"
local K = require "plugins.kit"
local S = require "support"
local P = dofile("plugins/concurrency-detector.lua")

local function detector(params)
  return P.new(assert(schema.validate(P.schema, params or {})))
end

-- Endpoints with requests and tokens in flight: { { requests, tokens }, ... }
local function eps(loads)
  local out = {}
  for i, l in ipairs(loads) do
    out[i] = { name = "e" .. i, in_flight = l[1], in_flight_tokens = l[2] or 0 }
  end
  return out
end

local LOAD = { inflight = function(ep) return ep.in_flight end,
  tokens = function(ep) return ep.in_flight_tokens end }

local function level(d, loads)
  local sat, l = P.saturated(d, eps(loads), LOAD)
  assert.equal(l >= 1, sat)
  return l
end

describe("concurrency-detector", function()
  -- TestDetector_Saturation: requests, maxConcurrency 10
  local REQUESTS = {
    { "no candidates (fail closed)", {}, 1.0 },
    { "single endpoint empty", { { 0 } }, 0.0 },
    { "single endpoint half full", { { 5 } }, 0.5 },
    { "single endpoint full", { { 10 } }, 1.0 },
    { "mixed load", { { 10 }, { 0 } }, 0.5 },
    { "overloaded", { { 15 }, { 5 } }, 1.0 },
    { "very overloaded", { { 15 }, { 15 } }, 1.5 },
  }
  for _, v in ipairs(REQUESTS) do
    it("levels upstream's requests vector: " .. v[1], function()
      assert.near(v[3], level(detector({ maxConcurrency = 10 }), v[2]), 1e-6)
    end)
  end

  it("levels partial load linearly and reaches 1 at maxConcurrency", function()
    local d = detector({ maxConcurrency = 50, headroom = 0.2 }) -- TestDetector_Configuration
    assert.near(49 / 50, level(d, { { 49 } }), 1e-6)
    assert.near(1, level(d, { { 50 } }), 1e-6)
  end)

  -- TestDetector_TokenSaturation: tokens, maxTokenConcurrency 100
  local TOKENS = {
    { "no requests", { { 0, 0 } }, 0.0 },
    { "partial tokens", { { 1, 3 } }, 0.03 },
    { "half full", { { 5, 50 } }, 0.5 },
    { "full", { { 10, 100 } }, 1.0 },
    { "mixed token load", { { 5, 50 }, { 0, 0 } }, 0.25 },
  }
  for _, v in ipairs(TOKENS) do
    it("levels upstream's tokens vector: " .. v[1], function()
      local d = detector({ concurrencyMode = "tokens", maxTokenConcurrency = 100 })
      assert.near(v[3], level(d, v[2]), 1e-6)
    end)
  end

  -- TestDetector_HybridSaturation: maxConcurrency 10, maxTokenConcurrency 100
  local HYBRID = {
    { "empty", { { 0, 0 } }, 0.0 },
    { "tokens dominate", { { 2, 80 } }, 0.8 },
    { "requests dominate", { { 9, 10 } }, 0.9 },
    { "request dimension saturates first", { { 10, 5 } }, 1.0 },
    { "token dimension saturates first", { { 1, 100 } }, 1.0 },
    { "endpoints full on different dimensions", { { 10, 0 }, { 0, 100 } }, 1.0 },
    { "per-endpoint average", { { 10, 0 }, { 0, 0 } }, 0.5 },
  }
  for _, v in ipairs(HYBRID) do
    it("levels upstream's hybrid vector: " .. v[1], function()
      local d = detector({ concurrencyMode = "hybrid", maxConcurrency = 10, maxTokenConcurrency = 100 })
      assert.near(v[3], level(d, v[2]), 1e-6)
    end)
  end

  it("is saturated with no endpoint in every mode", function()
    for _, mode in ipairs({ "requests", "tokens", "hybrid" }) do
      assert.equal(1, level(detector({ concurrencyMode = mode }), {}))
    end
  end)

  it("filters at maxConcurrency × (1 + headroom), keeping none when all are over", function()
    local d = detector({ maxConcurrency = 50, headroom = 0.2 }) -- TestDetector_Configuration
    assert.equal(1, #P.filter(d, nil, eps({ { 59 } })))
    local out = P.filter(d, nil, eps({ { 60 }, { 0 } }))
    assert.equal(1, #out)
    assert.equal("e2", out[1].name)
    assert.equal(0, #P.filter(d, nil, eps({ { 60 } })))
  end)

  it("filters on tokens in tokens mode (upstream's burst of 120)", function()
    local d = detector({ concurrencyMode = "tokens", maxTokenConcurrency = 100, headroom = 0.2 })
    assert.equal(1, #P.filter(d, nil, eps({ { 11, 110 } })))
    assert.equal(0, #P.filter(d, nil, eps({ { 12, 120 } })))
    assert.equal(1, #P.filter(d, nil, eps({ { 1000, 0 } }))) -- requests not counted
  end)

  it("filters on either limit in hybrid mode", function()
    local d = detector({ concurrencyMode = "hybrid", maxConcurrency = 10, maxTokenConcurrency = 100 })
    assert.equal(1, #P.filter(d, nil, eps({ { 5, 50 } })))
    assert.equal(0, #P.filter(d, nil, eps({ { 10, 50 } })))
    assert.equal(0, #P.filter(d, nil, eps({ { 5, 100 } })))
    assert.equal(0, #P.filter(d, nil, eps({ { 20, 200 } })))
  end)

  it("filters a profile's endpoints by the core's in-flight counts", function()
    local rt = S.loaded(K.config({ { type = "concurrency-detector", parameters = { maxConcurrency = 1 } },
      { type = "queue-scorer" }, { type = "max-score-picker" } },
      { { pluginRef = "concurrency-detector" }, { pluginRef = "queue-scorer" },
        { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 2)
    local held, picks = {}, {}
    for i = 1, 3 do
      held[i] = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m","prompt":"hi"}' }))
      local res = held[i]:schedule()
      picks[i] = res.picks and res.picks[1] and res.picks[1].name or res.status
    end
    -- one request fills each endpoint; the third finds none under the limit
    table.sort(picks, function(a, b) return tostring(a) < tostring(b) end)
    assert.same({ 503, "ep1", "ep2" }, picks)
    for _, r in ipairs(held) do
      r:finish("ok")
    end
    assert.equal(0, (rt:check_leaks()))
  end)

  -- TestConcurrencyDetectorFactory
  it("refuses upstream's invalid configurations with the field and bound", function()
    local function refused(params, field, message)
      local ok, err, f = schema.validate(P.schema, params)
      assert.is_nil(ok)
      assert.equal(field, f)
      assert.equal(message, err)
    end
    refused({ maxConcurrency = "invalid_type" }, "maxConcurrency", 'must be an integer ≥ 1, got "invalid_type"')
    refused({ maxConcurrency = 0 }, "maxConcurrency", "must be an integer ≥ 1, got 0")
    refused({ maxTokenConcurrency = 0 }, "maxTokenConcurrency", "must be an integer ≥ 1, got 0")
    refused({ headroom = -0.5 }, "headroom", "must be a number ≥ 0, got -0.5")
    refused({ concurrencyMode = "magic" }, "concurrencyMode",
      'must be one of "requests", "tokens", "hybrid", got "magic"')
    assert.truthy(detector({ concurrencyMode = "hybrid", maxConcurrency = 10, maxTokenConcurrency = 100 }))
    assert.truthy(detector({ headroom = 2.0 }))
    assert.truthy(detector({ inFlightLoadProducerName = "load" }))
  end)
end)
