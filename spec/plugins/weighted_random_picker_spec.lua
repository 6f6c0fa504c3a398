local K = require "plugins.kit"
local S = require "support"

local T = "weighted-random-picker"

describe(T, function()
  -- llm-d-router pkg/epp/framework/plugins/scheduling/picker/weightedrandom/picker_test.go,
  -- TestPickWeightedRandomPicker: 10000 picks of one, each endpoint within ±5% of
  -- score / total
  it("picks as TestPickWeightedRandomPicker expects", function()
    for _, scores in ipairs({ { 10, 90 }, { 100, 100, 100 }, { 30, 0 }, { 100, 90, 50, 30, 20 } }) do
      local rt = K.pool(#scores, nil, { seed = 13 })
      local out = K.pick_many(rt, T, nil, scores, 10000)
      local total = 0
      for _, v in ipairs(scores) do
        total = total + v
      end
      for i, v in ipairs(scores) do
        local got = (out.first["ep" .. i] or 0) / 10000
        assert.is_true(math.abs(got - v / total) <= 0.05, ("%s: ep%d %.3f"):format(
          table.concat(scores, ","), i, got))
      end
      rt:free()
    end
  end)

  it("picks in proportion to the scores; a score of 0 is never picked", function()
    local rt = K.pool(3, nil, { seed = 11 })
    local out = K.pick_many(rt, T, nil, { 3, 1, 0 }, 8000)
    assert.same({ ["1"] = 8000 }, out.sizes)
    assert.is_nil(out.first.ep3)
    -- P(ep1) = 3/4: 6000 expected, sd ≈ 39
    assert.is_true(out.first.ep1 > 5800 and out.first.ep1 < 6200, out.first.ep1)
  end)

  it("follows A-Res for the second place too: without replacement", function()
    local rt = K.pool(3, nil, { seed = 11 })
    local out = K.pick_many(rt, T, { maxNumOfEndpoints = 2 }, { 2, 1, 1 }, 8000)
    assert.same({ ["2"] = 8000 }, out.sizes)
    assert.equal(0, out.dups)
    -- P(ep1 first) = 1/2; P(ep1 in the top 2) = 1/2 + 2 × 1/4 × 2/3 = 5/6
    assert.is_true(out.first.ep1 > 3800 and out.first.ep1 < 4200, out.first.ep1)
    assert.is_true(out.any.ep1 > 6500 and out.any.ep1 < 6830, out.any.ep1)
  end)

  it("never returns endpoints scoring ≤ 0 while any scores above 0", function()
    local rt = K.pool(4, nil, { seed = 11 })
    local out = K.pick_many(rt, T, { maxNumOfEndpoints = 4 }, { 0.5, 0, -1, 0.25 }, 500)
    assert.same({ ["2"] = 500 }, out.sizes)
    assert.same({ ep1 = 500, ep4 = 500 }, out.any)
  end)

  it("picks uniformly when every score is ≤ 0", function()
    local rt = K.pool(3, nil, { seed = 11 })
    local out = K.pick_many(rt, T, nil, { 0, 0, 0 }, 3000)
    for _, name in ipairs({ "ep1", "ep2", "ep3" }) do
      assert.is_true(out.first[name] > 900 and out.first[name] < 1100, name)
    end
    out = K.pick_many(rt, T, { maxNumOfEndpoints = 5 }, { 0, -2, 0 }, 10)
    assert.same({ ["3"] = 10 }, out.sizes)
  end)

  it("treats maxNumOfEndpoints ≤ 0 as 1, and picks none from none", function()
    local rt = K.pool(2, nil, { seed = 11 })
    assert.same({ ["1"] = 10 }, K.pick_many(rt, T, { maxNumOfEndpoints = 0 }, { 1, 1 }, 10).sizes)
    assert.same({ ["0"] = 3 }, K.pick_many(rt, T, nil, {}, 3, {}).sizes)
  end)

  it("defaults maxNumOfEndpoints to 1 and refuses a non-integer", function()
    assert.same({ maxNumOfEndpoints = 1 }, K.params(S.runtime(), T))
    local err = K.load_error({ '{"type": "weighted-random-picker", "parameters": {"maxNumOfEndpoints": "2"}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.maxNumOfEndpoints: must be an integer",
      err)
  end)

  it("picks end to end by the weighted total", function()
    local rt = S.loaded(K.config({ { type = "kv-cache-utilization-scorer" }, { type = T } },
      { { pluginRef = "kv-cache-utilization-scorer" }, { pluginRef = T } }), { seed = 5 })
    S.endpoints(rt, 2, { { kv_cache_usage = 1 }, { kv_cache_usage = 0.5 } })
    for _ = 1, 30 do
      assert.same({ "ep2" }, (K.picks(rt))) -- ep1 scores 0
    end
  end)
end)
