-- The EPP's passthrough parser: no body is read or checked, so any format
-- passes, ctx.request.body is false and the prompt empty; the model comes
-- from the modelHeader header, else the config's model, else none.
local S = require "support"
local K = require "plugins.kit"
local cjson = require "cjson"

local T = "passthrough-parser"

local function cfg(params)
  return {
    plugins = { { type = "spec-request-probe" }, { type = "max-score-picker" },
      { type = T, name = "pt", parameters = params } },
    schedulingProfiles = { { name = "d", plugins = { { pluginRef = "max-score-picker" } } } },
    parser = { pluginRef = "pt" },
  }
end

local function run_on(rt, d)
  d.check_body = true
  local req = assert(rt:begin(d))
  local model = req:model()
  local res = req:schedule()
  req:finish("ok")
  return res, model, K.instance(rt, "spec-request-probe", "self.seen")[d.id]
end

local function load_error(params)
  local rt = S.runtime()
  local ok, err = rt:load_string(cjson.encode(cfg(params)), "cfg.json")
  rt:free()
  assert.is_nil(ok, "the config loaded")
  return err
end

describe(T, function()
  it("reads no body: any format passes, the body is false and the prompt empty", function()
    local rt = S.loaded(cfg())
    S.endpoints(rt, 1)
    local res, model, seen = run_on(rt, { id = "p1", path = "/v1/completions", body = "not json" })
    assert.equal(200, res.status)
    assert.is_nil(model)
    assert.same({ model = false, prompt = "", stream = false, body_model = false, body = false },
      seen)
    local _
    res, _, seen = run_on(rt, { id = "p2", path = "/v1/completions",
      body = '{"model":"m","prompt":"never read"}' })
    assert.equal(200, res.status)
    assert.equal("", seen.prompt)
    rt:free()
  end)

  it("modelHeader: x-gateway-model-name by default, or the one named", function()
    local rt = S.loaded(cfg({ model = "cfg-model" }))
    S.endpoints(rt, 1)
    local _, model, seen = run_on(rt, { id = "h1", path = "/v1/completions", body = "x",
      headers = { ["X-Gateway-Model-Name"] = "hdr-model" } })
    assert.equal("hdr-model", model)
    assert.equal("hdr-model", seen.model)
    rt:free()
    rt = S.loaded(cfg({ modelHeader = "X-Model" }))
    S.endpoints(rt, 1)
    _, model = run_on(rt, { id = "h2", path = "/v1/completions", body = "x",
      headers = { ["x-model"] = "mine" } })
    assert.equal("mine", model)
    _, model = run_on(rt, { id = "h3", path = "/v1/completions", body = "x",
      headers = { ["x-gateway-model-name"] = "not this one" } })
    assert.is_nil(model)
    rt:free()
  end)

  it("model: the model when the header is absent", function()
    local rt = S.loaded(cfg({ model = "cfg-model" }))
    S.endpoints(rt, 1)
    local _, model = run_on(rt, { id = "m1", path = "/v1/completions",
      body = '{"model":"body-model","prompt":"x"}' })
    assert.equal("cfg-model", model)
    rt:free()
  end)

  it("refuses parameters of the wrong type and unknown ones", function()
    assert.matches("modelHeader: must be a string", load_error({ modelHeader = 3 }), 1, true)
    assert.matches("model: must be a string", load_error({ model = false }), 1, true)
    assert.matches('unknown parameter "header"', load_error({ header = "x" }), 1, true)
  end)
end)
