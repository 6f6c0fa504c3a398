-- The data layer and the EPP's other top-level sections as lupin loads them:
-- metrics-data-source / core-metrics-extractor compiled into the mapping a
-- host reads (lupin_runtime_metric_source), data/dataLayer, saturationDetector,
-- flowControl and featureGates checked in the EPP's shape, and the plugin
-- types lupin refuses with why.  Upstream: llm-d-router
-- pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go and
-- apix/config/v1alpha1/endpointpickerconfig_types.go.
local S = require "support"

local function load(text, source)
  local rt = S.runtime()
  local ok, err = rt:load_string(text, source or "cfg.yaml")
  return rt, ok, err
end

local function fails(text, ...)
  local rt, ok, err = load(text)
  rt:free()
  assert.is_nil(ok, "the config loaded")
  for _, want in ipairs({ ... }) do
    assert.matches(want, err, 1, true)
  end
  return err
end

local function source_of(text, endpoint, labels)
  local rt, ok, err = load(text)
  assert(ok, err)
  if labels then
    assert(rt:upsert({ name = endpoint, address = "127.0.0.1", port = 1, labels = labels }))
  end
  local m = assert(rt:metric_source(endpoint))
  rt:free()
  return m
end

local BASE = "plugins:\n- type: queue-scorer\n"

