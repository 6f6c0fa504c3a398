local K = require "plugins.kit"
local S = require "support"

describe("queue-scorer", function()
  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue_test.go,
  -- TestQueueScorer: "Different queue sizes", "Same queue sizes", "Zero queue sizes"
  it("scores as TestQueueScorer expects", function()
    local rt = K.pool(3, { { waiting_queue_size = 10 }, { waiting_queue_size = 5 },
      { waiting_queue_size = 0 } })
    assert.same({ ep1 = 0, ep2 = 0.5, ep3 = 1 }, K.scores(rt, "queue-scorer"))
    rt = K.pool(2, { { waiting_queue_size = 5 }, { waiting_queue_size = 5 } })
    assert.same({ ep1 = 1, ep2 = 1 }, K.scores(rt, "queue-scorer"))
    rt = K.pool(2, { { waiting_queue_size = 0 }, { waiting_queue_size = 0 } })
    assert.same({ ep1 = 1, ep2 = 1 }, K.scores(rt, "queue-scorer"))
  end)

  it("scores (max - q) / (max - min) over waiting queue sizes", function()
    local rt = K.pool(4, { { waiting_queue_size = 0 }, { waiting_queue_size = 2 },
      { waiting_queue_size = 8 }, { waiting_queue_size = 6 } })
    assert.same({ ep1 = 1, ep2 = 0.75, ep3 = 0, ep4 = 0.25 }, K.scores(rt, "queue-scorer"))
  end)

  it("keeps the candidates' order in its output", function()
    local rt = K.pool(3, { { waiting_queue_size = 4 }, { waiting_queue_size = 0 },
      { waiting_queue_size = 2 } })
    local out = K.call(rt, { type = "queue-scorer", point = "score",
      names = { "ep3", "ep1", "ep2" } })
    assert.same({ 0.5, 0, 1 }, out.list)
  end)

  it("gives 1 to every endpoint when all queues are equal, even when long", function()
    local rt = K.pool(3, { { waiting_queue_size = 7 }, { waiting_queue_size = 7 },
      { waiting_queue_size = 7 } })
    assert.same({ ep1 = 1, ep2 = 1, ep3 = 1 }, K.scores(rt, "queue-scorer"))
  end)

  it("scores a single endpoint 1 and an empty list with an empty list", function()
    local rt = K.pool(1, { { waiting_queue_size = 100 } })
    assert.same({ ep1 = 1 }, K.scores(rt, "queue-scorer"))
    local out = K.call(rt, { type = "queue-scorer", point = "score", names = {} })
    assert.same({}, out.list)
  end)

  it("reads a missing metric (never scraped) as an empty queue, as the EPP does", function()
    local rt = K.pool(2, { { waiting_queue_size = 3 } }) -- ep2 never scraped
    assert.same({ ep1 = 0, ep2 = 1 }, K.scores(rt, "queue-scorer"))
  end)

  it("reads a NaN metric as 0", function()
    local rt = K.pool(2, { { waiting_queue_size = 0 / 0 }, { waiting_queue_size = 4 } })
    assert.same({ ep1 = 1, ep2 = 0 }, K.scores(rt, "queue-scorer"))
  end)

  it("handles extremes: one huge queue", function()
    local rt = K.pool(3, { { waiting_queue_size = 0 }, { waiting_queue_size = 1 },
      { waiting_queue_size = 1e6 } })
    local s = K.scores(rt, "queue-scorer")
    assert.equal(1, s.ep1)
    assert.equal((1e6 - 1) / 1e6, s.ep2)
    assert.equal(0, s.ep3)
  end)

  it("takes no parameters: an unknown one fails the load with file, line and path", function()
    local err = K.load_error({ '{"type": "queue-scorer"}',
      '{"type": "queue-scorer", "name": "q2", "parameters": {"threshold": 3}}' })
    assert.matches('^spec%.json:4: plugins%[1%]%.parameters%.threshold: unknown parameter '
      .. '"threshold"; this plugin takes no parameters', err)
  end)

  it("ranks endpoints end to end through a config", function()
    local rt = S.loaded(K.config({ { type = "queue-scorer" },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 3 } } },
      { { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, { { waiting_queue_size = 5 }, { waiting_queue_size = 1 },
      { waiting_queue_size = 3 } })
    assert.same({ "ep2", "ep3", "ep1" }, (K.picks(rt)))
  end)
end)
