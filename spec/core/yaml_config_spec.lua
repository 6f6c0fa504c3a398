-- YAML configs: the YAML 1.2 core schema, the same checks and the same
-- "file:line: path: message" errors as JSON, twins that digest alike, and
-- EPP configs as upstream writes them.
local config = require "lupin.config"
local support = require "support"
local yaml = require "lupin.config.yaml"

local function digest(rt)
  for _, g in ipairs(rt:generations()) do
    if g.current then
      return g.digest
    end
  end
end

local function load_file(path)
  local rt = support.runtime()
  local ok, err = rt:load(path)
  return rt, ok, err
end

local function write(name, text)
  local path = support.tmpdir() .. "/" .. name
  support.write(path, text)
  return path
end

describe("YAML scalars (the YAML 1.2 core schema)", function()
  local v = assert(yaml.decode([[
yes_: yes
no_: no
on_: on
off_: off
y: y
t1: true
t2: True
f: FALSE
n1: null
n2: ~
n3:
oct: 0o17
hex: 0x1F
dec: 017
neg: -12
flt: 1.5e3
half: .5
inf: -.inf
under: 1_000
quoted: "12"
single: 'true'
tagged: !!str 42
time: 12:30
]], "t.yaml"))

  it("keeps yes, no, on, off and y strings, as YAML 1.2 does", function()
    assert.same({ "yes", "no", "on", "off", "y" }, { v.yes_, v.no_, v.on_, v.off_, v.y })
  end)

  it("reads booleans, nulls and numbers", function()
    assert.same({ true, true, false }, { v.t1, v.t2, v.f })
    local null = require("cjson").null
    assert.same({ null, null, null }, { v.n1, v.n2, v.n3 })
    assert.same({ 15, 31, 17, -12, 1500, 0.5, -math.huge },
      { v.oct, v.hex, v.dec, v.neg, v.flt, v.half, v.inf })
  end)

  it("keeps quoted, tagged and unresolved scalars strings", function()
    assert.same({ "1_000", "12", "true", "42", "12:30" },
      { v.under, v.quoted, v.single, v.tagged, v.time })
  end)

  it("follows anchors and aliases, kinds included", function()
    local doc, index = assert(yaml.decode("a: &p\n  x: [1, 2]\nb: *p\n", "t.yaml"))
    assert.same({ 1, 2 }, doc.b.x)
    assert.equal("array", index.kinds["b.x"])
    assert.equal(3, index.lines.b)
  end)

  it("names the line of a syntax error, a duplicate key, a second document", function()
    local cases = {
      { "a: [1\nb: 2\n", "t.yaml:2: invalid YAML: did not find expected ',' or ']'" },
      { "a: 1\nb: 2\na: 3\n", 't.yaml:3: invalid YAML: duplicate key "a"' },
      { "a: 1\n---\nb: 2\n", "t.yaml:2: invalid YAML: a config is one YAML document" },
      { "a: *nope\n", "t.yaml:1: invalid YAML:" },
      { "a: !!int x\n", 't.yaml:1: invalid YAML: cannot read "x" as !!int' },
      { "b: &m {x: 1}\na:\n  <<: *m\n", "t.yaml:3: invalid YAML: merge keys" },
      { "", "t.yaml:1: invalid YAML: the file holds no document" },
    }
    for _, c in ipairs(cases) do
      local ok, err = yaml.decode(c[1], "t.yaml")
      assert.is_nil(ok, c[1])
      assert.truthy(err:find(c[2], 1, true), err)
    end
  end)
end)

describe("a YAML config", function()
  it("gets the JSON checks, with the YAML line and the path", function()
    local cases = {
      { "plugins:\n- type: queue-scorer\n  nme: q\n", "cfg.yaml:3: plugins[0].nme: unknown field" },
      { "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"
        .. "  - pluginRef: q\n", 'cfg.yaml:6: schedulingProfiles[0].plugins[0].pluginRef:'
        .. ' undefined pluginRef "q"; defined plugins: queue-scorer' },
      { "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"
        .. "  - pluginRef: queue-scorer\n    weight: yes\n",
        'cfg.yaml:7: schedulingProfiles[0].plugins[0].weight: weight must be a number' },
      { "plugins: {}\n", "cfg.yaml:1: plugins: plugins must be an array, got object" },
      { "kind: Other\n", 'cfg.yaml:1: kind: kind must be "EndpointPickerConfig"' },
      { "- 1\n- 2\n", "cfg.yaml:1: the config must be a YAML object" },
      { "plugins:\n  - type: [\n", "cfg.yaml:3: invalid YAML:" },
      { "endpoints:\n- {address: a, port: -1}\n",
        "cfg.yaml:2: endpoints[0].port: port must be an integer" },
    }
    for _, c in ipairs(cases) do
      local cfg, err = config.parse(c[1], "cfg.yaml")
      assert.is_nil(cfg, c[1])
      assert.truthy(err:find(c[2], 1, true), err)
    end
  end)

  it("reports a plugin's parameter error at its YAML line", function()
    local path = write("params.yaml", "plugins:\n- type: prefix-cache-scorer\n  parameters:\n"
      .. "    blockSize: 2.5\n")
    local _, ok, err = load_file(path)
    assert.is_nil(ok)
    assert.truthy(err:find(path .. ":4: plugins[0].parameters.blockSize:", 1, true), err)
  end)

  it("is YAML by its name, or by a text that does not begin as JSON does", function()
    assert.is_true(config.is_yaml("{}", "a.yaml"))
    assert.is_true(config.is_yaml("{}", "a.yml"))
    assert.is_true(config.is_yaml("plugins: []", "a.json"))
    assert.is_false(config.is_yaml(' \n{"plugins": []}', "a.json"))
    assert.is_false(config.is_yaml("[]", "endpoints"))
    -- a broken JSON text stays a JSON error
    local _, err = config.parse('{"plugins": [}', "c.json")
    assert.truthy(err:find("c.json:1: invalid JSON", 1, true), err)
    -- YAML in a file named .json loads
    assert.truthy(config.parse("plugins:\n- type: queue-scorer\n", "c.json"))
  end)

  it("reads a YAML endpoints file", function()
    local path = write("eps.yml", "- {name: a, address: 10.0.0.1, port: 8000,"
      .. " labels: {role: decode}}\n- address: 10.0.0.2\n  port: 8001\n")
    local list = assert(config.endpoints_file(path))
    assert.same({ { name = "a", address = "10.0.0.1", port = 8000, labels = { role = "decode" } },
      { name = "10.0.0.2:8001", address = "10.0.0.2", port = 8001, labels = {} } }, list)
    path = write("bad-eps.yml", "- address: 10.0.0.1\n  port: on\n")
    local _, err = config.endpoints_file(path)
    assert.truthy(err:find(path .. ":2: [0].port: port must be an integer", 1, true), err)
  end)
end)