describe("data layer", function()
  describe("the mapping handed to the host", function()
    it("without a data layer: vLLM's names, current and legacy, on /metrics", function()
      assert.same({ engine = "vllm", path = "/metrics", queue = "vllm:num_requests_waiting",
        running = "vllm:num_requests_running",
        kv_usage = "vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc",
        lora = "vllm:lora_requests_info", cache_info = "vllm:cache_config_info",
        block_size_label = "block_size", num_blocks_label = "num_gpu_blocks" },
        source_of(BASE, "x"))
    end)

    it("no config loaded: none", function()
      local rt = S.runtime()
      assert.is_nil((rt:metric_source("x")))
      rt:free()
    end)

    -- factories.go defaultEngineConfigs: the built-in engines' names
    it("the presets, by defaultEngine", function()
      local function preset(name)
        return source_of(BASE .. "- type: core-metrics-extractor\n  parameters: {defaultEngine: "
          .. name .. "}\n", "x")
      end
      local sg = preset("sglang")
      assert.same({ "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage",
        "page_size", "num_pages" }, { sg.queue, sg.running, sg.kv_usage, sg.block_size_label,
        sg.num_blocks_label })
      local tr = preset("triton-tensorrt-llm")
      assert.same({ "nv_trt_llm_request_metrics{request_type=waiting}",
        "nv_trt_llm_request_metrics{request_type=scheduled}",
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}" },
        { tr.queue, tr.running, tr.kv_usage, tr.block_size })
      local tgi = preset("tgi")
      assert.same({ "tgi_queue_size", "tgi_batch_current_size" }, { tgi.queue, tgi.running })
      assert.is_nil(tgi.kv_usage)
      assert.equal("trtllm_num_requests_waiting", preset("trtllm-serve").queue)
      assert.equal("nv_inference_pending_request_count", preset("triton").queue)
    end)

    it("an endpoint's engine-type label picks its engine; others get the default", function()
      local cfg = BASE .. "- type: core-metrics-extractor\n"
      assert.equal("sglang", source_of(cfg, "a", { ["llm-d.ai/engine-type"] = "sglang" }).engine)
      assert.equal("vllm", source_of(cfg, "b", { other = "sglang" }).engine)
      -- an engine nobody configured falls back to the default, as upstream's registry does
      assert.equal("vllm", source_of(cfg, "c", { ["llm-d.ai/engine-type"] = "nope" }).engine)
      local keyed = BASE .. "- type: core-metrics-extractor\n  parameters:\n"
        .. "    engineLabelKey: inference.networking.k8s.io/engine-type\n"
      assert.equal("tgi", source_of(keyed, "d",
        { ["inference.networking.k8s.io/engine-type"] = "tgi" }).engine)
    end)

    -- factories.go: "Append default engine configs if not explicitly defined by user"
    it("an engineConfigs entry replaces the built-in of its name whole; specs take labels",
      function()
        local m = source_of(BASE .. [[
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: 'my_queue{tier=gold, zone="a"}'
      kvUsageSpec: my_kv
]], "x")
        assert.same({ engine = "vllm", path = "/metrics", queue = "my_queue{tier=gold,zone=a}",
          kv_usage = "my_kv", block_size_label = "block_size", num_blocks_label = "num_gpu_blocks" },
          m)
      end)

    it("the data source's path", function()
      assert.equal("/stats", source_of(BASE .. "- type: metrics-data-source\n  parameters:"
        .. " {path: /stats}\n", "x").path)
    end)

    it("the source and extractor the dataLayer section names", function()
      local m = source_of(BASE .. [[
- {type: metrics-data-source, name: a, parameters: {path: /a}}
- {type: metrics-data-source, name: b, parameters: {path: /b}}
- {type: core-metrics-extractor, name: x1, parameters: {defaultEngine: tgi}}
- {type: core-metrics-extractor, name: x2, parameters: {defaultEngine: sglang}}
dataLayer:
  sources:
  - pluginRef: b
    extractors: [{pluginRef: x2}]
]], "x")
      assert.same({ "/b", "sglang" }, { m.path, m.engine })
      -- GIE's name for the section
      m = source_of(BASE .. [[
- {type: metrics-data-source, name: a, parameters: {path: /a}}
- {type: core-metrics-extractor, name: x1, parameters: {defaultEngine: tgi}}
data:
  sources: [{pluginRef: a, extractors: [{pluginRef: x1}]}]
]], "x")
      assert.same({ "/a", "tgi" }, { m.path, m.engine })
    end)
  end)

  describe("refuses, at the config's line", function()
    it("a metric spec that is not an equality selector", function()
      fails(BASE .. "- type: core-metrics-extractor\n  parameters:\n    engineConfigs:\n"
        .. "    - {name: e, queuedRequestsSpec: 'q{a!=b}'}\n",
        "cfg.yaml:3:", "engineConfigs[0].queuedRequestsSpec", "only equality")
      fails(BASE .. "- type: core-metrics-extractor\n  parameters:\n    engineConfigs:\n"
        .. "    - {name: e, queuedRequestsSpec: '9q'}\n", "must begin with a metric name")
    end)

    -- factories.go: "engine config name cannot be empty", reserved "default", defaultEngine
    it("the extractor's errors upstream has", function()
      fails(BASE .. "- type: core-metrics-extractor\n  parameters: {engineConfigs: [{kvUsageSpec:"
        .. " k}]}\n", "engine config name cannot be empty")
      fails(BASE .. "- type: core-metrics-extractor\n  parameters: {engineConfigs: [{name:"
        .. " default}]}\n", '"default" (reserved)')
      fails(BASE .. "- type: core-metrics-extractor\n  parameters: {defaultEngine: nope}\n",
        'defaultEngine "nope" not found in engineConfigs')
      fails(BASE .. "- type: core-metrics-extractor\n  parameters: {engineConfigs: [{name: e,"
        .. " queueSpec: q}]}\n", 'unknown field "queueSpec"')
    end)

    it("an https or TLS data source, with why", function()
      fails(BASE .. "- type: metrics-data-source\n  parameters: {scheme: https}\n",
        'scheme "https" is not supported', 'use "http"')
      fails(BASE .. "- type: metrics-data-source\n  parameters: {caCertPath: /ca.pem}\n",
        "caCertPath is not supported")
      fails(BASE .. "- type: metrics-data-source\n  parameters: {path: metrics}\n",
        "absolute URL path")
    end)

    it("dataLayer mistakes", function()
      fails(BASE .. "data: {sources: []}\ndataLayer: {sources: []}\n", "keep one")
      fails(BASE .. "dataLayer:\n  sources:\n  - pluginRef: nope\n", "cfg.yaml:5:",
        'undefined pluginRef "nope"')
      fails(BASE .. "dataLayer:\n  sources:\n  - pluginRef: queue-scorer\n",
        "is not a data source")
      fails(BASE .. "- type: metrics-data-source\ndataLayer:\n  sources:\n"
        .. "  - {pluginRef: metrics-data-source, extractors: [{pluginRef: queue-scorer}]}\n",
        "is not an extractor lupin has")
      fails(BASE .. "- {type: metrics-data-source, name: a}\n- {type: metrics-data-source,"
        .. " name: b}\ndataLayer:\n  sources: [{pluginRef: a}, {pluginRef: b}]\n",
        "one metrics source per endpoint")
      fails(BASE .. "dataLayer:\n  discovery: {pluginRef: queue-scorer}\n",
        "dataLayer.discovery: not supported")
      fails(BASE .. "dataLayer:\n  sources: []\n  extra: 1\n", 'unknown field "extra"')
    end)
  end)
end)

