-- The config's lupin extensions for the gateway host: "endpoints" and
-- "gateway", checked like the rest, errors with file, line and JSON path;
-- and the body checks the gateway asks of the Lua side.
local S = require "support"

local BASE = [[
{
  "plugins": [ { "type": "max-score-picker" } ],
  "schedulingProfiles": [ { "name": "d", "plugins": [ { "pluginRef": "max-score-picker" } ] } ],
%s
}
]]

local function load(extra)
  local rt = S.runtime()
  local ok, err = rt:load_string(BASE:format(extra), "cfg.json")
  return rt, ok, err
end

local function fails(extra, want)
  local rt, ok, err = load(extra)
  rt:free()
  assert.is_nil(ok, "the config loaded")
  assert.matches(want, err, 1, true)
end

local function gateway(rt, op, ...)
  local args = S.json.encode({ ... })
  return S.eval(rt, ([[
    local cjson = require "cjson"
    local hooks = require("lupin.gateway")
    local rt = require("lupin.runtime")
    local args = cjson.decode(%q)
    local op = %q
    if op == "settings" or op == "endpoints" then
      return { hooks[op](rt.current) }
    end
    return { hooks[op](args[1], args[2]) }
  ]]):format(args, op))
end

describe("gateway config", function()
  it("defaults every setting", function()
    local rt = assert(load('"kind": "EndpointPickerConfig"'))
    local s = gateway(rt, "settings")[1]
    assert.equal(16 * 1024 * 1024, s.maxBodyBytes)
    assert.equal(50, s.refreshIntervalMs)
    assert.same({}, gateway(rt, "endpoints")[1])
    rt:free()
  end)

  it("reads settings and endpoints, names defaulting to address:port", function()
    local rt = assert(load([["gateway": { "refreshIntervalMs": 100, "poolSize": 0 },
      "endpoints": [ { "address": "10.0.0.1", "port": 8000, "labels": { "role": "decode" } },
                     { "name": "b", "address": "10.0.0.2", "port": 8001 } ] ]]))
    local s = gateway(rt, "settings")[1]
    assert.equal(100, s.refreshIntervalMs)
    assert.equal(0, s.poolSize)
    local eps = gateway(rt, "endpoints")[1]
    assert.equal("10.0.0.1:8000", eps[1].name)
    assert.equal("decode", eps[1].labels.role)
    assert.equal("b", eps[2].name)
    rt:free()
  end)

  it("names the line and path of each mistake", function()
    fails('"gateway": { "maxBodyByte": 1 }', 'cfg.json:4: gateway.maxBodyByte: unknown field')
    fails('"gateway": { "refreshIntervalMs": 0 }',
      "cfg.json:4: gateway.refreshIntervalMs: refreshIntervalMs must be an integer ≥ 1, got 0")
    fails('"gateway": { "idleTimeoutMs": 1.5 }', "gateway.idleTimeoutMs: idleTimeoutMs must be")
    fails('"gateway": []', "gateway must be an object")
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
    assert.equal("10.0.0.9:9", gateway(rt, "endpoints_file", good)[1][1].name)
    local bad = S.write(dir .. "/bad.json", '[\n  { "address": "10.0.0.9", "port": "9" } ]')
    local r = gateway(rt, "endpoints_file", bad)
    assert.matches("bad.json:2: [0].port: port must be an integer", r[2], 1, true)
    local broken = S.write(dir .. "/broken.json", "[\n{")
    assert.matches("broken.json:2: invalid JSON", gateway(rt, "endpoints_file", broken)[2], 1, true)
    assert.matches("cannot read", gateway(rt, "endpoints_file", dir .. "/none.json")[2], 1, true)
    rt:free()
  end)
end)

describe("gateway request body checks", function()
  local rt
  setup(function()
    rt = assert(load('"kind": "EndpointPickerConfig"'))
  end)
  teardown(function()
    rt:free()
  end)

  local function validate(path, body)
    return gateway(rt, "validate", path, body)
  end

  it("returns the model and the stream flag", function()
    assert.same({ "m", true }, validate("/v1/completions",
      '{"model":"m","prompt":["a","b"],"stream":true}'))
    assert.same({ "m", false }, validate("/v1/chat/completions",
      '{"model":"m","messages":[{"role":"user","content":"x"}]}'))
  end)

  it("says what is wrong and which parameter", function()
    local cases = {
      { "/v1/completions", "[1]", "must be a JSON object" },
      { "/v1/completions", " \r\n\t[]", "must be a JSON object" },
      { "/v1/completions", "nope", "not valid JSON" },
      { "/v1/completions", '{"prompt":"x"}', 'missing "model"', "model" },
      { "/v1/completions", '{"model":""}', '"model" must be a non-empty string', "model" },
      { "/v1/completions", '{"model":"m"}', 'missing "prompt"', "prompt" },
      { "/v1/completions", '{"model":"m","prompt":5}', "prompt must be a string", "prompt" },
      { "/v1/completions", '{"model":"m","prompt":"x","n":"2"}', '"n" must be a number', "n" },
      { "/v1/chat/completions", '{"model":"m","messages":[3]}', "messages[0] must be an object",
        "messages" },
    }
    for _, c in ipairs(cases) do
      local r = validate(c[1], c[2])
      assert.equal(S.json.null, r[1])
      assert.matches(c[3], r[2], 1, true)
      if c[4] then
        assert.equal(c[4], r[3])
      end
    end
  end)

  it("hands the decoded body to the request that begins with it, once", function()
    local r = S.eval(rt, [[
      local g = require "lupin.gateway"
      local text = '{"model":"m","prompt":"p"}'
      g.validate("/v1/completions", text)
      local first = g.take_decoded(text)
      g.validate("/v1/completions", text)
      local other = g.take_decoded('{"model":"n","prompt":"p"}')
      return { first = first and first.model, again = g.take_decoded(text) ~= nil,
        other = other == nil, once = g.take_decoded(text) == nil }
    ]])
    assert.same({ first = "m", again = true, other = true, once = true }, r)
  end)

  it("merges model lists, each id once", function()
    local merged = S.json.decode(gateway(rt, "models", {
      '{"object":"list","data":[{"id":"a","object":"model"}]}',
      '{"object":"list","data":[{"id":"a"},{"id":"b"}]}', "not json" })[1])
    assert.equal("list", merged.object)
    assert.equal(2, #merged.data)
    assert.equal("b", merged.data[2].id)
    assert.equal("[]", gateway(rt, "models", {})[1]:match('"data":(%[%])'))
  end)
end)
