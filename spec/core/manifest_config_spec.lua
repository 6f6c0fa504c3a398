-- Configs as Kubernetes keeps them (lupin.config.manifest): a multi-document
-- manifest whose ConfigMap data or own document holds the
-- EndpointPickerConfig, with the InferencePool beside it; and llm-d-router's
-- chart values, `router:` at the top (lupin.config.router).  Errors name
-- the manifest's own lines, also inside a ConfigMap's data.
local S = require "support"
local config = require "lupin.config"

local FIXTURES = S.ROOT .. "/spec/fixtures/manifests/"
local MANIFEST = FIXTURES .. "epp-manifest.yaml"
local VALUES = FIXTURES .. "router-values.yaml"
local LUPIN = S.ROOT .. "/" .. S.BUILD .. "/lupin"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The line (1-based) of the first line of text holding needle.
local function line_of(text, needle)
  local n = 0
  for line in text:gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find(needle, 1, true) then
      return n
    end
  end
  error("no line holds " .. needle)
end

local function parse(text, source)
  return config.parse(text, source or "m.yaml")
end

local function fails(text, want, source)
  local cfg, err = parse(text, source)
  assert.is_nil(cfg, "the config loaded")
  assert.matches(want, err, 1, true)
  return err
end

local function types(cfg)
  local out = {}
  for i, p in ipairs(cfg.plugins) do
    out[i] = p.type
  end
  return table.concat(out, " ")
end

local SERVICE = "apiVersion: v1\nkind: Service\nmetadata:\n  name: epp\nspec:\n  ports:\n"
  .. "  - port: 9002\n"
local EPC = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
  .. "- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"
  .. "  - pluginRef: queue-scorer\n"

