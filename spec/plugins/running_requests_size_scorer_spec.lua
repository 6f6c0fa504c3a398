local K = require "plugins.kit"
local S = require "support"

local T = "running-requests-size-scorer"

describe(T, function()
  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/runningrequests/running_test.go,
  -- TestRunningRequestsSizeScorer: different, same and zero running counts
  it("scores as TestRunningRequestsSizeScorer expects", function()
    local rt = K.pool(3, { { running_requests = 10 }, { running_requests = 5 },
      { running_requests = 0 } })
    assert.same({ ep1 = 0, ep2 = 0.5, ep3 = 1 }, K.scores(rt, T))
    rt = K.pool(2, { { running_requests = 5 }, { running_requests = 5 } })
    assert.same({ ep1 = 1, ep2 = 1 }, K.scores(rt, T))
    rt = K.pool(2, { { running_requests = 0 }, { running_requests = 0 } })
    assert.same({ ep1 = 1, ep2 = 1 }, K.scores(rt, T))
  end)

  it("scores (max - r) / (max - min) over running requests", function()
    local rt = K.pool(3, { { running_requests = 10 }, { running_requests = 2 },
      { running_requests = 4 } })
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 0.75 }, K.scores(rt, T))
  end)

  it("reads running requests, not the waiting queue", function()
    local rt = K.pool(2, { { running_requests = 0, waiting_queue_size = 9 },
      { running_requests = 4, waiting_queue_size = 0 } })
    assert.same({ ep1 = 1, ep2 = 0 }, K.scores(rt, T))
  end)

  it("gives 1 to all when equal, {} for no endpoints, 0 for a missing metric", function()
    local rt = K.pool(3, { { running_requests = 3 }, { running_requests = 3 } })
    -- ep3 never scraped: reads 0 running, the least busy
    assert.same({ ep1 = 0, ep2 = 0, ep3 = 1 }, K.scores(rt, T))
    assert.same({ ep1 = 1, ep2 = 1 }, K.scores(rt, T, nil, { names = { "ep1", "ep2" } }))
    assert.same({}, K.call(rt, { type = T, point = "score", names = {} }).list)
  end)

  it("handles extremes", function()
    local rt = K.pool(2, { { running_requests = 0 }, { running_requests = 1e9 } })
    assert.same({ ep1 = 1, ep2 = 0 }, K.scores(rt, T))
  end)

  it("reads a NaN metric as 0", function()
    local rt = K.pool(2, { { running_requests = 0 / 0 }, { running_requests = 2 } })
    assert.same({ ep1 = 1, ep2 = 0 }, K.scores(rt, T))
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "running-requests-size-scorer", "parameters": {"x": 1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.x: unknown parameter \"x\"", err)
  end)

  it("ranks endpoints end to end", function()
    local rt = S.loaded(K.config({ { type = T },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 3 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, { { running_requests = 1 }, { running_requests = 9 },
      { running_requests = 5 } })
    assert.same({ "ep1", "ep3", "ep2" }, (K.picks(rt)))
  end)
end)