describe("saturationDetector", function()
  local function detector(rt)
    return S.eval(rt, [[
      local g = require("lupin.runtime").current
      local r = g.by_name["saturation-detector"]
      return r and r.params or "none"]])
  end

  it("GIE v1's thresholds become lupin's saturation-detector, which admits", function()
    local rt, ok, err = load(BASE .. "saturationDetector: {queueDepthThreshold: 3,"
      .. " kvCacheUtilThreshold: 0.5, metricsStalenessThreshold: 100ms}\n")
    assert(ok, err)
    local p = detector(rt)
    assert.same({ 3, 0.5, "100ms" }, { p.queueDepthThreshold, p.kvCacheUtilThreshold,
      p.metricsStalenessThreshold })
    -- a sheddable request with no fresh endpoint is shed by it
    S.endpoints(rt, 1)
    local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m","prompt":"x"}',
      headers = { ["x-gateway-inference-objective"] = "-1" } }))
    assert.equal(429, req:schedule().status)
    req:finish("rejected")
    rt:free()
  end)

  it("llm-d-router's pluginRef names the detector", function()
    local rt, ok, err = load(BASE .. "- {type: saturation-detector, name: sd, parameters:"
      .. " {queueDepthThreshold: 9}}\nsaturationDetector: {pluginRef: sd}\n")
    assert(ok, err)
    rt:free()
    fails(BASE .. "saturationDetector: {pluginRef: queue-scorer}\n", "is not a saturation detector")
    fails(BASE .. "saturationDetector: {pluginRef: sd, queueDepthThreshold: 1}\n", "not both")
    fails(BASE .. "- type: saturation-detector\nsaturationDetector: {queueDepthThreshold: 1}\n",
      "keep one")
    fails(BASE .. "saturationDetector: {kvCacheUtilThreshold: 2}\n", "kvCacheUtilThreshold")
    fails(BASE .. "saturationDetector: {queueDepth: 2}\n", 'unknown field "queueDepth"')
  end)
end)

