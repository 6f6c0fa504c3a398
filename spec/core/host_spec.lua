-- What a host builds on beyond requests (core/host.c, lupin.h "what a host
-- builds on"): config sections of its own, checked with the rest of the
-- config; the endpoints a config or a file lists; the dry run.
local S = require "support"

local BASE = [[
{
  "plugins": [ { "type": "max-score-picker" } ],
  "schedulingProfiles": [ { "name": "d", "plugins": [ { "pluginRef": "max-score-picker" } ] } ],
%s
}
]]

local SETTINGS = {
  { name = "timeoutMs", default = 1000, min = 1 },
  { name = "poolSize", default = 64, min = 0 },
  { name = "percent", default = 20, min = 0, max = 100 },
}

local function runtime(declare)
  local rt = S.runtime()
  if declare ~= false then
    assert(rt:declare_section("host", SETTINGS))
  end
  return rt
end

local function load(extra, declare)
  local rt = runtime(declare)
  local ok, err = rt:load_string(BASE:format(extra), "cfg.json")
  return rt, ok, err
end

local function fails(extra, want, declare)
  local rt, ok, err = load(extra, declare)
  rt:free()
  assert.is_nil(ok, "the config loaded")
  assert.matches(want, err, 1, true)
end

describe("a host's config section", function()
  it("has its defaults when the config leaves it out, and the config's values", function()
    local rt = assert(load('"kind": "EndpointPickerConfig"'))
    assert.same({ 1000, 64, 20 }, rt:section("host", 3))
    rt:free()
    rt = assert(load('"host": { "poolSize": 0, "percent": 100 }'))
    assert.same({ 1000, 0, 100 }, rt:section("host", 3))
    rt:free()
  end)

  it("is checked with the rest of the config: file, line, field", function()
    fails('"host": { "timeoutMs": 0 }',
      "cfg.json:4: host.timeoutMs: timeoutMs must be an integer ≥ 1, got 0")
    fails('"host": { "percent": 101 }', "host.percent: percent must be an integer ≤ 100, got 101")
    fails('"host": { "poolSize": 1.5 }', "host.poolSize: poolSize must be an integer")
    fails('"host": { "pool": 1 }', 'host.pool: unknown field "pool" in the host section')
    fails('"host": []', "host must be an object")
  end)

  it("is an unknown field of the config when no host declared it", function()
    fails('"host": { "poolSize": 1 }', 'unknown field "host" in the config', false)
    local rt = assert(load('"kind": "EndpointPickerConfig"', false))
    assert.is_nil(rt:section("host", 3))
    rt:free()
  end)

  it("refuses a declaration that cannot work", function()
    local rt = S.runtime()
    local _, err = rt:declare_section("plugins", SETTINGS)
    assert.matches("section of the runtime's own config", err, 1, true)
    _, err = rt:declare_section("two words", SETTINGS)
    assert.matches("must be a word", err, 1, true)
    _, err = rt:declare_section("h", { { name = "x", default = 0, min = 1 } })
    assert.matches("x's default 0 is out of its bounds", err, 1, true)
    _, err = rt:declare_section("h", { { name = "x", default = 1, min = 0 },
      { name = "x", default = 1, min = 0 } })
    assert.matches("setting 2 needs a name of its own", err, 1, true)
    rt:free()
  end)

  it("has string settings: a default, a pattern the value must match, read by name", function()
    local decl = { { name = "n", default = 1, min = 0 },
      { name = "address", text = "127.0.0.1:6379", pattern = "^[^:]+:%d+$", what = "HOST:PORT" } }
    local function with(extra)
      local rt = S.runtime()
      assert(rt:declare_section("host", decl))
      local ok, err = rt:load_string(BASE:format(extra), "cfg.json")
      return rt, ok, err
    end
    local rt = assert(with('"kind": "EndpointPickerConfig"'))
    assert.equal("127.0.0.1:6379", rt:section_text("host", "address"))
    assert.same({ 1, 0 }, rt:section("host", 2))
    assert.is_nil(rt:section_text("host", "n"))
    rt:free()
    rt = assert(with('"host": { "address": "redis.local:7000" }'))
    assert.equal("redis.local:7000", rt:section_text("host", "address"))
    rt:free()
    local ok, err
    rt, ok, err = with('"host": { "address": "nowhere" }')
    rt:free()
    assert.is_nil(ok)
    assert.matches('cfg.json:4: host.address: address must be HOST:PORT, got "nowhere"', err, 1, true)
    rt, ok, err = with('"host": { "address": 6379 }')
    rt:free()
    assert.is_nil(ok)
    assert.matches("host.address: address must be a string, got 6379", err, 1, true)
  end)

  it("gives no values before a config is loaded", function()
    local rt = runtime()
    assert.is_nil(rt:section("host", 3))
    rt:free()
  end)
end)

describe("the endpoints a config or a file lists", function()
  it("reads the config's, names defaulting to address:port", function()
    local rt = assert(load([["endpoints": [
      { "address": "10.0.0.1", "port": 8000, "labels": { "role": "decode" } },
      { "name": "b", "address": "10.0.0.2", "port": 8001 } ] ]]))
    local eps = rt:read_endpoints()
    assert.equal("10.0.0.1:8000", eps[1].name)
    assert.equal("decode", eps[1].labels.role)
    assert.equal("b", eps[2].name)
    assert.equal(8001, eps[2].port)
    rt:free()
  end)

  it("names the line and path of each mistake in a config", function()
    fails('"endpoints": {}', "endpoints must be an array")
    fails('"endpoints": [ { "port": 1 } ]', 'endpoints[0]: missing "address"')
    fails('"endpoints": [\n { "address": "a", "port": 70000 } ]',
      "cfg.json:5: endpoints[0].port: port must be an integer from 1 to 65535, got 70000")
    fails('"endpoints": [ { "address": "a", "port": 1, "lables": {} } ]',
      'endpoints[0].lables: unknown field "lables" in an endpoint')
    fails('"endpoints": [ { "address": "a", "port": 1, "labels": { "x": 1 } } ]',
      "endpoints[0].labels.x: label values must be strings")
    fails('"endpoints": [ { "address": "a", "port": 1 }, { "address": "a", "port": 1 } ]',
      'endpoints[1]: duplicate endpoint "a:1"')
  end)

  it("reads an endpoints file with the same checks", function()
    local rt = assert(load('"kind": "EndpointPickerConfig"'))
    local dir = S.tmpdir()
    local good = S.write(dir .. "/good.json", '[ { "address": "10.0.0.9", "port": 9 } ]')
    assert.equal("10.0.0.9:9", rt:read_endpoints(good)[1].name)
    local yaml = S.write(dir .. "/good.yaml", "- {address: 10.0.0.8, port: 8, labels: {z: a}}\n")
    assert.equal("a", rt:read_endpoints(yaml)[1].labels.z)
    local bad = S.write(dir .. "/bad.json", '[\n  { "address": "10.0.0.9", "port": "9" } ]')
    local _, err = rt:read_endpoints(bad)
    assert.matches("bad.json:2: [0].port: port must be an integer", err, 1, true)
    local broken = S.write(dir .. "/broken.json", "[\n{")
    _, err = rt:read_endpoints(broken)
    assert.matches("broken.json:2: invalid JSON", err, 1, true)
    _, err = rt:read_endpoints(dir .. "/none.json")
    assert.matches("cannot read", err, 1, true)
    rt:free()
  end)
end)

describe("the dry run a host asks for", function()
  it("runs the current generation's plugins over the endpoints now, naming a failure", function()
    local rt = S.runtime({ plugin_dirs = { S.FIXTURES } })
    assert(rt:load_string([[{
      "plugins": [ { "type": "test-scorer", "parameters": { "fail": true } },
                   { "type": "max-score-picker" } ],
      "schedulingProfiles": [ { "name": "d", "plugins": [ { "pluginRef": "test-scorer" },
        { "pluginRef": "max-score-picker" } ] } ] }]], "dry.json"))
    assert.is_true(rt:dry_run())
    S.endpoints(rt, 2)
    local ok, err = rt:dry_run()
    assert.is_nil(ok)
    assert.matches('plugin "test-scorer" (test-scorer) failed in score during the dry', err, 1, true)
    rt:free()
  end)
end)
