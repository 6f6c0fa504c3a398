local K = require "plugins.kit"
local S = require "support"

local T = "random-picker"

describe(T, function()
  it("picks one endpoint by default, uniformly, ignoring scores", function()
    local rt = K.pool(3, nil, { seed = 7 })
    local out = K.pick_many(rt, T, nil, { 10, 0, 0 }, 3000)
    assert.same({ ["1"] = 3000 }, out.sizes) -- always exactly one
    for _, name in ipairs({ "ep1", "ep2", "ep3" }) do
      assert.is_true(out.first[name] > 900 and out.first[name] < 1100, name)
    end
  end)

  it("picks maxNumOfEndpoints distinct endpoints, at most all of them", function()
    local rt = K.pool(4, nil, { seed = 7 })
    local out = K.pick_many(rt, T, { maxNumOfEndpoints = 3 }, { 1, 1, 1, 1 }, 400)
    assert.same({ ["3"] = 400 }, out.sizes)
    assert.equal(0, out.dups)
    out = K.pick_many(rt, T, { maxNumOfEndpoints = 10 }, { 1, 1, 1, 1 }, 50)
    assert.same({ ["4"] = 50 }, out.sizes)
    assert.same({ ep1 = 50, ep2 = 50, ep3 = 50, ep4 = 50 }, out.any)
    assert.equal(0, out.dups)
  end)

  it("treats maxNumOfEndpoints ≤ 0 as 1, and picks none from none", function()
    local rt = K.pool(3, nil, { seed = 7 })
    assert.same({ ["1"] = 20 }, K.pick_many(rt, T, { maxNumOfEndpoints = 0 }, { 1, 1, 1 }, 20).sizes)
    assert.same({ ["1"] = 20 }, K.pick_many(rt, T, { maxNumOfEndpoints = -4 }, { 1, 1, 1 }, 20).sizes)
    assert.same({ ["0"] = 5 }, K.pick_many(rt, T, nil, {}, 5, {}).sizes)
  end)

  it("defaults maxNumOfEndpoints to 1 and refuses a non-integer", function()
    assert.same({ maxNumOfEndpoints = 1 }, K.params(S.runtime(), T))
    local err = K.load_error({ '{"type": "random-picker", "parameters": {"maxNumOfEndpoints": 1.5}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.maxNumOfEndpoints: must be an integer",
      err)
  end)

  it("picks end to end, ignoring the scorers", function()
    local rt = S.loaded(K.config({ { type = "queue-scorer" }, { type = T } },
      { { pluginRef = "queue-scorer" }, { pluginRef = T } }), { seed = 3 })
    S.endpoints(rt, 2, { { waiting_queue_size = 0 }, { waiting_queue_size = 50 } })
    local seen = {}
    for _ = 1, 50 do
      local names = K.picks(rt)
      seen[names[1]] = true
    end
    assert.same({ ep1 = true, ep2 = true }, seen)
  end)
end)