describe("flowControl", function()
  local function flow(text)
    local rt, ok, err = load(text)
    assert(ok, err)
    local f = S.eval(rt, "return require('lupin.runtime').current.flow_control")
    rt:free()
    return f
  end

  it("is parsed in the EPP's shape and kept on the generation", function()
    local f = flow(BASE .. [[
- type: saturation-detector
featureGates: [flowControl]
flowControl:
  maxBytes: 5Gi
  maxRequests: "1k"
  defaultRequestTTL: 1m0s
  noEndpointRequestTTL: 10m
  saturationDetector: {pluginRef: saturation-detector}
  defaultPriorityBand: {maxRequests: 100}
  priorityBands:
  - {priority: 0, maxRequests: 1000, maxBytes: 500M, fairnessPolicyRef: global-strict-fairness-policy}
  - {priority: -1, defaultRequestTTL: 5s, orderingPolicyRef: fcfs-ordering-policy}
]])
    assert.same({ maxBytes = 5 * 2 ^ 30, maxRequests = 1000, defaultRequestTTL = 60,
      noEndpointRequestTTL = 600, saturationDetector = "saturation-detector",
      enableEviction = false, defaultPriorityBand = { maxRequests = 100 },
      priority_bands = {
        { priority = 0, maxRequests = 1000, maxBytes = 5e8,
          fairnessPolicyRef = "global-strict-fairness-policy" },
        { priority = -1, defaultRequestTTL = 5, orderingPolicyRef = "fcfs-ordering-policy" } } }, f)
  end)

  -- checked, without an effect in lupin: the operator is told, at the line
  it("warns, naming the line, of each field lupin accepts without acting on it", function()
    local text = BASE .. [[
- type: saturation-detector
flowControl:
  noEndpointRequestTTL: 10m
  usageLimitPolicyPluginRef: saturation-detector
  bandSelectionPolicyPluginRef: saturation-detector
  enableEviction: true
]]
    local rt = S.runtime()
    local ok, err = rt:load_string(text, "cfg.yaml")
    assert(ok, err)
    local warned = {}
    for _, l in ipairs(rt:logs()) do
      local line, field = l[2]:match("cfg%.yaml:(%d+): flowControl%.(%w+): accepted, no effect in lupin: ")
      if line then
        warned[field] = tonumber(line)
      end
    end
    rt:free()
    -- enableEviction is acted on (docs/flow-control.md): no warning
    assert.same({ noEndpointRequestTTL = 5, usageLimitPolicyPluginRef = 6,
      bandSelectionPolicyPluginRef = 7 }, warned)
    rt = S.runtime()
    assert(rt:load_string(BASE .. "flowControl: {enableEviction: false}\n", "cfg.yaml"))
    for _, l in ipairs(rt:logs()) do
      assert.falsy(l[2]:find("no effect in lupin", 1, true), l[2])
    end
    rt:free()
  end)

  it("refuses what the EPP refuses, at the line", function()
    fails(BASE .. "flowControl: {maxRequests: lots}\n", "cfg.yaml:3:", "flowControl.maxRequests",
      "quantity")
    fails(BASE .. "flowControl: {defaultRequestTTL: 30}\n", "duration")
    fails(BASE .. "flowControl:\n  priorityBands:\n  - {priority: 1}\n  - {priority: 1}\n",
      "cfg.yaml:6:", "duplicate priority 1")
    fails(BASE .. "flowControl:\n  priorityBands:\n  - {maxRequests: 1}\n", "priority must be an"
      .. " integer")
    fails(BASE .. "flowControl: {usageLimitPolicyPluginRef: nope}\n", "must name a plugin")
    fails(BASE .. "flowControl: {queues: 1}\n", 'unknown field "queues"')
  end)
end)

describe("featureGates", function()
  it("known gates load; an unknown one loads with a warning naming the known", function()
    local rt, ok, err = load(BASE .. "featureGates: [dataLayer, prepareDataPlugins, flowControl,"
      .. " fancy]\n")
    assert(ok, err)
    local gates = S.eval(rt, "return require('lupin.runtime').current.feature_gates")
    assert.same({ dataLayer = true, prepareDataPlugins = true, flowControl = true, fancy = true },
      gates)
    local warned = false
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:find('feature gate "fancy" is unknown', 1, true) ~= nil
    end
    assert.is_true(warned)
    rt:free()
    fails(BASE .. "featureGates: flowControl\n", "featureGates must be an array")
  end)

  it("takes llm-d-router's haPopulateNonLeaderDatastore silently, warns of enableLegacyMetrics", function()
    local rt, ok, err = load(BASE .. "featureGates: [haPopulateNonLeaderDatastore, enableLegacyMetrics]\n")
    assert(ok, err)
    local removed, unknown = false, false
    for _, l in ipairs(rt:logs()) do
      removed = removed or l[2]:find('featureGates[1]: feature gate "enableLegacyMetrics" has no'
        .. " effect: llm-d-router removed it", 1, true) ~= nil
      unknown = unknown or l[2]:find("is unknown to lupin", 1, true) ~= nil
    end
    assert.is_true(removed)
    assert.is_false(unknown)
    rt:free()
  end)
end)

describe("plugin types refused on purpose", function()
  for _, t in ipairs({ "predicted-latency-scorer", "slo-aware-profile-handler",
    "slo-scorer" }) do
    it(t, function()
      local err = fails(BASE .. "- type: " .. t .. "\n", "cfg.yaml:3:", "plugins[1].type",
        ('plugin type "%s" is not supported:'):format(t), "; use ")
      assert.is_nil(err:find("unknown plugin type", 1, true))
    end)
  end
end)
