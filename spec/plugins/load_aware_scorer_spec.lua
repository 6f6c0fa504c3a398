local K = require "plugins.kit"
local S = require "support"

local T = "load-aware-scorer"

describe(T, function()
  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/loadaware/load_aware_test.go,
  -- TestLoadBasedScorer "load based scorer": threshold 10, queues 2, 0, 15
  it("scores as TestLoadBasedScorer expects", function()
    local rt = K.pool(3, { { waiting_queue_size = 2 }, { waiting_queue_size = 0 },
      { waiting_queue_size = 15 } })
    local s = K.scores(rt, T, { threshold = 10 })
    assert.near(0.4, s.ep1, 1e-12)
    assert.same({ 0.5, 0 }, { s.ep2, s.ep3 })
  end)

  it("scores 0.5 for an empty queue, 0.5 * (1 - min(q, T) / T) otherwise (T = 128)", function()
    local rt = K.pool(5, { { waiting_queue_size = 0 }, { waiting_queue_size = 32 },
      { waiting_queue_size = 64 }, { waiting_queue_size = 128 }, { waiting_queue_size = 500 } })
    assert.same({ ep1 = 0.5, ep2 = 0.375, ep3 = 0.25, ep4 = 0, ep5 = 0 }, K.scores(rt, T))
  end)

  it("uses threshold", function()
    local rt = K.pool(3, { { waiting_queue_size = 1 }, { waiting_queue_size = 2 },
      { waiting_queue_size = 4 } })
    assert.same({ ep1 = 0.375, ep2 = 0.25, ep3 = 0 }, K.scores(rt, T, { threshold = 4 }))
    assert.same({ ep1 = 0, ep2 = 0, ep3 = 0 }, K.scores(rt, T, { threshold = 1 }))
  end)

  it("is absolute: equal queues give equal scores; a missing metric reads 0", function()
    local rt = K.pool(3, { { waiting_queue_size = 64 }, { waiting_queue_size = 64 } })
    assert.same({ ep1 = 0.25, ep2 = 0.25, ep3 = 0.5 }, K.scores(rt, T))
    assert.same({}, K.call(rt, { type = T, point = "score", names = {} }).list)
  end)

  it("reads a NaN metric as 0", function()
    local rt = K.pool(1, { { waiting_queue_size = 0 / 0 } })
    assert.same({ ep1 = 0.5 }, K.scores(rt, T))
  end)

  it("defaults threshold to 128 and refuses one not an integer", function()
    local rt = K.pool(1)
    assert.same({ threshold = 128 }, K.params(rt, T))
    local err = K.load_error({ '{"type": "load-aware-scorer"}',
      '{"type": "load-aware-scorer", "name": "b", "parameters": {"threshold": 2.5}}' })
    assert.matches("^spec%.json:4: plugins%[1%]%.parameters%.threshold: must be an integer", err)
    err = K.load_error({ '{"type": "load-aware-scorer", "parameters": {"threshold": "8"}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.threshold: must be an integer", err)
  end)

  it("ranks endpoints end to end", function()
    local rt = S.loaded(K.config({ { type = T, parameters = { threshold = 10 } },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 3 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, { { waiting_queue_size = 5 }, { waiting_queue_size = 20 },
      { waiting_queue_size = 0 } })
    assert.same({ "ep3", "ep1", "ep2" }, (K.picks(rt)))
  end)
end)
