-- latency-scorer: scores by predicted latency headroom as llm-d-router's
-- does (positive tier, idle preference, deficit buckets, range-based weight
-- re-normalization, least/most), and the composite fallback without
-- predictions.  The predictions are put in ctx.shared under lupin.slo.KEY
-- as predicted-latency-producer publishes them; the last test runs a fake
-- producer through a config.
local K = require "plugins.kit"
local S = require "support"

local T = "latency-scorer"

local function runtime(params, metrics, n)
  local rt = S.loaded(K.config({ { type = T, parameters = params } }, { { pluginRef = T } }))
  S.endpoints(rt, n or 3, metrics)
  return rt
end

-- The instance's scores by endpoint name, with predictions `pl` (endpoints
-- and prefix keyed by name; nil: no producer), on the endpoints named
-- (default all, in pool order).
local CALL = K.PREDICTED .. [[
local out = {}
for i, s in ipairs(self:score({ shared = shared, request = { id = "spec", headers = {} } }, eps)) do
  out[eps[i].name] = ("%%.17g"):format(s)
end
return out
]]

local function scores(rt, pl, names)
  if pl and not pl.slo then
    pl.slo = { ttft = 100, tpot = 20 }
  end
  local out = K.instance(rt, T, CALL:format(S.json.encode({ pl = pl, names = names })))
  for k, v in pairs(out) do
    out[k] = tonumber(v)
  end
  return out
end

-- A prediction with these headrooms (objectives 100 and 20 ms), busy
-- unless dispatched says otherwise.
local function pred(ttft_headroom, tpot_headroom, dispatched)
  return { ttft = 100 - ttft_headroom, tpot = 20 - tpot_headroom, ttft_headroom = ttft_headroom,
    tpot_headroom = tpot_headroom, ttft_valid = ttft_headroom > 0, tpot_valid = tpot_headroom > 0,
    valid = ttft_headroom > 0 and tpot_headroom > 0, dispatched = dispatched or 1 }
end

