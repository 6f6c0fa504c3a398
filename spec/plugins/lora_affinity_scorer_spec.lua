local K = require "plugins.kit"
local S = require "support"

local T = "lora-affinity-scorer"

describe(T, function()
  -- ep1: sql active; ep2: room for one more; ep3: full, sql waiting;
  -- ep4: full, sql nowhere; ep5: never scraped (no adapters, max 0)
  local metrics = {
    { running_lora_adapters = "sql,chat", max_lora = 2 },
    { running_lora_adapters = "chat", waiting_lora_adapters = "", max_lora = 2 },
    { running_lora_adapters = "chat", waiting_lora_adapters = "sql", max_lora = 2 },
    { running_lora_adapters = "chat,code", max_lora = 2 },
  }

  it("scores 1 active, 0.8 room for one more, 0.6 waiting, 0 otherwise", function()
    local rt = K.pool(5, metrics)
    assert.same({ ep1 = 1, ep2 = 0.8, ep3 = 0.6, ep4 = 0, ep5 = 0 },
      K.scores(rt, T, nil, { model = "sql" }))
  end)

  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/
  -- lora_affinity_test.go, TestLoraAffinityScorer (target model m1)
  it("scores as TestLoraAffinityScorer expects", function()
    local function scores(m)
      return K.scores(K.pool(#m, m), T, nil, { model = "m1" })
    end
    -- "Target model is active", "Target model is waiting"
    assert.same({ ep1 = 1 }, scores({ { running_lora_adapters = "m1", max_lora = 5 } }))
    assert.same({ ep1 = 0.6 }, scores({ { running_lora_adapters = "m2",
      waiting_lora_adapters = "m1", max_lora = 2 } }))
    -- "Endpoints have no space for new model"
    assert.same({ ep1 = 0, ep2 = 0 }, scores({ { running_lora_adapters = "m2",
      waiting_lora_adapters = "m3", max_lora = 2 }, { max_lora = 0 } }))
    -- "Multipleendpoints with mixed active and waiting models"
    assert.same({ ep1 = 1, ep2 = 0.8, ep3 = 0.8, ep4 = 0.6, ep5 = 0 }, scores({
      { running_lora_adapters = "m1", max_lora = 5 },
      { running_lora_adapters = "m2", waiting_lora_adapters = "m1", max_lora = 5 },
      { running_lora_adapters = "m2", max_lora = 2 },
      { running_lora_adapters = "m3", waiting_lora_adapters = "m1", max_lora = 2 },
      { running_lora_adapters = "m4,m5", max_lora = 2 },
    }))
  end)

  it("prefers room over waiting: a waiting adapter with spare capacity scores 0.8", function()
    local rt = K.pool(1, { { running_lora_adapters = "chat", waiting_lora_adapters = "sql",
      max_lora = 3 } })
    assert.same({ ep1 = 0.8 }, K.scores(rt, T, nil, { model = "sql" }))
  end)

  it("reads the model from the request body", function()
    local rt = K.pool(4, metrics)
    assert.same({ ep1 = 0, ep2 = 0.8, ep3 = 0, ep4 = 1 },
      K.scores(rt, T, nil, { body = { model = "code", prompt = "x" } }))
  end)

  it("without a model, only capacity counts; no endpoints gives no scores", function()
    local rt = K.pool(4, metrics)
    assert.same({ ep1 = 0, ep2 = 0.8, ep3 = 0, ep4 = 0 }, K.scores(rt, T))
    assert.same({}, K.call(rt, { type = T, point = "score", names = {} }).list)
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "lora-affinity-scorer", "parameters": {"x": 1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.x: unknown parameter \"x\"", err)
  end)

  it("full cycle: queue, KV and LoRA at weight 1 send model critical to the second "
    .. "endpoint with 2.8", function()
    local rt = S.loaded(K.config({ { type = "queue-scorer" },
      { type = "kv-cache-utilization-scorer" }, { type = T },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 3 } } },
      { { pluginRef = "queue-scorer", weight = 1 },
        { pluginRef = "kv-cache-utilization-scorer", weight = 1 },
        { pluginRef = T, weight = 1 }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, {
      { waiting_queue_size = 0, kv_cache_usage = 0.2, running_lora_adapters = "foo,bar",
        max_lora = 2 },
      { waiting_queue_size = 0, kv_cache_usage = 0.2, running_lora_adapters = "foo,critical",
        max_lora = 2 },
      { waiting_queue_size = 10, kv_cache_usage = 0.8 },
    })
    local names = K.picks(rt, { path = "/v1/completions",
      body = '{"model":"critical","prompt":"hi"}' })
    assert.same({ "ep2", "ep1", "ep3" }, names)
    -- the totals themselves: 1 + 0.8 + 1, 1 + 0.8 + 0, 0 + 0.2 + 0
    local total = {}
    for _, t in ipairs({ "queue-scorer", "kv-cache-utilization-scorer", T }) do
      for name, s in pairs(K.scores(rt, t, nil, { model = "critical" })) do
        total[name] = (total[name] or 0) + s
      end
    end
    assert.near(2.8, total.ep2, 1e-12)
    assert.near(1.8, total.ep1, 1e-12)
    assert.near(0.2, total.ep3, 1e-12)
  end)
end)
