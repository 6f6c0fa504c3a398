-- Config loading: the EPP's EndpointPickerConfig shape, its defaults, and an
-- error naming file, line, JSON path and the fix for every mistake.
local S = require "support"

local function load(text)
  local rt = S.runtime()
  local ok, err = rt:load_string(text, "cfg.json")
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

local function gen_shape(rt)
  return S.eval(rt, [[
    local g = require("lupin.runtime").current
    local out = { handler = g.handler.name, handler_type = g.handler.type, profiles = {} }
    for _, p in ipairs(g.profiles) do
      local scorers = {}
      for _, s in ipairs(p.scorers) do scorers[#scorers + 1] = s.rec.name .. "*" .. s.weight end
      local filters = {}
      for _, f in ipairs(p.filters) do filters[#filters + 1] = f.name end
      out.profiles[#out.profiles + 1] = { name = p.name, picker = p.picker.name,
        scorers = scorers, filters = filters }
    end
    return out]])
end

describe("config", function()
  describe("defaults, as the EPP applies them", function()
    it("names an instance after its type", function()
      local rt, ok = load([[{"plugins":[{"type":"test-scorer"}]}]])
      assert.is_true(ok)
      assert.equal("test-scorer", gen_shape(rt).profiles[1].scorers[1]:match("^[^*]+"))
      rt:free()
    end)

    it("makes one default profile of every filter, scorer and picker when none is given",
      function()
        local rt, ok = load([[{"plugins":[
          {"type":"test-filter","name":"f"},
          {"type":"test-scorer","name":"a"},
          {"type":"test-scorer","name":"b"},
          {"type":"test-picker","name":"p"},
          {"type":"test-observer","name":"o"}]}]])
        assert.is_true(ok)
        assert.same({ handler = "single-profile-handler", handler_type = "single-profile-handler",
          profiles = { { name = "default", picker = "p", scorers = { "a*1", "b*1" },
            filters = { "f" } } } }, gen_shape(rt))
        rt:free()
      end)

    it("without profiles, adds lupin's default routing: bounded-load-picker, prefix-cache-scorer",
      function()
        -- nothing configured: examples/configs/default.json's two plugins
        local rt, ok = load([[{}]])
        assert.is_true(ok)
        assert.same({ handler = "single-profile-handler", handler_type = "single-profile-handler",
          profiles = { { name = "default", picker = "bounded-load-picker",
            scorers = { "prefix-cache-scorer*1" }, filters = {} } } }, gen_shape(rt))
        S.endpoints(rt, 2)
        assert.equal(200, S.lifecycle(rt).status)
        rt:free()
        -- a scorer configured: no prefix scorer added, the picker still is
        rt, ok = load([[{"plugins":[{"type":"test-scorer","name":"s"}]}]])
        assert.is_true(ok)
        assert.same({ { name = "default", picker = "bounded-load-picker", scorers = { "s*1" },
          filters = {} } }, gen_shape(rt).profiles)
        rt:free()
        -- a picker configured, no scorer: the prefix scorer is added
        rt, ok = load([[{"plugins":[{"type":"test-picker","name":"p"}]}]])
        assert.is_true(ok)
        assert.same({ { name = "default", picker = "p", scorers = { "prefix-cache-scorer*1" },
          filters = {} } }, gen_shape(rt).profiles)
        rt:free()
      end)

    it("adds single-profile-handler to one profile, and max-score-picker when there is no picker",
      function()
        local rt, ok = load([[{
          "plugins": [{"type":"test-scorer","name":"s"}],
          "schedulingProfiles": [{"name":"only","plugins":[{"pluginRef":"s","weight":3}]}]
        }]])
        assert.is_true(ok)
        assert.same({ handler = "single-profile-handler", handler_type = "single-profile-handler",
          profiles = { { name = "only", picker = "max-score-picker", scorers = { "s*3" },
            filters = {} } } }, gen_shape(rt))
        S.endpoints(rt, 2)
        assert.equal(200, S.lifecycle(rt).status)
        rt:free()
      end)

    it("gives a scorer without weight the weight 1", function()
      local rt = load([[{"plugins":[{"type":"test-scorer","name":"s"}],
        "schedulingProfiles":[{"name":"d","plugins":[{"pluginRef":"s"}]}]}]])
      assert.same({ "s*1" }, gen_shape(rt).profiles[1].scorers)
      rt:free()
    end)

    it("accepts the EPP's apiVersion, kind and featureGates", function()
      local rt, ok = load([[{"apiVersion":"inference.networking.x-k8s.io/v1alpha1",
        "kind":"EndpointPickerConfig","featureGates":["prefixCacheTracking"],
        "plugins":[{"type":"max-score-picker","parameters":{"maxNumOfEndpoints":2}}]}]])
      assert.is_true(ok)
      rt:free()
    end)

    it("uses several profiles with the configured handler", function()
      local rt, ok = load([[{"plugins":[{"type":"test-handler","name":"h"},
        {"type":"test-picker","name":"p"}],
        "schedulingProfiles":[{"name":"A","plugins":[{"pluginRef":"p"}]},
                              {"name":"B","plugins":[{"pluginRef":"p"}]}]}]])
      assert.is_true(ok)
      assert.equal("h", gen_shape(rt).handler)
      rt:free()
    end)
  end)

  describe("errors", function()
    it("reports invalid JSON with its line", function()
      fails('{\n  "plugins": [\n    {"type": "x",}\n  ]\n}', "cfg.json:3: invalid JSON")
    end)

    it("refuses a config that is not an object", function()
      fails("[1, 2]", "cfg.json:1:", "must be a JSON object")
    end)

    it("refuses unknown top-level fields, listing the known ones", function()
      fails('{\n "plugins": [],\n "schedulingProfile": []\n}',
        'cfg.json:3: schedulingProfile: unknown field "schedulingProfile" in the config',
        "known fields: apiVersion, budgets, data, dataLayer, endpoints, featureGates, flowControl,"
          .. " kind, objectives, parser, pluginDirs, plugins, requestHandler, saturationDetector,"
          .. " schedulingProfiles")
    end)

    it("refuses another kind", function()
      fails('{"kind": "Deployment"}', 'kind: kind must be "EndpointPickerConfig"')
    end)

    it("needs plugins to be an array of objects", function()
      fails('{"plugins": {"type": "x"}}', "cfg.json:1: plugins: plugins must be an array, got object")
      fails('{"plugins": ["queue-scorer"]}', "plugins[0]: each plugin must be an object, got string")
    end)

    it("refuses unknown fields in a plugin", function()
      fails('{"plugins": [\n {"type": "test-scorer", "params": {}}]}',
        'cfg.json:2: plugins[0].params: unknown field "params" in a plugin',
        "known fields: maxCallMs, maxLifecycleMs, name, parameters, type")
    end)

    it("needs a type", function()
      fails('{"plugins": [\n {"type": "test-scorer"},\n {"name": "x"}\n]}',
        'cfg.json:3: plugins[1]: missing "type": name the plugin type')
    end)

    it("lists the known types for an unknown one", function()
      local err = fails('{"plugins": [\n\n {"type": "queue-scorr"}]}',
        'cfg.json:3: plugins[0].type: unknown plugin type "queue-scorr"; known types: ')
      assert.matches("max-score-picker", err, 1, true)
      assert.matches("single-profile-handler", err, 1, true)
    end)

    it("refuses duplicate plugin names, explicit or defaulted", function()
      fails('{"plugins": [{"type": "test-scorer", "name": "s"},\n'
        .. '{"type": "test-filter", "name": "s"}]}',
        'cfg.json:2: plugins[1].name: duplicate plugin name "s" (also plugins[0])',
        'give each instance its own "name"')
      fails('{"plugins": [{"type": "test-scorer"}, {"type": "test-scorer"}]}',
        'plugins[1].type: duplicate plugin name "test-scorer"')
    end)

    it("needs parameters to be an object", function()
      fails('{"plugins": [{"type": "test-scorer", "parameters": [1]}]}',
        "plugins[0].parameters: parameters must be an object, got array")
    end)

    it("reports parameter schema violations with the field and the bound", function()
      fails('{"plugins": [{"type": "test-scorer",\n "parameters": {"value": "high"}}]}',
        'cfg.json:2: plugins[0].parameters.value: must be a number, got "high"')
      fails('{"plugins": [{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 1.5}}]}',
        "plugins[0].parameters.maxNumOfEndpoints: must be an integer, got 1.5")
      fails('{"plugins": [{"type": "test-observer", "parameters": {"allocate": -1}}]}',
        "plugins[0].parameters.allocate: must be an integer ≥ 0, got -1")
      fails('{"plugins": [{"type": "test-scorer", "parameters": {"bad": "sometimes"}}]}',
        'plugins[0].parameters.bad: must be one of "none", "string", "short", "nan", "table", '
        .. 'got "sometimes"')
      fails('{"plugins": [{"type": "test-observer", "parameters": {"fail": [1]}}]}',
        "plugins[0].parameters.fail: item 0 must be a string, got 1")
    end)

    it("refuses unknown parameters, listing the known ones", function()
      fails('{"plugins": [{"type": "max-score-picker", "parameters": {"maxEndpoints": 2}}]}',
        'plugins[0].parameters.maxEndpoints: unknown parameter "maxEndpoints"; '
        .. "known parameters: maxNumOfEndpoints")
      fails('{"plugins": [{"type": "single-profile-handler", "parameters": {"x": 1}}]}',
        "this plugin takes no parameters")
    end)

    it("checks profiles: array, name, unique, fields", function()
      fails('{"schedulingProfiles": {}}', "schedulingProfiles must be an array")
      fails('{"schedulingProfiles": [{"plugins": []}]}',
        'schedulingProfiles[0]: missing "name": give the profile a name')
      fails('{"plugins":[{"type":"test-handler"}],"schedulingProfiles": [{"name": "a"},\n'
        .. '{"name": "a"}]}',
        'cfg.json:2: schedulingProfiles[1].name: duplicate profile name "a" (also schedulingProfiles[0])')
      fails('{"schedulingProfiles": [{"name": "a", "scorers": []}]}',
        'schedulingProfiles[0].scorers: unknown field "scorers" in a profile; known fields: name, plugins')
      fails('{"schedulingProfiles": [{"name": "a", "plugins": {}}]}',
        "schedulingProfiles[0].plugins: a profile's plugins must be an array")
    end)

    it("checks each profile plugin: pluginRef defined, weight a number", function()
      fails('{"plugins": [{"type": "test-scorer", "name": "s"}],\n'
        .. '"schedulingProfiles": [{"name": "a", "plugins": [\n{"pluginRef": "q"}]}]}',
        'cfg.json:3: schedulingProfiles[0].plugins[0].pluginRef: undefined pluginRef "q"; '
        .. "defined plugins: s")
      fails('{"schedulingProfiles": [{"name": "a", "plugins": [{"weight": 2}]}]}',
        'schedulingProfiles[0].plugins[0]: missing "pluginRef"')
      fails('{"plugins": [{"type": "test-scorer", "name": "s"}],'
        .. '"schedulingProfiles": [{"name": "a", "plugins": [{"pluginRef": "s", "weight": -1}]}]}',
        "schedulingProfiles[0].plugins[0].weight: weight must be a number ≥ 0, got -1")
      fails('{"plugins": [{"type": "test-scorer", "name": "s"}],'
        .. '"schedulingProfiles": [{"name": "a", "plugins": [{"pluginRef": "s", "w": 1}]}]}',
        'unknown field "w" in a profile plugin; known fields: pluginRef, weight')
    end)

    it("refuses two pickers in a profile", function()
      fails('{"plugins": [{"type": "test-picker", "name": "p1"},'
        .. '{"type": "max-score-picker", "name": "p2"}],\n'
        .. '"schedulingProfiles": [{"name": "a", "plugins": [{"pluginRef": "p1"},\n'
        .. '{"pluginRef": "p2"}]}]}',
        'cfg.json:3: schedulingProfiles[0].plugins[1]: profile "a" has two pickers, "p1" and "p2"; keep one')
    end)

    it("refuses two pickers in the default profile too", function()
      fails('{"plugins": [{"type": "test-picker", "name": "p1"},'
        .. '{"type": "max-score-picker", "name": "p2"}]}', 'has two pickers, "p1" and "p2"')
    end)

    it("refuses several profile handlers", function()
      fails('{"plugins": [{"type": "test-handler", "name": "h1"},\n'
        .. '{"type": "single-profile-handler", "name": "h2"}]}',
        "cfg.json:2: plugins[1]: several profile handlers (h1, h2); keep exactly one")
    end)

    it("needs a profile handler for several profiles", function()
      fails('{"plugins": [{"type": "test-picker", "name": "p"}],\n'
        .. '"schedulingProfiles": [{"name": "a"}, {"name": "b"}]}',
        "cfg.json:2: schedulingProfiles: 2 profiles but no profile handler",
        '"pd-profile-handler"')
    end)

    it("refuses single-profile-handler with several profiles", function()
      fails('{"plugins": [{"type": "single-profile-handler"}],\n'
        .. '"schedulingProfiles": [{"name": "a"}, {"name": "b"}]}',
        "cfg.json:1: plugins[0]: single-profile-handler runs one profile but 2 are defined")
    end)

    it("ignores, with a warning, a plugin in a profile that is not a filter, scorer or picker",
      function()
        local rt = S.runtime()
        finally(function() rt:free() end)
        local ok, err = rt:load_string('{"plugins": [{"type": "test-observer", "name": "o"},'
          .. ' {"type": "max-score-picker"}], "schedulingProfiles": [{"name": "a", "plugins":'
          .. ' [{"pluginRef": "o"}, {"pluginRef": "max-score-picker"}]}]}', "cfg.json")
        assert(ok, err)
        local warned = false
        for _, l in ipairs(rt:logs()) do
          warned = warned or l[2]:find('cfg.json:1: schedulingProfiles[0].plugins[0]: plugin "o"'
            .. ' (test-observer) is not a filter, scorer or picker; its entry in profile "a" is'
            .. " ignored", 1, true) ~= nil
        end
        assert.is_true(warned)
        -- the profile runs without the entry
        S.endpoints(rt, 2)
        assert.equal(200, S.lifecycle(rt, '{"model":"m","prompt":"hi"}').status)
      end)

    it("reports a plugin file's syntax error with its file and line", function()
      fails('{"plugins": [{"type": "test-broken-syntax"}]}',
        'cfg.json:1: plugins[0]: cannot load plugin type "test-broken-syntax": ',
        "test-broken-syntax.lua:3:")
    end)

    it("reports a plugin whose new fails", function()
      fails('{"plugins": [{"type": "test-broken-new"}]}',
        'plugins[0]: plugin "test-broken-new" (test-broken-new) failed to start',
        "cannot start: no backend configured")
    end)

    it("reports a missing config file", function()
      local rt = S.runtime()
      local ok, err = rt:load("/nonexistent/lupin.json")
      assert.is_nil(ok)
      assert.matches("cannot read config /nonexistent/lupin.json", err, 1, true)
      rt:free()
    end)

    it("keeps the current generation serving when a load fails", function()
      local rt = S.runtime()
      assert(rt:load("examples/configs/minimal.json"))
      S.endpoints(rt, 1)
      assert.is_nil((rt:load_string('{"plugins": [{"type": "nope"}]}')))
      assert.equal(1, rt:stats().generation)
      assert.equal(200, S.lifecycle(rt).status)
      rt:free()
    end)
  end)

  describe("files", function()
    it("loads a file and resolves pluginDirs relative to it", function()
      local rt = S.runtime({ plugin_dirs = {} })
      assert(rt:load("examples/embed/config.json"))
      S.endpoints(rt, 2)
      assert.equal(200, S.lifecycle(rt).status)
      rt:free()
    end)

    it("reloads the file it loaded, as a new generation", function()
      local dir = S.tmpdir()
      local path = S.write(dir .. "/c.json", '{"plugins": [{"type": "max-score-picker"}]}')
      local rt = S.runtime()
      assert(rt:load(path))
      S.write(path, '{"plugins": [{"type": "test-picker"}]}')
      assert(rt:reload())
      assert.equal(2, rt:stats().generation)
      assert.equal(1, rt:stats().generations_alive)
      S.write(path, '{"plugins": [{"type": "nope"}]}')
      local ok, err = rt:reload()
      assert.is_nil(ok)
      assert.matches(path .. ":1: plugins[0].type: unknown plugin type", err, 1, true)
      assert.equal(2, rt:stats().generation)
      rt:free()
      os.execute("rm -rf " .. dir)
    end)

    it("refuses to reload when no file was loaded", function()
      local rt = S.runtime()
      assert(rt:load_string('{"plugins": [{"type": "max-score-picker"}]}'))
      local ok, err = rt:reload()
      assert.is_nil(ok)
      assert.equal("reload: no config file was loaded", err)
      rt:free()
    end)

    it("keeps an old generation alive while a request is pinned to it", function()
      local rt = S.runtime()
      assert(rt:load("examples/configs/minimal.json"))
      S.endpoints(rt, 1)
      local req = rt:begin({})
      assert(rt:load("examples/configs/minimal.json"))
      assert.equal(2, rt:stats().generations_alive)
      assert.equal(200, req:schedule().status)
      req:finish("ok")
      assert.equal(1, rt:stats().generations_alive)
      rt:free()
    end)
  end)

  describe("flowControl, in the EPP's shape", function()
    -- the upstream configuration guide's example, with a profile
    local UPSTREAM = [[
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates:
- flowControl
plugins:
- type: round-robin-fairness-policy
- type: fcfs-ordering-policy
- type: global-strict-fairness-policy
- type: utilization-detector
- type: queue-scorer
saturationDetector:
  pluginRef: utilization-detector
flowControl:
  maxBytes: 0
  maxRequests: 0
  defaultRequestTTL: "0s"
  defaultPriorityBand:
    maxBytes: "1Gi"
    maxRequests: 0
    orderingPolicyRef: fcfs-ordering-policy
    fairnessPolicyRef: global-strict-fairness-policy
  priorityBands:
  - priority: 100
    maxBytes: "5Gi"
    maxRequests: 500
    fairnessPolicyRef: round-robin-fairness-policy
  - priority: 50
    maxBytes: "2Gi"
    maxRequests: 200
objectives:
- name: critical
  priority: 100
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
]]

    local function yaml_load(text)
      local rt = S.runtime()
      local ok, err = rt:load_string(text, "cfg.yaml")
      return rt, ok, err
    end

    it("loads the upstream example: bands, limits, policies by reference", function()
      local rt, ok, err = yaml_load(UPSTREAM)
      assert.is_true(ok, err)
      local f = S.eval(rt, [[
        local f = require("lupin.runtime").current.flow
        local b = f.bands
        return { ttl = f.ttl, max_bytes = f.max_bytes, detector = f.detector.name,
          b1 = { b[1].priority, b[1].max_bytes, b[1].max_requests, b[1].fairness.name,
            b[1].ordering.name },
          b2 = { b[2].priority, b[2].max_bytes, b[2].fairness.name },
          default = { f.default_band.max_bytes, f.default_band.fairness.name },
          critical = f.objectives.critical }]])
      assert.same({ ttl = 0, max_bytes = 0, detector = "utilization-detector",
        b1 = { 100, 5 * 1024 ^ 3, 500, "round-robin-fairness-policy", "fcfs-ordering-policy" },
        b2 = { 50, 2 * 1024 ^ 3, "global-strict-fairness-policy" },
        default = { 1024 ^ 3, "global-strict-fairness-policy" }, critical = 100 }, f)
      rt:free()
    end)

    it("is off without the section or the feature gate", function()
      local rt = load('{"plugins":[{"type":"test-scorer"}]}')
      assert.equal("off", S.eval(rt, [[return require("lupin.runtime").current.flow and "on"
        or "off"]]))
      rt:free()
    end)

    it("adds the default policies and detector as the EPP does", function()
      local rt, ok, err = load('{"plugins":[{"type":"test-scorer"}],"flowControl":{}}')
      assert.is_true(ok, err)
      assert.same({ "utilization-detector", "global-strict-fairness-policy",
        "fcfs-ordering-policy" }, S.eval(rt, [[
        local f = require("lupin.runtime").current.flow
        return { f.detector.type, f.default_band.fairness.type, f.default_band.ordering.type }]]))
      rt:free()
    end)

    it("bounds the queue with upstream's defaults: 60 s, 5000 requests and 1 GB a band", function()
      local rt, ok, err = load('{"plugins":[{"type":"test-scorer"}],"flowControl":{'
        .. '"defaultPriorityBand":{"maxRequests":0,"fairnessPolicyRef":"round-robin-fairness-policy"},'
        .. '"defaultNegativePriorityBand":{"maxBytes":"1Mi"},'
        .. '"priorityBands":[{"priority":10,"maxRequests":7},{"priority":-5}]}}')
      assert.is_true(ok, err)
      local got = S.eval(rt, [[
        local f = require("lupin.runtime").current.flow
        local function b(x)
          return { x.max_requests, x.max_bytes, x.fairness.type, x.ttl or "none" }
        end
        return { ttl = f.ttl, max_requests = f.max_requests, max_bytes = f.max_bytes,
          default = b(f.default_band), negative = b(f.negative_band), b10 = b(f.bands[1]),
          bneg = b(f.bands[2]) }]])
      assert.same({ ttl = 60, max_requests = 0, max_bytes = 0,
        -- 0 is the default, as upstream's: a band is always bounded
        default = { 5000, 1e9, "round-robin-fairness-policy", "none" },
        negative = { 5000, 1024 ^ 2, "global-strict-fairness-policy", "none" },
        -- a listed band starts from the defaults, not from defaultPriorityBand
        b10 = { 7, 1e9, "global-strict-fairness-policy", "none" },
        bneg = { 5000, 1e9, "global-strict-fairness-policy", "none" } }, got)
      rt:free()
      rt, ok, err = load('{"plugins":[{"type":"test-scorer"}],"flowControl":{"defaultRequestTTL":"0s"}}')
      assert.is_true(ok, err)
      assert.equal(0, S.eval(rt, [[return require("lupin.runtime").current.flow.ttl]]))
      rt:free()
    end)

    it("gates with GIE v1's thresholds, llm-d-router's place, negative bands", function()
      local rt, ok, err = load('{"plugins":[{"type":"test-scorer"},{"type":"concurrency-detector"}],'
        .. '"saturationDetector":{"queueDepthThreshold":2},"flowControl":{'
        .. '"defaultNegativePriorityBand":{"maxRequests":7}}}')
      assert.is_true(ok, err)
      assert.same({ "utilization-detector", 2, 7 }, S.eval(rt, [[
        local f = require("lupin.runtime").current.flow
        return { f.detector.type, f.detector.obj.params.queueDepthThreshold,
          f.negative_band.max_requests }]]))
      rt:free()
      rt, ok, err = load('{"plugins":[{"type":"test-scorer"},{"type":"concurrency-detector"}],'
        .. '"flowControl":{"saturationDetector":{"pluginRef":"concurrency-detector"}}}')
      assert.is_true(ok, err)
      assert.equal("concurrency-detector", S.eval(rt,
        [[return require("lupin.runtime").current.flow.detector.type]]))
      rt:free()
    end)

    it("names file, line and field for each mistake", function()
      fails('{"plugins":[],\n"flowControl":{"maxByte":1}}',
        'cfg.json:2: flowControl.maxByte: unknown field "maxByte" in the flowControl section')
      fails('{"plugins":[],\n"flowControl":{"maxBytes":"lots"}}',
        'cfg.json:2: flowControl.maxBytes: maxBytes must be a quantity ≥ 0 such as 1000, "1k" or "5Gi"')
      fails('{"plugins":[],\n"flowControl":{"defaultRequestTTL":"soon"}}',
        "cfg.json:2: flowControl.defaultRequestTTL: defaultRequestTTL must be a duration")
      fails('{"plugins":[],"flowControl":{"priorityBands":[\n{"maxBytes":1}]}}',
        "cfg.json:2: flowControl.priorityBands[0].priority: priority must be an integer")
      fails('{"plugins":[],"flowControl":{"priorityBands":[{"priority":1},\n{"priority":1}]}}',
        "cfg.json:2: flowControl.priorityBands[1].priority: duplicate priority 1")
      fails('{"plugins":[],"flowControl":{"priorityBands":[\n{"priority":1,"fairnessPolicyRef":"nope"}]}}',
        'cfg.json:2: flowControl.priorityBands[0].fairnessPolicyRef: no plugin named "nope"')
      fails('{"plugins":[{"type":"test-scorer"}],"flowControl":{"priorityBands":[\n'
        .. '{"priority":1,"orderingPolicyRef":"test-scorer"}]}}',
        'cfg.json:2: flowControl.priorityBands[0].orderingPolicyRef: plugin "test-scorer"'
        .. " (test-scorer) is not an ordering policy: it has no less method")
      fails('{"plugins":[{"type":"fcfs-ordering-policy"}],"flowControl":{},\n'
        .. '"saturationDetector":{"pluginRef":"fcfs-ordering-policy"}}',
        "cfg.json:2: saturationDetector.pluginRef:", "is not a saturation detector")
      fails('{"plugins":[],\n"objectives":[{"name":"a","priority":1.5}]}',
        "cfg.json:2: objectives[0].priority: priority must be an integer")
      fails('{"plugins":[],\n"objectives":[{"name":"a"},{"name":"a"}]}',
        'duplicate objective "a"')
    end)
  end)
end)
