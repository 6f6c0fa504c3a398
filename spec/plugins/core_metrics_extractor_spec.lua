-- The EPP's core-metrics-extractor (llm-d-router's data layer): under which
-- names each engine publishes what plugins read.  It schedules nothing; its
-- effect is the mapping the host reads per endpoint (rt:metric_source).
-- spec/core/datalayer_spec.lua has the presets and the dataLayer section.
local S = require "support"

local T = "core-metrics-extractor"
local BASE = "plugins:\n- type: queue-scorer\n- type: core-metrics-extractor\n"

local function load(params)
  local rt = S.runtime()
  local ok, err = rt:load_string(BASE .. (params and "  parameters: " .. params .. "\n" or ""),
    "cfg.yaml")
  return rt, ok, err
end

-- The engine and queue metric of endpoint "x" with the given labels.
local function mapped(params, labels)
  local rt, ok, err = load(params)
  assert(ok, err)
  assert(rt:upsert({ name = "x", address = "127.0.0.1", port = 1, labels = labels }))
  local m = assert(rt:metric_source("x"))
  local logs = rt:logs()
  rt:free()
  return m, logs
end

local function fails(params)
  local rt, ok, err = load(params)
  rt:free()
  assert.is_nil(ok, "the config loaded")
  assert.matches("^cfg%.yaml:[34]: plugins%[1%]", err)
  return err
end

describe(T, function()
  it("defaultEngine: vllm unless named; the engine of endpoints without the label", function()
    local m = mapped()
    assert.equal("vllm", m.engine)
    assert.equal("vllm:num_requests_waiting", m.queue)
    m = mapped("{defaultEngine: sglang}")
    assert.equal("sglang", m.engine)
    assert.is_not.equal("vllm:num_requests_waiting", m.queue)
    assert.matches('defaultEngine "nope" not found in engineConfigs', fails("{defaultEngine: nope}"),
      1, true)
    assert.matches("parameters.defaultEngine: must be a string", fails("{defaultEngine: 1}"), 1,
      true)
  end)

  it("engineLabelKey: the label naming an endpoint's engine", function()
    assert.equal("sglang", mapped(nil, { ["llm-d.ai/engine-type"] = "sglang" }).engine)
    assert.equal("vllm", mapped(nil, { engine = "sglang" }).engine)
    assert.equal("sglang", mapped("{engineLabelKey: engine}", { engine = "sglang" }).engine)
    assert.matches("engineLabelKey must be a non-empty label name",
      fails("{engineLabelKey: ''}"), 1, true)
  end)

  it("engineConfigs: an engine of its own, or a built-in's name replaced whole", function()
    local m = mapped("{defaultEngine: mine, engineConfigs: [{name: mine, queuedRequestsSpec: q,"
      .. " kvUsageSpec: k}]}")
    assert.same({ "mine", "q", "k" }, { m.engine, m.queue, m.kv_usage })
    m = mapped("{engineConfigs: [{name: vllm, queuedRequestsSpec: my_queue}]}")
    assert.same({ "vllm", "my_queue" }, { m.engine, m.queue })
    assert.is_nil(m.running)
  end)

  it("engineConfigs: refuses unknown fields, unnamed engines, bad specs, non-objects", function()
    assert.matches('engineConfigs[0]: unknown field "queueSpec"',
      fails("{engineConfigs: [{name: e, queueSpec: q}]}"), 1, true)
    assert.matches("engine config name cannot be empty",
      fails("{engineConfigs: [{kvUsageSpec: k}]}"), 1, true)
    assert.matches("only equality", fails("{engineConfigs: [{name: e, queuedRequestsSpec:"
      .. " 'q{a!=b}'}]}"), 1, true)
    assert.matches("parameters.engineConfigs: item 0 must be an object",
      fails("{engineConfigs: [vllm]}"), 1, true)
  end)

  it("engineConfigs: customMetrics are accepted with a warning", function()
    local _, logs = mapped("{engineConfigs: [{name: vllm, queuedRequestsSpec: q,"
      .. " customMetrics: [{name: x}]}]}")
    local warned = false
    for _, l in ipairs(logs) do
      warned = warned or l[2]:find("engineConfigs[0] (vllm): customMetrics ignored", 1, true) ~= nil
    end
    assert.is_true(warned)
  end)

  it("refuses unknown parameters", function()
    assert.matches('unknown parameter "engine"', fails("{engine: vllm}"), 1, true)
  end)
end)
