-- Numbers and JSON (issue 12): config numbers must be finite, in a host's
-- section too, and request bodies must be RFC 8259 JSON.  Unit level:
-- lupin.config and lupin.openai as the runtime uses them (the e2e side is
-- spec/e2e/hardening_spec.lua).
local config = require "lupin.config"
local openai = require "lupin.runtime.openai"
local S = require "support"

-- a host's section, as lupin serve declares "gateway" (gateway/settings.c);
-- undeclared after this file: the module is shared by the specs' process
setup(function()
  assert(config.declare_section("host", {
    { name = "maxBodyBytes", default = 16 * 1024 * 1024, min = 1 },
    { name = "maxRequestsInFlight", default = 1024, min = 1 },
  }))
end)
teardown(function()
  config.sections.host = nil
end)

local function cfg(weight, extra)
  return '{\n"plugins": [{"type": "queue-scorer"}],\n"schedulingProfiles": [{"name": "d",\n'
    .. '"plugins": [{"pluginRef": "queue-scorer",\n"weight": ' .. weight .. '}]}]' .. (extra or "")
    .. "\n}"
end

describe("config numbers", function()
  for _, case in ipairs({
    { "Infinity", "got Infinity (or a number too large for a double)" },
    { "-Infinity", "got -Infinity" },
    { "1e309", "got Infinity (or a number too large for a double)" },
    { "-1e400", "got -Infinity" },
    { "NaN", "got NaN" },
  }) do
    it(("refuses %s with file:line: path"):format(case[1]), function()
      local c, err = config.parse(cfg(case[1]), "cfg.json")
      assert.is_nil(c)
      assert.equal("cfg.json:5: schedulingProfiles[0].plugins[0].weight: numbers must be finite, "
        .. case[2], err)
    end)
  end

  it("refuses them anywhere: plugin parameters, a host's section", function()
    local _, err = config.parse('{"plugins": [{"type": "q", "parameters":\n{"x": [1, 2,\nNaN]}}]}',
      "p.json")
    assert.equal("p.json:3: plugins[0].parameters.x[2]: numbers must be finite, got NaN", err)
    _, err = config.parse('{\n"host": {"maxBodyBytes":\n1e999}}', "g.json")
    assert.matches("^g.json:3: host.maxBodyBytes: numbers must be finite", err)
  end)

  it("refuses hex numbers as invalid JSON, with the line", function()
    local _, err = config.parse(cfg("0x10"), "cfg.json")
    assert.matches("^cfg.json:5: invalid JSON: Expected value but found invalid number", err)
  end)

  it("takes finite numbers, big and small", function()
    local c = assert(config.parse(cfg("1e308", ',\n"host": {"maxBodyBytes": 1e6}'), "cfg.json"))
    assert.equal(1e308, c.profiles[1].refs[1].weight)
    assert.equal(1e6, c.sections.host.maxBodyBytes)
  end)

  it("checks an endpoints file the same way", function()
    local dir = S.tmpdir()
    local file = S.write(dir .. "/eps.json",
      '[{"name": "a", "address": "127.0.0.1",\n"port": Infinity}]')
    local list, err = config.endpoints_file(file)
    os.execute("rm -rf " .. dir)
    assert.is_nil(list)
    assert.equal(file .. ":2: [0].port: numbers must be finite, got Infinity (or a number too large "
      .. "for a double)", err)
  end)

  it("gives a host's settings their defaults, checked like the rest", function()
    local c = assert(config.parse(cfg("1"), "cfg.json"))
    assert.equal(1024, c.sections.host.maxRequestsInFlight)
    local _, err = config.parse(cfg("1", ',\n"host": {"maxRequestsInFlight": 0}'), "cfg.json")
    assert.equal("cfg.json:6: host.maxRequestsInFlight: maxRequestsInFlight must be an "
      .. "integer ≥ 1, got 0", err)
  end)
end)

describe("request bodies", function()
  local function refused(text)
    local body, msg, param = openai.check("/v1/completions", text)
    assert.is_nil(body)
    return msg, param
  end

  for _, case in ipairs({
    { '{"model":"m","prompt":"x","temperature":NaN}', "invalid token at character 41" },
    { '{"model":"m","prompt":"x","temperature":nan}', "invalid token at character 41" },
    { '{"model":"m","prompt":"x","top_p":Infinity}', "invalid token at character 35" },
    { '{"model":"m","prompt":"x","top_p":-Infinity}', "invalid number at character 35" },
    { '{"model":"m","prompt":"x","n":0x2}', "invalid number at character 31" },
    { '{"model":"m","prompt":"x","n":[1,2,NaN]}', "invalid token at character 36" },
  }) do
    it(("refuse %s as not RFC 8259 JSON, naming the position"):format(case[1]), function()
      local msg = refused(case[1])
      assert.equal("the request body is not valid JSON (RFC 8259): Expected value but found "
        .. case[2], msg)
    end)
  end

  it("refuse numeric fields that overflow to infinity", function()
    local msg, param = refused('{"model":"m","prompt":"x","max_tokens":1e400}')
    assert.equal('"max_tokens" must be a finite number, got inf', msg)
    assert.equal("max_tokens", param)
  end)

  it("take strict JSON", function()
    assert.equal("m", openai.check("/v1/completions",
      '{"model":"m","prompt":"x","temperature":1e-3,"max_tokens":1E2,"top_p":-0.0}').model)
  end)
end)
