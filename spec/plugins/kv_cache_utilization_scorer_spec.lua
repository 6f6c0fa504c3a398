local K = require "plugins.kit"
local S = require "support"

local T = "kv-cache-utilization-scorer"

describe(T, function()
  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/
  -- kvcache_utilization_test.go, TestKvCacheUtilizationScorer's four cases
  it("scores as TestKvCacheUtilizationScorer expects", function()
    local cases = {
      { { 0.8, 0.5, 0 }, { 0.2, 0.5, 1 } }, -- different utilization
      { { 0.6, 0.6 }, { 0.4, 0.4 } }, -- same utilization
      { { 0, 0 }, { 1, 1 } }, -- zero utilization
      { { 1, 0.5 }, { 0, 0.5 } }, -- full utilization
    }
    for _, c in ipairs(cases) do
      local m = {}
      for i, u in ipairs(c[1]) do
        m[i] = { kv_cache_usage = u }
      end
      local s = K.scores(K.pool(#m, m), T)
      for i, want in ipairs(c[2]) do
        assert.near(want, s["ep" .. i], 1e-4)
      end
    end
  end)

  it("scores 1 - KV-cache usage", function()
    local rt = K.pool(4, { { kv_cache_usage = 0 }, { kv_cache_usage = 0.25 },
      { kv_cache_usage = 0.75 }, { kv_cache_usage = 1 } })
    assert.same({ ep1 = 1, ep2 = 0.75, ep3 = 0.25, ep4 = 0 }, K.scores(rt, T))
  end)

  it("is absolute, not relative: equal usage gives equal, not full, scores", function()
    local rt = K.pool(2, { { kv_cache_usage = 0.5 }, { kv_cache_usage = 0.5 } })
    assert.same({ ep1 = 0.5, ep2 = 0.5 }, K.scores(rt, T))
  end)

  it("clamps usage outside 0..1 and reads a missing metric as 0", function()
    local rt = K.pool(3, { { kv_cache_usage = 1.5 }, { kv_cache_usage = -0.5 } })
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 1 }, K.scores(rt, T))
    assert.same({}, K.call(rt, { type = T, point = "score", names = {} }).list)
  end)

  it("reads a NaN metric as 0", function()
    local rt = K.pool(1, { { kv_cache_usage = 0 / 0 } })
    assert.same({ ep1 = 1 }, K.scores(rt, T))
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "kv-cache-utilization-scorer", "parameters": {"x": 1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.x: unknown parameter \"x\"", err)
  end)

  it("ranks endpoints end to end", function()
    local rt = S.loaded(K.config({ { type = T },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 3 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, { { kv_cache_usage = 0.5 }, { kv_cache_usage = 0.9 },
      { kv_cache_usage = 0.1 } })
    assert.same({ "ep3", "ep1", "ep2" }, (K.picks(rt)))
  end)
end)
