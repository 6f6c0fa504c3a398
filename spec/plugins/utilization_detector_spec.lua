-- utilization-detector: saturated when no endpoint has fresh metrics under
-- both thresholds; requests sent since the last scrape count as waiting.
local schema = require "lupin.schema"
local P = dofile("plugins/utilization-detector.lua")

local NOW = 1000

local function detector(params)
  return P.new(assert(schema.validate(P.schema, params)), { now = function() return NOW end })
end

local function ep(q, kv, age)
  return { name = "e", waiting_queue_size = q, kv_cache_usage = kv, scraped_at = NOW - (age or 0) }
end

local function load(since)
  return { since_scrape = function() return since or 0 end }
end

describe("utilization-detector", function()
  it("has room while one endpoint is fresh and under both thresholds", function()
    local d = detector({})
    assert.is_false(P.saturated(d, { ep(9, 0), ep(5, 0.8) }, load()))
    assert.is_true(P.saturated(d, { ep(6, 0), ep(0, 0.81) }, load()))
  end)

  it("counts stale and never-scraped endpoints as full", function()
    local d = detector({ metricsStalenessThreshold = "200ms" })
    assert.is_true(P.saturated(d, { ep(0, 0, 1) }, load()))
    local never = ep(0, 0)
    never.scraped_at = 0
    assert.is_true(P.saturated(d, { never }, load()))
  end)

  it("counts requests sent since the last scrape as waiting", function()
    local d = detector({ queueDepthThreshold = 2 })
    assert.is_false(P.saturated(d, { ep(1, 0) }, load(1)))
    assert.is_true(P.saturated(d, { ep(1, 0) }, load(2)))
  end)

  it("refuses a staleness that is not a duration", function()
    assert.has_error(function() detector({ metricsStalenessThreshold = "soon" }) end,
      'metricsStalenessThreshold must be a number of milliseconds ≥ 0 or a duration such as "200ms", got soon')
  end)
end)
