-- slo-headroom-tier-filter: the positive tier (both headrooms ≥ 0) or, with
-- probability epsilonExploreNeg, the negative one (a headroom < 0, or no
-- prediction); one tier alone is kept, and all without any prediction.  The
-- predictions are put in ctx.shared under lupin.slo.KEY as
-- predicted-latency-producer publishes them.
local K = require "plugins.kit"
local S = require "support"

local T = "slo-headroom-tier-filter"

local function runtime(params, n)
  local rt = S.loaded(K.config({ { type = T, parameters = params } }, { { pluginRef = T } }))
  S.endpoints(rt, n or 4)
  return rt
end

-- Runs the instance's filter `times` times (seeding math.random first when
-- `seed` is given) with predictions `pl` (endpoints keyed by name; nil: no
-- producer) on the endpoints named (default all); returns each kept list
-- as names joined by spaces, with how often it came.
local CALL = K.PREDICTED .. [[
if a.seed then math.randomseed(a.seed) end
local out = {}
for _ = 1, a.times or 1 do
  local names = {}
  for i, ep in ipairs(self:filter({ shared = shared, request = { id = "spec", headers = {} } }, eps)) do
    names[i] = ep.name
  end
  local key = table.concat(names, " ")
  out[key] = (out[key] or 0) + 1
end
return out
]]

local function runs(rt, a)
  if a.pl then -- the endpoints' predictions, under objectives of 100 and 20 ms
    a.pl = { slo = { ttft = 100, tpot = 20 }, endpoints = a.pl }
  end
  return K.instance(rt, T, CALL:format(S.json.encode(a)))
end

-- The one list kept (after a single run).
local function kept(rt, pl, names)
  local out = runs(rt, { pl = pl, names = names })
  local key = next(out)
  return key
end

local function pred(ttft_headroom, tpot_headroom)
  return { ttft = 100 - ttft_headroom, tpot = 20 - tpot_headroom, ttft_headroom = ttft_headroom,
    tpot_headroom = tpot_headroom, ttft_valid = ttft_headroom > 0, tpot_valid = tpot_headroom > 0,
    valid = ttft_headroom > 0 and tpot_headroom > 0, dispatched = 1 }
end

local MIXED = { ep1 = pred(10, 2), ep2 = pred(-5, 2), ep3 = pred(0, 0) } -- ep4: no prediction

describe(T, function()
  it("explores the negative tier 1% of the time by default, and refuses a probability outside [0, 1]", function()
    local rt = S.runtime()
    assert.same({ epsilonExploreNeg = 0.01 }, K.params(rt, T))
    rt:free()
    assert.matches("parameters.epsilonExploreNeg: must be a number between 0 and 1, got 1.5",
      K.load_error({ '{"type": "slo-headroom-tier-filter", "parameters": {"epsilonExploreNeg": 1.5}}' }),
      1, true)
    assert.matches("parameters.epsilonExploreNeg: must be a number between 0 and 1, got -0.1",
      K.load_error({ '{"type": "slo-headroom-tier-filter", "parameters": {"epsilonExploreNeg": -0.1}}' }),
      1, true)
  end)

  it("keeps the positive tier (headroom ≥ 0 in both) at epsilon 0", function()
    assert.equal("ep1 ep3", kept(runtime({ epsilonExploreNeg = 0 }), MIXED))
  end)

  it("keeps the negative tier, endpoints without a prediction in it, at epsilon 1", function()
    assert.equal("ep2 ep4", kept(runtime({ epsilonExploreNeg = 1 }), MIXED))
  end)

  it("picks the negative tier with probability epsilonExploreNeg", function()
    local rt = runtime({ epsilonExploreNeg = 0.25 })
    local out = runs(rt, { pl = MIXED, times = 2000, seed = 7 })
    assert.equal(2000, (out["ep1 ep3"] or 0) + (out["ep2 ep4"] or 0))
    assert.truthy(out["ep2 ep4"] > 400 and out["ep2 ep4"] < 600, tostring(out["ep2 ep4"]))
    -- the default explores rarely
    out = runs(runtime(), { pl = MIXED, times = 2000, seed = 7 })
    assert.truthy((out["ep2 ep4"] or 0) > 0 and out["ep2 ep4"] < 60, tostring(out["ep2 ep4"]))
  end)

  it("keeps one tier alone whatever epsilon says", function()
    local rt = runtime({ epsilonExploreNeg = 1 })
    assert.equal("ep1 ep3", kept(rt, MIXED, { "ep1", "ep3" }))
    rt = runtime({ epsilonExploreNeg = 0 })
    -- a TPOT miss is a miss too; an endpoint without a prediction joins the negative
    assert.equal("ep2 ep3 ep4", kept(rt, { ep2 = pred(-5, 2), ep3 = pred(5, -1) }, { "ep2", "ep3", "ep4" }))
  end)

  it("keeps every endpoint when none has a prediction, or no producer ran", function()
    local rt = runtime({ epsilonExploreNeg = 0 })
    assert.equal("ep1 ep2 ep3 ep4", kept(rt, {}))
    assert.equal("ep1 ep2 ep3 ep4", kept(rt, nil))
  end)

  it("keeps a single candidate, even one that misses", function()
    assert.equal("ep2", kept(runtime({ epsilonExploreNeg = 0 }), MIXED, { "ep2" }))
  end)
end)
