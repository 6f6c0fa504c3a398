-- Each config section's error paths the other specs leave out, through
-- lupin.config.parse: file, line, JSON path and text (the declarations in
-- lupin.config.sections and lupin.config.flow, walked by lupin.config.walk).
local config = require "lupin.config"

local function fails(text, want)
  local cfg, err = config.parse(text, "c.json")
  assert.is_nil(cfg, "the config was taken")
  assert.equal(want, err)
end

local P = '"plugins": [{"type": "p", "name": "p"}],\n'

describe("config sections' errors", function()
  it("kind", function()
    fails('{"kind": null}', 'c.json:1: kind: kind must be "EndpointPickerConfig", got null')
  end)

  it("pluginDirs", function()
    fails('{"pluginDirs": [\n 7]}', "c.json:2: pluginDirs[0]: each plugin directory must be a string")
    fails('{"pluginDirs": [\n "/no/such/dir"]}',
      'c.json:2: pluginDirs[0]: plugin directory "/no/such/dir" does not exist')
    fails('{"pluginDirs": ["/etc/hostname"]}',
      'c.json:1: pluginDirs[0]: plugin directory "/etc/hostname" is not a directory')
  end)

  it("budgets", function()
    fails('{"budgets": {\n"disableAfterCuts": 1.5}}', "c.json:2: budgets.disableAfterCuts:"
      .. " disableAfterCuts must be an integer from 0 to 1000000000, got 1.5")
    fails('{"budgets": []}', "c.json:1: budgets: budgets must be an object, got array")
  end)

  it("data and dataLayer", function()
    fails('{"data": {}, "dataLayer": {}}', 'c.json:1: dataLayer: both "data" and "dataLayer":'
      .. " they are the same section (GIE's and llm-d-router's name); keep one")
    fails('{"data": {\n"discovery": {}}}', 'c.json:2: data.discovery: not supported: lupin reads'
      .. ' endpoints from the config\'s "endpoints" or an --endpoints file; use those')
    fails('{"dataLayer": {\n"crossReplica": true}}', "c.json:2: dataLayer.crossReplica: not"
      .. " supported: lupin runs one picker per gateway process and shares no state between"
      .. " replicas; remove it")
    fails('{"data": {"injectDefaults": 1}}',
      "c.json:1: data.injectDefaults: injectDefaults must be true or false")
    fails('{"data": {"sources": [{}]}}', 'c.json:1: data.sources[0]: missing "pluginRef": name'
      .. ' the data source, a plugin defined under "plugins"')
    fails('{' .. P .. '"data": {"sources": [{"pluginRef": "p", "extractors": [\n{"x": 1}]}]}}',
      'c.json:3: data.sources[0].extractors[0].x: unknown field "x" in an extractor; known'
      .. " fields: pluginRef")
    fails('{' .. P .. '"data": {"sources": [{"pluginRef": "p", "extractors": [\n{"pluginRef": "q"}]}]}}',
      'c.json:3: data.sources[0].extractors[0].pluginRef: undefined pluginRef "q": no plugin of'
      .. ' that name under "plugins"')
  end)

  it("saturationDetector", function()
    fails('{"saturationDetector": []}',
      "c.json:1: saturationDetector: saturationDetector must be an object, got array")
    fails('{"saturationDetector": {"pluginRef": ""}}', 'c.json:1: saturationDetector: missing'
      .. ' "pluginRef": name the saturation detector, a plugin defined under "plugins"')
    fails('{"saturationDetector": {"pluginRef": "z"}}', 'c.json:1: saturationDetector.pluginRef:'
      .. ' undefined pluginRef "z": no plugin of that name under "plugins"')
  end)

  it("featureGates", function()
    fails('{"featureGates": [\n""]}',
      'c.json:2: featureGates[0]: each feature gate is a name such as "flowControl"')
  end)

  it("flowControl", function()
    fails('{"flowControl": {"defaultPriorityBand": {\n"fairnessPolicyRef": ""}}}',
      "c.json:2: flowControl.defaultPriorityBand.fairnessPolicyRef: fairnessPolicyRef must be"
      .. " a policy name")
    fails('{"flowControl": {"enableEviction": "yes"}}',
      "c.json:1: flowControl.enableEviction: enableEviction must be true or false")
    fails('{"flowControl": {"priorityBands": [{"maxRequests": 1}]}}',
      "c.json:1: flowControl.priorityBands[0].priority: priority must be an integer, got null")
    fails('{"flowControl": {"defaultPriorityBand": {"flowGCTimeout": "1s"}}}',
      'c.json:1: flowControl.defaultPriorityBand.flowGCTimeout: unknown field "flowGCTimeout" in'
      .. " a priority band; known fields: defaultRequestTTL, fairnessPolicyRef, maxBytes,"
      .. " maxRequests, orderingPolicyRef, priority")
    fails('{"flowControl": {"saturationDetector": 1}}', "c.json:1: flowControl.saturationDetector:"
      .. " saturationDetector must be an object, got number")
    fails('{"flowControl": {"saturationDetector": {"pluginRef": "z"}}}',
      "c.json:1: flowControl.saturationDetector.pluginRef: undefined pluginRef \"z\": no plugin"
      .. ' of that name under "plugins"')
    fails('{"flowControl": {"saturationDetector": {"pluginRef": ""}}}',
      "c.json:1: flowControl.saturationDetector.pluginRef: pluginRef must name the saturation"
      .. ' detector, a plugin defined under "plugins"')
    fails('{"flowControl": {"saturationDetector": {"metricsStalenessThreshold": "soon"}}}',
      "c.json:1: flowControl.saturationDetector.metricsStalenessThreshold: metricsStalenessThreshold"
      .. ' must be a duration such as "30s" or "1m0s", got "soon"')
  end)

  -- llm-d-router's test/testdata/configloader_1_test.yaml sets it there; its
  -- loader's SaturationDetectorConfig has only pluginRef (default: the
  -- utilization detector)
  it("flowControl.saturationDetector without pluginRef: the default detector, a warning",
    function()
      local S = require "support"
      local rt = S.runtime()
      finally(function() rt:free() end)
      assert(rt:load_string('{"flowControl": {"saturationDetector":\n'
        .. '{"metricsStalenessThreshold": "150ms"}}}', "c.json"))
      local warned = false
      for _, l in ipairs(rt:logs()) do
        warned = warned or l[2]:find("c.json:2: flowControl.saturationDetector"
          .. ".metricsStalenessThreshold: accepted, no effect in lupin", 1, true) ~= nil
      end
      assert.is_true(warned)
    end)

  it("objectives", function()
    fails('{"objectives": {}}', "c.json:1: objectives: objectives must be an array of {name,"
      .. " priority}")
    fails('{"objectives": [{"priority": 1}]}', "c.json:1: objectives[0].name: name must be a"
      .. " non-empty string (the value of x-gateway-inference-objective)")
    fails('{"objectives": [{"name": "a", "priority": 2147483648}]}',
      "c.json:1: objectives[0].priority: priority must be an integer, got 2147483648")
    fails('{"objectives": [3]}', "c.json:1: objectives[0]: an objective must be an object, got number")
  end)

  it("endpoints' metrics", function()
    local E = '{"endpoints": [{"address": "a", "port": 1, "metrics": {\n'
    fails(E .. '"running_lora_adapters": ["x",\n 2]}}]}',
      "c.json:3: endpoints[0].metrics.running_lora_adapters[1]: adapter names are strings")
    fails(E .. '"waiting_lora_adapters": 2}}]}', "c.json:2: endpoints[0].metrics."
      .. "waiting_lora_adapters: waiting_lora_adapters must be a list of adapter names or a"
      .. " comma-separated string")
    local cfg = assert(config.parse(E .. '"running_lora_adapters": ["x", "y"]}}]}', "c.json"))
    assert.equal("x,y", cfg.endpoints[1].metrics.running_lora_adapters)
  end)
end)