local function near(want, got)
  assert.equal(#want, #got)
  for name, v in pairs(want) do
    assert.near(v, got[name], 1e-12, name)
  end
  for name in pairs(got) do
    assert.truthy(want[name], name .. " was scored")
  end
end

local POSITIVE = { endpoints = { ep1 = pred(100, 20), ep2 = pred(30, 5), ep3 = pred(60, 10) } }

describe(T, function()
  it("has upstream's defaults and refuses a strategy it does not know", function()
    local rt = S.runtime()
    assert.same({ ttftWeight = 0.8, tpotWeight = 0.2, headroomSelectionStrategy = "least",
      compositeKVWeight = 1, compositeQueueWeight = 1, compositePrefixWeight = 1 }, K.params(rt, T))
    rt:free()
    assert.matches('spec.json:3: plugins%[0%].parameters.headroomSelectionStrategy: must be one of'
      .. ' "least", "most", got "best"',
      K.load_error({ '{"type": "latency-scorer", "parameters": {"headroomSelectionStrategy": "best"}}' }))
    for _, field in ipairs({ "ttftWeight", "tpotWeight", "compositeKVWeight", "compositeQueueWeight",
      "compositePrefixWeight" }) do
      assert.matches("parameters." .. field .. ": must be a number ≥ 0, got -1", K.load_error({
        ('{"type": "latency-scorer", "parameters": {"%s": -1}}'):format(field) }), 1, true)
    end
  end)

  it("least: the endpoint closest to its objectives scores best (bin packing)", function()
    -- |ttft headroom| 100, 30, 60 over a range of 70; |tpot| 20, 5, 10 over 15;
    -- ep3: 0.8 × 30/70 + 0.2 × 5/15 = 0.4095, (1 − 0.4095) × 100 → 59 + 1
    near({ ep1 = 0.01, ep2 = 1, ep3 = 0.6 }, scores(runtime(), POSITIVE))
  end)

  it("most: the endpoint with the most headroom scores best", function()
    near({ ep1 = 1, ep2 = 0.01, ep3 = 0.41 },
      scores(runtime({ headroomSelectionStrategy = "most" }), POSITIVE))
  end)

  it("blends TTFT and TPOT by their weights, normalized to sum 1", function()
    -- TPOT alone: ep3 at 1/3, (2/3) × 100 → 66 + 1
    near({ ep1 = 0.01, ep2 = 1, ep3 = 0.67 }, scores(runtime({ ttftWeight = 0, tpotWeight = 1 }), POSITIVE))
    -- equal weights: 0.5 × 3/7 + 0.5 × 1/3 = 0.381 → 61 + 1
    near({ ep1 = 0.01, ep2 = 1, ep3 = 0.62 }, scores(runtime({ ttftWeight = 1, tpotWeight = 1 }), POSITIVE))
    -- 4:1 is the default 0.8:0.2
    near({ ep1 = 0.01, ep2 = 1, ep3 = 0.6 }, scores(runtime({ ttftWeight = 4, tpotWeight = 1 }), POSITIVE))
    -- both 0: TTFT alone, 4/7 × 100 → 57 + 1
    near({ ep1 = 0.01, ep2 = 1, ep3 = 0.58 }, scores(runtime({ ttftWeight = 0, tpotWeight = 0 }), POSITIVE))
  end)

  it("scores only the endpoints meeting both objectives when some miss one", function()
    -- headroom exactly 0 meets the objective; ep2 misses TTFT.  ep1: 0.8 × 0 + 0.2 × 1 → 80 + 1
    local out = scores(runtime(), { endpoints = { ep1 = pred(0, 4), ep2 = pred(-5, 9), ep3 = pred(40, 2) } })
    near({ ep1 = 0.81, ep2 = 0, ep3 = 0.2 }, out)
  end)

  it("gives a dimension's weight to the other when every endpoint has the same headroom in it", function()
    -- equal TPOT: TTFT alone decides (blended, ep1 would be 0.8 × 0 + 0.2 × 0.5 → 0.91)
    near({ ep1 = 1, ep3 = 0.01 }, scores(runtime(), { endpoints = { ep1 = pred(10, 5), ep3 = pred(50, 5) } },
      { "ep1", "ep3" }))
    -- equal TTFT: TPOT alone decides (blended, ep1 would be 0.8 × 0.5 → 0.61)
    near({ ep1 = 1, ep3 = 0.01 }, scores(runtime(), { endpoints = { ep1 = pred(10, 2), ep3 = pred(10, 8) } },
      { "ep1", "ep3" }))
    -- both equal: every endpoint at the middle, 0.5 × 100 + 1
    near({ ep1 = 0.51, ep3 = 0.51 }, scores(runtime({ headroomSelectionStrategy = "most" }),
      { endpoints = { ep1 = pred(10, 2), ep3 = pred(10, 2) } }, { "ep1", "ep3" }))
  end)

  it("counts an endpoint without a prediction among the positive, at headroom 0, as upstream", function()
    -- |ttft| 30, 0, 10 over 30; |tpot| 5, 0, 5 over 5; ep3: 0.8/3 + 0.2 → 53 + 1
    near({ ep1 = 0.01, ep2 = 1, ep3 = 0.54 },
      scores(runtime(), { endpoints = { ep1 = pred(30, 5), ep3 = pred(10, 5) } }))
    -- so it is the one scored when every prediction misses, even beside an idle endpoint
    near({ ep1 = 0, ep2 = 0.51, ep3 = 0 },
      scores(runtime(), { endpoints = { ep1 = pred(-10, -2), ep3 = pred(-5, -1, 0) } }))
  end)

  it("when every endpoint misses, scores only the idle ones, always by least", function()
    local pl = { endpoints = { ep1 = pred(-50, -10, 5), ep2 = pred(-50, -10, 0), ep3 = pred(-20, -5, 0) } }
    near({ ep1 = 0, ep2 = 0.01, ep3 = 1 }, scores(runtime(), pl))
    near({ ep1 = 0, ep2 = 0.01, ep3 = 1 }, scores(runtime({ headroomSelectionStrategy = "most" }), pl))
    -- an idle endpoint that misses both goes before a busy one missing TPOT only
    near({ ep1 = 0.51, ep2 = 0 }, scores(runtime(), { endpoints = { ep1 = pred(-40, -3, 0),
      ep2 = pred(10, -1, 2) } }, { "ep1", "ep2" }))
  end)

  it("without idle endpoints, scores the least bad bucket: TPOT missed, then TTFT, then both", function()
    local pl = { endpoints = { ep1 = pred(-50, -10), ep2 = pred(-30, 5), ep3 = pred(10, -8), ep4 = pred(40, -3) } }
    local rt = runtime(nil, nil, 4)
    -- TPOT only: ep3 and ep4, |ttft| 10, 40 and |tpot| 8, 3; ep3: 0.2 → 80 + 1, ep4: 0.8 → 19 + 1
    near({ ep1 = 0, ep2 = 0, ep3 = 0.81, ep4 = 0.2 }, scores(rt, pl))
    near({ ep1 = 0, ep2 = 0, ep3 = 0.51 }, scores(rt, pl, { "ep1", "ep2", "ep3" }))
    near({ ep1 = 0, ep2 = 0.51 }, scores(rt, pl, { "ep1", "ep2" }))
    near({ ep1 = 0.51 }, scores(rt, pl, { "ep1" }))
    -- within a bucket, the smallest deficit first, whatever the strategy
    local worse = { endpoints = { ep1 = pred(-50, -10), ep2 = pred(-20, -4) } }
    near({ ep1 = 0.01, ep2 = 1 }, scores(runtime({ headroomSelectionStrategy = "most" }), worse, { "ep1", "ep2" }))
  end)

  describe("without predictions", function()
    local METRICS = { { kv_cache_usage = 0.2, waiting_queue_size = 0 },
      { kv_cache_usage = 0.8, waiting_queue_size = 5 }, { kv_cache_usage = 0.5, waiting_queue_size = 2 } }
    local COLD = { prefix = { ep1 = 0, ep2 = 1, ep3 = 0.5 }, endpoints = {} } -- the producer ran, no model yet

    it("blends free KV cache, the queue relative to the longest and the producer's prefix match", function()
      -- ep3: (0.5 + 3/5 + 0.5) / 3 → 53
      near({ ep1 = 0.6, ep2 = 0.4, ep3 = 0.53 }, scores(runtime(nil, METRICS), COLD))
    end)

    it("reads the prefix match as 0 without a producer", function()
      near({ ep1 = 0.6, ep2 = 0.07, ep3 = 0.37 }, scores(runtime(nil, METRICS), nil))
    end)

    it("weighs each part by its parameter, KV cache alone when all are 0", function()
      local w = function(kv, q, pre)
        return { compositeKVWeight = kv, compositeQueueWeight = q, compositePrefixWeight = pre }
      end
      near({ ep1 = 0.8, ep2 = 0.2, ep3 = 0.5 }, scores(runtime(w(1, 0, 0), METRICS), COLD))
      near({ ep1 = 1, ep2 = 0, ep3 = 0.6 }, scores(runtime(w(0, 2, 0), METRICS), COLD))
      near({ ep1 = 0, ep2 = 1, ep3 = 0.5 }, scores(runtime(w(0, 0, 3), METRICS), COLD))
      near({ ep1 = 0.8, ep2 = 0.2, ep3 = 0.5 }, scores(runtime(w(0, 0, 0), METRICS), COLD))
      -- 1:0:1, ep3: (0.5 + 0.5) / 2
      near({ ep1 = 0.4, ep2 = 0.6, ep3 = 0.5 }, scores(runtime(w(1, 0, 1), METRICS), COLD))
    end)

    it("scores every queue 1 when none waits, and a never-scraped endpoint as empty", function()
      near({ ep1 = 0.6, ep2 = 0.4 }, scores(runtime(nil, { { kv_cache_usage = 0.2 },
        { kv_cache_usage = 0.8 } }, 2), nil))
      -- ep4 never scraped: KV 0, queue 0 → (1 + 5/5 + 0) / 3
      local rt = runtime(nil, METRICS, 4)
      assert.near(0.67, scores(rt, nil).ep4, 1e-12)
    end)
  end)

  it("routes by the predictions a producer publishes, behind slo-headroom-tier-filter", function()
    local dir = S.tmpdir()
    -- publishes, per endpoint, the headrooms the request names in x-fake-<endpoint>: "ttft,tpot"
    S.write(dir .. "/fake-latency-producer.lua", [[
return {
  type = "fake-latency-producer",
  prepare = function(_, ctx, endpoints)
    local pl = { slo = { ttft = 100, tpot = 20 }, streaming = true, prefix = {}, endpoints = {} }
    for _, ep in ipairs(endpoints) do
      local a, b = (ctx.request.headers["x-fake-" .. ep.name] or ""):match("^(%S+),(%S+)$")
      if a then
        a, b = tonumber(a), tonumber(b)
        pl.endpoints[ep.id] = { ttft = 100 - a, tpot = 20 - b, ttft_headroom = a, tpot_headroom = b,
          ttft_valid = a > 0, tpot_valid = b > 0, valid = a > 0 and b > 0, dispatched = ep.in_flight }
      end
    end
    ctx.shared[require("lupin.slo").KEY] = pl
  end,
}
]])
    local function picks(strategy, headers)
      local rt = S.loaded(K.config({ { type = "fake-latency-producer" },
        { type = "slo-headroom-tier-filter", parameters = { epsilonExploreNeg = 0 } },
        { type = T, parameters = { headroomSelectionStrategy = strategy } }, { type = "max-score-picker" } },
        { { pluginRef = "slo-headroom-tier-filter" }, { pluginRef = T }, { pluginRef = "max-score-picker" } }),
        { plugin_dirs = { S.FIXTURES, dir } })
      S.endpoints(rt, 3, { { kv_cache_usage = 0.9 }, { kv_cache_usage = 0.1 }, { kv_cache_usage = 0.5 } })
      local names = K.picks(rt, { path = "/v1/completions", headers = headers,
        body = '{"model":"m","prompt":"hello"}' })
      rt:free()
      return names[1]
    end
    -- ep1 misses TTFT and is filtered out; of ep2 and ep3, least takes the closer
    local h = { ["x-fake-ep1"] = "-10,5", ["x-fake-ep2"] = "30,5", ["x-fake-ep3"] = "5,5" }
    assert.equal("ep3", picks("least", h))
    assert.equal("ep2", picks("most", h))
    -- no prediction at all: the composite prefers the freest KV cache
    assert.equal("ep2", picks("least", {}))
    -- every objective missed: the smallest deficit, even under most
    assert.equal("ep1", picks("most", { ["x-fake-ep1"] = "-1,-1", ["x-fake-ep2"] = "-5,-5",
      ["x-fake-ep3"] = "-9,-9" }))
  end)
end)