describe("a Kubernetes manifest as the config", function()
  it("takes the config the Deployment's --config-file names, and the InferencePool beside it",
    function()
      local cfg = assert(config.parse(nil, MANIFEST))
      assert.equal("queue-scorer kv-cache-utilization-scorer max-score-picker", types(cfg))
      assert.equal(1, #cfg.pools)
      local p = cfg.pools[1]
      assert.same({ "qwen-pool", "serving", "inference.networking.k8s.io", "v1",
        "app=qwen,tier=gpu", { 8000, 8001 }, MANIFEST .. ":5" },
        { p.name, p.namespace, p.group, p.version, p.selector_text, p.ports, p.where })
    end)

  it("names the manifest's line for a mistake inside a ConfigMap's data", function()
    local text = read(MANIFEST)
    local bad = text:gsub("weight: 1\n", "weight: -1\n")
    fails(bad, ("m.yaml:%d: schedulingProfiles[0].plugins[1].weight: weight must be a number ≥ 0"
      ):format(line_of(text, "weight: 1")))
    bad = text:gsub("%- type: max%-score%-picker\n", "- type: max-score-picker\n      bogus: 1\n")
    fails(bad, ('m.yaml:%d: plugins[2].bogus: unknown field "bogus"'):format(
      line_of(text, "- type: max-score-picker") + 1))
    bad = text:gsub("    %- name: default\n      plugins:\n      %- pluginRef: queue%-scorer\n"
      .. "        weight: 2", "    - name: default\n      plugins: [\n")
    fails(bad, ("m.yaml:%d: invalid YAML:"):format(line_of(text, "weight: 2")))
  end)

  it("takes a config given as a document of its own and ignores the other kinds", function()
    local text = SERVICE .. "---\n" .. EPC .. "---\napiVersion: gateway.networking.k8s.io/v1\n"
      .. "kind: HTTPRoute\nmetadata:\n  name: r\n"
    local cfg = assert(parse(text))
    assert.equal("queue-scorer", types(cfg))
    assert.same({}, cfg.pools)
    -- its lines are the file's
    fails(text:gsub("pluginRef: queue%-scorer", "pluginRef: nope"),
      ('m.yaml:%d: schedulingProfiles[0].plugins[0].pluginRef: undefined pluginRef "nope"')
        :format(line_of(text, "pluginRef: queue-scorer")))
  end)

  it("refuses a file with no config, naming what it holds", function()
    fails(SERVICE .. "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n"
      .. "  a.txt: hello\n", "m.yaml:1: no EndpointPickerConfig in this file: give one as a"
      .. " document (kind: EndpointPickerConfig) or as a ConfigMap's data entry; found Service"
      .. " epp (line 1)")
  end)

  it("refuses a Helm template or GIE's chart values, saying to render the chart", function()
    fails("# the chart's config\napiVersion: v1\nkind: ConfigMap\nmetadata:\n"
      .. "  name: {{ include \"epp.name\" . }}\n",
      "m.yaml:5: a Helm template ({{ ... }}), not a config: render the chart (helm template")
    fails("global: {}\ninferenceExtension:\n  replicas: 1\n  pluginsConfigFile: x.yaml\n",
      "m.yaml:2: inferenceExtension: GIE's inferencepool chart values, not a config: render the"
      .. " chart (helm template")
    fails("inferencePool:\n  modelServers:\n    matchLabels: {app: vllm}\n",
      "m.yaml:1: inferencePool: GIE's inferencepool chart values")
  end)

  it("refuses two configs, naming both lines, unless a Deployment names one", function()
    -- SERVICE: lines 1-7, ---, EPC: 9-16, ---, EPC from 18
    fails(SERVICE .. "---\n" .. EPC .. "---\n" .. EPC, "m.yaml:18: a second EndpointPickerConfig"
      .. " (the document at line 18); the first is at line 9 (the document at line 9)")
    local map = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a.yaml: |\n"
      .. EPC:gsub("[^\n]+", "    %0") .. "  b.yaml: |\n" .. EPC:gsub("[^\n]+", "    %0")
    fails(map, 'm.yaml:15: a second EndpointPickerConfig (ConfigMap c, data key "b.yaml"); the'
      .. ' first is at line 6 (ConfigMap c, data key "a.yaml"): keep one, or name it with'
      .. " --config-file in the Deployment's args")
    local deploy = "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n"
      .. "  template:\n    spec:\n      containers:\n      - name: epp\n"
      .. "        args: [epp, --config-file=/config/b.yaml]\n"
    local text = map:gsub("(b.yaml: |\n    apiVersion[^\n]*\n    kind[^\n]*\n    plugins:\n"
      .. "    %- type: queue%-scorer)", "%1\n    - type: max-score-picker")
    local cfg = assert(parse(text .. deploy))
    assert.equal("queue-scorer max-score-picker", types(cfg))
  end)

  it("reads a v1alpha2 pool: selector as a map, targetPortNumber", function()
    local cfg = assert(parse("apiVersion: inference.networking.x-k8s.io/v1alpha2\n"
      .. "kind: InferencePool\nmetadata:\n  name: old\nspec:\n  targetPortNumber: 8080\n"
      .. "  selector:\n    app: old\n---\n" .. EPC))
    local p = cfg.pools[1]
    assert.same({ "old", "inference.networking.x-k8s.io", "v1alpha2", "app=old", { 8080 } },
      { p.name, p.group, p.version, p.selector_text, p.ports })
  end)

  it("reads v1alpha2's fields under apiVersion v1 as v1alpha2's, with a warning", function()
    local rt = S.runtime()
    finally(function() rt:free() end)
    assert(rt:load_string("apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
      .. "metadata:\n  name: mixed\nspec:\n  targetPortNumber: 8000\n  selector:\n"
      .. "    app: mixed\n---\n" .. EPC, "m.yaml"))
    local warned = false
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:find("m.yaml:5: spec: an InferencePool of"
        .. " inference.networking.k8s.io/v1 with v1alpha2's fields", 1, true) ~= nil
    end
    assert.is_true(warned)
    assert.equal("v1 app=mixed 8000", S.eval(rt, "local p = require('lupin.runtime').current"
      .. ".pools[1] return p.version .. ' ' .. p.selector_text .. ' ' .. p.ports[1]"))
  end)

  it("refuses a pool it could not use, at the line of the field", function()
    local pool = "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n"
      .. "  name: p\nspec:\n  targetPorts:\n  - number: %s\n  selector:\n    matchLabels:\n"
      .. "%s---\n" .. EPC
    fails(pool:format("70000", "      app: x\n"), "m.yaml:7: spec.targetPorts[0].number: a target"
      .. " port must be an integer from 1 to 65535, got 70000")
    fails(pool:format("8000", "      {}\n"), "m.yaml:9: spec.selector.matchLabels: the pool"
      .. " selects no pods: give spec.selector.matchLabels { label: value }")
    fails(pool:format("8000", "      replicas: 2\n"), "m.yaml:10:"
      .. " spec.selector.matchLabels.replicas: a label's value must be a string, got 2")
    fails(pool:gsub("  %- number: %%s\n", ("  - number: 1\n"):rep(9)):format("      app: x\n"),
      "m.yaml:6: spec.targetPorts: a pool has at most 8 target ports, got 9")
    fails("apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata:\n"
      .. "  name: p\nspec:\n  selector:\n    app: x\n---\n" .. EPC, "m.yaml:5: spec.targetPortNumber:"
      .. " the pool has no target port: give spec.targetPortNumber")
    fails(pool:gsub("k8s.io/v1", "example.com/v9"):format("8000", "      app: x\n"),
      "m.yaml:1: apiVersion: an InferencePool's apiVersion must be"
      .. " inference.networking.k8s.io/v1, inference.networking.x-k8s.io/v1alpha2, got"
      .. ' "inference.networking.example.com/v9"')
  end)

  it("keeps a JSON config and a lone YAML document as they were", function()
    local cfg = assert(parse('{"plugins": [{"type": "queue-scorer"}]}', "c.json"))
    assert.equal("queue-scorer", types(cfg))
    assert.same({}, cfg.pools)
    fails("kind: Service\n", 'm.yaml:1: kind: kind must be "EndpointPickerConfig", got "Service"')
    fails("# nothing\n", "m.yaml:1: invalid YAML: the file holds no document")
  end)

  it("digests the pool with the config: an edited selector is a changed config", function()
    local text = read(MANIFEST)
    local a = assert(parse(text))
    local b = assert(parse((text:gsub("tier: gpu", "tier: cpu"))))
    local c = assert(parse(text))
    assert.are_not.equal(a.text, b.text)
    assert.equal(a.text, c.text)
  end)

  it("loads into a runtime, which keeps the pools for the host", function()
    local rt = S.runtime()
    assert(rt:load(MANIFEST))
    assert.equal("app=qwen,tier=gpu",
      S.eval(rt, "return require('lupin.runtime').current.pools[1].selector_text"))
    rt:free()
  end)
end)

describe("llm-d-router's chart values (router:) as the config", function()
  local values = read(VALUES)

  it("takes epp.pluginsCustomConfig's entry, modelServers as the pool, the objectives",
    function()
      local cfg = assert(config.parse(nil, VALUES))
      assert.equal("queue-scorer prefix-cache-scorer", types(cfg))
      assert.same({ interactive = 5, batch = -1 }, cfg.objectives)
      local p = cfg.pools[1]
      assert.same({ nil, "app=vllm-llama", { 8200 }, "v1" },
        { p.name, p.selector_text, p.ports, p.version })
    end)

  it("names the file's line for a mistake inside pluginsCustomConfig or the objectives",
    function()
      fails(values:gsub("weight: 3", "weight: x"), ("m.yaml:%d: schedulingProfiles[0].plugins[1]"
        .. ".weight:"):format(line_of(values, "weight: 3")))
      fails(values:gsub("priority: %-1", "priority: 1.5"), ("m.yaml:%d: objectives[1].priority:"
        .. " priority must be an integer, got 1.5"):format(line_of(values, "priority: -1")))
    end)

  it("refuses what lupin does not do, at its line, saying why", function()
    local cases = {
      { "protocol: http", "protocol: grpc", "router.modelServers.protocol: not supported: lupin"
        .. " reaches model servers over HTTP only" },
      { "replicas: 1", "replicas: 3", "router.epp.replicas: not supported: lupin epp runs one"
        .. " replica" },
      { "enabled: false", "enabled: true", "router.tracing: not supported: lupin exports no"
        .. " OpenTelemetry traces" },
      { "flags:", "surprise: 1\n    flags:", 'router.epp.surprise: unknown field "surprise" in'
        .. " llm-d-router's chart values; known: affinity," },
    }
    for _, c in ipairs(cases) do
      local err = fails(values:gsub(c[1]:gsub("%p", "%%%0"), c[2], 1), c[3])
      local want = line_of(values, c[1])
      assert.matches("^m.yaml:" .. (c[1] == "enabled: false" and want - 1 or want) .. ":", err)
    end
    fails("router:\n  latencyPredictor:\n    enabled: true\n", "m.yaml:2: router.latencyPredictor:"
      .. " not supported: lupin neither runs nor calls the chart's latency-predictor servers")
  end)

  it("refuses a pluginsConfigFile pluginsCustomConfig does not hold, and objectives twice",
    function()
      fails(values:gsub("pluginsConfigFile: baseline.yaml", "pluginsConfigFile: other.yaml"),
        ('m.yaml:%d: router.epp.pluginsConfigFile: no config "other.yaml" under'
        .. " router.epp.pluginsCustomConfig: lupin does not render the chart's built-in configs")
        :format(line_of(values, "pluginsConfigFile")))
      fails("router:\n  modelServers:\n    matchLabels: {app: x}\n", "m.yaml:1: router: no config"
        .. ' "default-plugins.yaml" under router.epp.pluginsCustomConfig')
      fails(values:gsub("        schedulingProfiles:", "        objectives: [{name: a}]\n%0"),
        ("m.yaml:%d: router.inferenceObjectives: both router.inferenceObjectives and the"
        .. " config's \"objectives\" (line %d): keep one"):format(
        line_of(values, "inferenceObjectives") + 1, -- one line added above it
        line_of(values, "        schedulingProfiles:")))
    end)

  it("refuses chart values of the wrong shape, and a pool it could not use, at their lines",
    function()
      local head = "router:\n  epp:\n    pluginsCustomConfig:\n      default-plugins.yaml: |\n"
        .. EPC:gsub("[^\n]+", "        %0") .. "  modelServers:\n"
      local cases = {
        { "router: [1]\n", "m.yaml:1: router: router must be a mapping" },
        { "router:\n  epp: [x]\n", "m.yaml:2: router.epp: epp must be a mapping, got [\"x\"]" },
        { head .. "    matchLabels: x\n", "m.yaml:14: router.modelServers.matchLabels:"
          .. " matchLabels must be a mapping of label: value" },
        { head .. "    matchLabels: {}\n", "m.yaml:14: router.modelServers.matchLabels: the pool"
          .. " selects no pods" },
        { head .. "    matchLabels: {app: 1}\n", "m.yaml:14: router.modelServers.matchLabels.app:"
          .. " a label's value must be a string, got 1" },
        { head .. "    matchLabels: {app: x}\n    targetPorts:\n    - number: 0\n",
          "m.yaml:16: router.modelServers.targetPorts[0].number: a target port must be an"
          .. " integer from 1 to 65535, got 0" },
        { head .. "    matchLabels: {app: x}\n    targetPorts: []\n", "m.yaml:15:"
          .. " router.modelServers.targetPorts: give 1 to 8 target ports ({number})" },
        { head:gsub("plugins:\n", "plugins: [\n", 1), "m.yaml:8: invalid YAML: did not find expected"
          .. " node content" }, -- at the "- type" line, inside the block
      }
      for _, c in ipairs(cases) do
        fails(c[1], c[2])
      end
    end)

  it("makes no pool when inferencePool.create is false", function()
    local cfg = assert(parse((values:gsub("failureMode: FailOpen", "create: false"))))
    assert.same({}, cfg.pools)
  end)

  it("warns that epp.parsers has no effect beside a custom config, logs what is not read",
    function()
      local rt = S.runtime()
      assert(rt:load_string((values:gsub("    flags:", "    parsers: [openai-parser]\n%0")),
        "v.yaml"))
      local logs = {}
      for _, l in ipairs(rt:logs()) do
        logs[#logs + 1] = l[2]
      end
      rt:free()
      logs = table.concat(logs, "\n")
      local parsers = line_of(values, "flags:") -- the line added above flags
      assert.matches(("v.yaml:%d: router.epp.parsers: no effect: router.epp.parsers shape only the"
        .. " chart's built-in default-plugins.yaml, and the config is"
        .. " router.epp.pluginsCustomConfig.baseline.yaml"):format(parsers), logs, 1, true)
      assert.matches(("v.yaml:%d: provider: not read: provider, router.epp.flags,"
        .. " router.epp.image, router.epp.replicas, router.extraServicePorts,"
        .. " router.inferencePool.failureMode, router.tracing describe how the chart deploys the"
        .. " picker"):format(line_of(values, "provider:") + 1), logs, 1, true)
    end)
end)

describe("lupin check on a manifest and on chart values", function()
  local function check(path)
    local p = io.popen(LUPIN .. " check " .. (path:find("^%-%-") and "" or "--config ") .. path
      .. " 2>&1")
    local out = p:read("*a")
    local ok, _, rc = p:close()
    return out, ok and 0 or rc
  end

  it("passes both, and says which pool's pods the endpoints would be", function()
    local out, rc = check(MANIFEST)
    assert.equal(0, rc, out)
    assert.matches(MANIFEST .. ": InferencePool qwen-pool selects app=qwen,tier=gpu, port 8000"
      .. " and more (" .. MANIFEST .. ":5): with --k8s-pool, its pods are the endpoints", out, 1,
      true)
    assert.is_nil(out:find("lists no endpoints", 1, true))
    out, rc = check(VALUES)
    assert.equal(0, rc, out)
    assert.matches("selects app=vllm-llama, port 8200", out, 1, true)
    out, rc = check("--format json --config " .. MANIFEST)
    assert.equal(0, rc, out)
    assert.same({ name = "qwen-pool", selector = "app=qwen,tier=gpu", ports = { 8000, 8001 },
      at = MANIFEST .. ":5" }, require("cjson").decode(out).pool)
    assert.is_nil(require("cjson").decode(out).warnings)
  end)

  it("passes deploy/'s pool, Service, Deployment and ConfigMap as one file", function()
    local parts = {}
    for i, f in ipairs({ "inferencepool", "service", "deployment", "configmap" }) do
      parts[i] = read(S.ROOT .. "/deploy/" .. f .. ".yaml")
    end
    local tmp = os.tmpname()
    S.write(tmp, table.concat(parts, "---\n"))
    local out, rc = check(tmp)
    os.remove(tmp)
    assert.equal(0, rc, out)
    assert.matches("InferencePool vllm-qwen3-32b selects app=vllm-qwen3-32b, port 8000", out, 1,
      true)
  end)
end)
