-- concurrency-detector: saturated when every endpoint has maxConcurrency
-- requests of this runtime in flight.
local schema = require "lupin.schema"
local P = dofile("plugins/concurrency-detector.lua")

local function detector(params)
  return P.new(assert(schema.validate(P.schema, params)))
end

local function load(counts)
  return { inflight = function(ep) return counts[ep.name] or 0 end }
end

local EPS = { { name = "e1" }, { name = "e2" } }

describe("concurrency-detector", function()
  it("is saturated only when every endpoint is at the limit", function()
    local d = detector({ maxConcurrency = 2 })
    assert.is_false(P.saturated(d, EPS, load({ e1 = 2, e2 = 1 })))
    assert.is_true(P.saturated(d, EPS, load({ e1 = 2, e2 = 3 })))
  end)

  it("keeps headroom free", function()
    local d = detector({ maxConcurrency = 10, headroom = 0.5 })
    assert.is_false(P.saturated(d, EPS, load({ e1 = 4, e2 = 9 })))
    assert.is_true(P.saturated(d, EPS, load({ e1 = 5, e2 = 5 })))
  end)

  it("is saturated with no endpoint", function()
    assert.is_true(P.saturated(detector({}), {}, load({})))
  end)

  it("refuses a mode it does not count", function()
    local ok, err, field = schema.validate(P.schema, { concurrencyMode = "tokens" })
    assert.is_nil(ok)
    assert.equal('must be one of "requests", got "tokens"', err)
    assert.equal("concurrencyMode", field)
  end)
end)
