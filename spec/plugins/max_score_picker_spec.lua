local K = require "plugins.kit"
local S = require "support"

local T = "max-score-picker"

describe(T, function()
  -- llm-d-router pkg/epp/framework/plugins/scheduling/picker/maxscore/picker_test.go,
  -- TestPickMaxScorePicker's five cases (ties compared as a set)
  it("picks as TestPickMaxScorePicker expects", function()
    local rt = K.pool(3, nil, { seed = 1 })
    local function pick(k, scores)
      return K.call(rt, { type = T, params = { maxNumOfEndpoints = k }, point = "pick",
        scores = scores }).picked
    end
    assert.same({ "ep2" }, pick(1, { 10, 25, 15 })) -- single max score
    local tied = pick(2, { 50, 50, 30 }) -- all equally scored
    table.sort(tied)
    assert.same({ "ep1", "ep2" }, tied)
    assert.same({ "ep3", "ep2" }, pick(2, { 20, 25, 30 })) -- more endpoints than needed
    assert.same({ "ep3", "ep2", "ep1" }, pick(4, { 20, 25, 30 })) -- fewer than needed
    local exact = pick(3, { 30, 25, 30 }) -- exactly as many as needed
    assert.equal("ep2", exact[3])
    exact[3] = nil
    table.sort(exact)
    assert.same({ "ep1", "ep3" }, exact)
  end)

  it("picks the highest score, one endpoint by default", function()
    local rt = K.pool(4, nil, { seed = 1 })
    local out = K.pick_many(rt, T, nil, { 0.5, 2.5, 1, 2.4 }, 50)
    assert.same({ ["1"] = 50 }, out.sizes)
    assert.same({ ep2 = 50 }, out.first)
  end)

  it("ranks maxNumOfEndpoints endpoints best first", function()
    local rt = K.pool(4, nil, { seed = 1 })
    local out = K.call(rt, { type = T, params = { maxNumOfEndpoints = 3 }, point = "pick",
      scores = { 0.5, 2.5, 1, 2.4 } })
    assert.same({ "ep2", "ep4", "ep3" }, out.picked)
    out = K.call(rt, { type = T, params = { maxNumOfEndpoints = 9 }, point = "pick",
      scores = { 0.5, 2.5, 1, 2.4 } })
    assert.same({ "ep2", "ep4", "ep3", "ep1" }, out.picked)
  end)

  it("ranks alike by selection (up to 8 picks) and by sorting (more)", function()
    local rt = K.pool(12, nil, { seed = 7 })
    local scores = { 0.1, 0.9, 0.5, 0.9, 0.3, 0.7, 0.5, 0.9, 0.2, 0.7, 0.4, 0.6 }
    local score_of = {}
    for i, v in ipairs(scores) do
      score_of["ep" .. i] = v
    end
    for _, k in ipairs({ 3, 8, 9, 12 }) do
      local out = K.call(rt, { type = T, params = { maxNumOfEndpoints = k }, point = "pick",
        scores = scores })
      assert.equal(k, #out.picked)
      local seen = {}
      for i, name in ipairs(out.picked) do
        assert.is_nil(seen[name], name .. " picked twice")
        seen[name] = true
        if i > 1 then
          assert.is_true(score_of[out.picked[i - 1]] >= score_of[name],
            ("k=%d: %s before %s"):format(k, out.picked[i - 1], name))
        end
      end
      -- the three tied at 0.9 lead, in some order
      local first = { out.picked[1], out.picked[2], out.picked[3] }
      table.sort(first)
      assert.same({ "ep2", "ep4", "ep8" }, first)
    end
  end)

  it("treats maxNumOfEndpoints ≤ 0 as 1", function()
    local rt = K.pool(3, nil, { seed = 1 })
    for _, k in ipairs({ 0, -1 }) do
      local out = K.pick_many(rt, T, { maxNumOfEndpoints = k }, { 0, 1, 0.5 }, 20)
      assert.same({ ["1"] = 20 }, out.sizes)
      assert.same({ ep2 = 20 }, out.first)
    end
  end)

  it("breaks ties at random, spreading the load over the tied endpoints only", function()
    local rt = K.pool(4, nil, { seed = 1 })
    local out = K.pick_many(rt, T, nil, { 1, 0.2, 1, 1 }, 3000)
    assert.is_nil(out.first.ep2)
    for _, name in ipairs({ "ep1", "ep3", "ep4" }) do
      assert.is_true(out.first[name] > 900 and out.first[name] < 1100, name)
    end
    -- ranked: the tied endpoints come first in random order, then the rest
    out = K.pick_many(rt, T, { maxNumOfEndpoints = 2 }, { 1, 0.2, 1, 1 }, 3000)
    assert.is_nil(out.any.ep2)
    assert.equal(0, out.dups)
    for _, name in ipairs({ "ep1", "ep3", "ep4" }) do
      assert.is_true(out.first[name] > 900 and out.first[name] < 1100, name)
    end
  end)

  it("picks none from none", function()
    local rt = K.pool(1)
    assert.same({ ["0"] = 2 }, K.pick_many(rt, T, nil, {}, 2, {}).sizes)
    assert.same({ ["0"] = 2 }, K.pick_many(rt, T, { maxNumOfEndpoints = 3 }, {}, 2, {}).sizes)
  end)

  it("defaults maxNumOfEndpoints to 1 and refuses a non-integer", function()
    assert.same({ maxNumOfEndpoints = 1 }, K.params(S.runtime(), T))
    local err = K.load_error({ '{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 0.5}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.maxNumOfEndpoints: must be an integer,"
      .. " got 0.5", err)
  end)

  it("returns the ranking as the request's picks end to end", function()
    local rt = S.loaded(K.config({ { type = "queue-scorer" },
      { type = T, parameters = { maxNumOfEndpoints = 2 } } },
      { { pluginRef = "queue-scorer" }, { pluginRef = T } }))
    S.endpoints(rt, 3, { { waiting_queue_size = 4 }, { waiting_queue_size = 8 },
      { waiting_queue_size = 0 } })
    local names, res = K.picks(rt)
    assert.equal(200, res.status)
    assert.same({ "ep3", "ep1" }, names)
  end)
end)