describe("the example configs", function()
  local dir = support.ROOT .. "/examples/configs"
  local jsons = {}
  for name in io.popen("ls " .. dir):lines() do
    if name:match("%.json$") then
      jsons[#jsons + 1] = name
    end
  end

  it("each have a YAML twin that loads to the same generation digest", function()
    assert.truthy(#jsons >= 3)
    for _, name in ipairs(jsons) do
      local base = name:gsub("%.json$", "")
      local json_path, yaml_path = dir .. "/" .. name, dir .. "/" .. base .. ".yaml"
      local text = assert(io.open(json_path)):read("*a")
      if text:match("^%s*%[") then -- an endpoints file
        assert.same(assert(config.endpoints_file(json_path)),
          assert(config.endpoints_file(yaml_path)))
      else
        local a = load_file(json_path)
        local b = load_file(yaml_path)
        assert.truthy(digest(a), name)
        assert.equal(digest(a), digest(b), name)
      end
    end
  end)

  it("every one loads: the configs as lupin serve reads them, the endpoints files", function()
    local n = 0
    for name in io.popen("ls " .. dir):lines() do
      local path = dir .. "/" .. name
      if name:match("%.ya?ml$") or name:match("%.json$") then
        if name:match("endpoints") then -- sim-endpoints.json, explain-endpoints.yaml, ...
          assert(config.endpoints_file(path))
        else
          local rt, ok, err = load_file(path)
          assert.is_true(ok, err)
          rt:free()
        end
        n = n + 1
      end
    end
    assert.truthy(n >= 10)
  end)

  it("flow-control.yaml and the upstream guide's example turn flow control on", function()
    local rt, ok, err = load_file(dir .. "/flow-control.yaml")
    assert.is_true(ok, err)
    assert.same({ "concurrency-detector", 30, { 10, 0, -1 }, 5, "edf-ordering-policy",
      "round-robin-fairness-policy", 10 }, support.eval(rt, [[
      local f = require("lupin.runtime").current.flow
      return { f.detector.type, f.ttl, { f.bands[1].priority, f.bands[2].priority,
        f.bands[3].priority }, f.bands[3].ttl, f.bands[1].ordering.type,
        f.default_band.fairness.type, f.objectives.critical }]]))
    rt:free()
    rt, ok, err = load_file(dir .. "/flow-control-upstream-guide.yaml")
    assert.is_true(ok, err)
    assert.same({ "utilization-detector", 30, 1e9, 100, 5e8, 5000 }, support.eval(rt, [[
      local f = require("lupin.runtime").current.flow
      return { f.detector.type, f.ttl, f.max_bytes, f.bands[1].priority, f.bands[1].max_bytes,
        f.bands[1].max_requests }]]))
    rt:free()
  end)

  it("digest alike whatever the JSON layout, and differ when a value does", function()
    local a = load_file(write("a.json", '{"plugins": [{"type": "queue-scorer"}]}'))
    local b = load_file(write("b.json", '{\n  "plugins": [\n    { "type" : "queue-scorer" }\n  ]\n}'))
    local c = load_file(write("c.json", '{"plugins": [{"type": "queue-scorer", "name": "q"}]}'))
    assert.equal(digest(a), digest(b))
    assert.not_equal(digest(a), digest(c))
  end)
end)

describe("EPP configs as upstream writes them", function()
  -- the shape of llm-d's deploy/config samples: comments, float weights
  local LLMD = [[
# Sample EPP configuration for running with prefix cache in estimate mode and load-aware scorers
#
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: decode-filter
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: load-aware-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 2.0
  - pluginRef: load-aware-scorer
    weight: 1.0
  - pluginRef: max-score-picker
]]

  -- disaggregated prefill/decode: two profiles, named instances
  local PD = [[
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-header-handler
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: pd-profile-handler
  parameters:
    threshold: 10
    hashBlockSize: 5
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 50
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 50
]]

  it("load unchanged and schedule", function()
    for name, text in pairs({ ["llm-d.yaml"] = LLMD, ["pd.yaml"] = PD }) do
      local rt, ok, err = load_file(write(name, text))
      assert.truthy(ok, err)
      support.endpoints(rt, 2, { { labels = { ["llm-d.ai/role"] = "decode" } },
        { labels = { ["llm-d.ai/role"] = "prefill" } } })
      local res = support.lifecycle(rt)
      assert.equal(200, res.status, name)
    end
  end)
end)
