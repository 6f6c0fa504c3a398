-- The EPP's openai-parser, named by the config's parser section (or
-- requestHandler.parsers; among the defaults without either): each body is
-- checked by its route's row at begin (lua/lupin/runtime/openai.lua,
-- spec/core/openai_spec.lua) and decoded once.  The parser section's own
-- errors are here too (requestHandler's: spec/core/parsers_spec.lua).
local S = require "support"
local K = require "plugins.kit"
local cjson = require "cjson"

local T = "openai-parser"

local function cfg(parser, params)
  return {
    plugins = { { type = "spec-request-probe" }, { type = "max-score-picker" },
      { type = T, parameters = params }, { type = "passthrough-parser", name = "pt" } },
    schedulingProfiles = { { name = "d", plugins = { { pluginRef = "max-score-picker" } } } },
    parser = parser,
  }
end

local function load_error(c)
  local rt = S.runtime()
  local ok, err = rt:load_string(cjson.encode(c), "cfg.json")
  rt:free()
  assert.is_nil(ok, "the config loaded")
  return err
end

local function run_on(rt, d)
  d.check_body = true
  local req = assert(rt:begin(d))
  local model = req:model()
  local res = req:schedule()
  req:finish("ok")
  return res, model, K.instance(rt, "spec-request-probe", "self.seen")[d.id]
end

describe(T, function()
  it("checks and decodes bodies, named or by default", function()
    for _, p in ipairs({ { pluginRef = T }, false }) do
      local rt = S.loaded(cfg(p or nil))
      S.endpoints(rt, 1)
      local res = run_on(rt, { id = "bad", path = "/v1/completions", body = "not json" })
      assert.equal(400, res.status)
      local model, seen
      res, model, seen = run_on(rt, { id = "ok", path = "/v1/completions",
        body = '{"model":"m","prompt":"hello"}' })
      assert.equal(200, res.status)
      assert.equal("m", model)
      assert.same({ model = "m", prompt = "hello", stream = false, body_model = "m", body = true },
        seen)
      rt:free()
    end
  end)

  it("takes no parameters", function()
    assert.matches('unknown parameter "strict"; this plugin takes no parameters',
      load_error(cfg({ pluginRef = T }, { strict = true })), 1, true)
  end)

  it("refuses a parser section that names no parser, with file, line and fix", function()
    local cases = {
      { { pluginRef = "nope" }, 'undefined pluginRef "nope"' },
      { { pluginRef = "max-score-picker" }, "is a max-score-picker, not a parser" },
      { { plugin = "pt" }, 'unknown field "plugin" in the parser section' },
      { {}, 'missing "pluginRef"' },
      { "pt", "parser must be an object" },
    }
    for _, c in ipairs(cases) do
      local err = load_error(cfg(c[1]))
      assert.matches("cfg.json:1: parser", err, 1, true)
      assert.matches(c[2], err, 1, true)
    end
  end)

  it("in a profile is ignored with a warning, as upstream's loader takes it", function()
    local c = cfg(nil)
    c.schedulingProfiles[1].plugins[2] = { pluginRef = T }
    local rt = S.loaded(c)
    local warned
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:find('spec.json:1: schedulingProfiles[0].plugins[1]:'
        .. ' plugin "openai-parser" (openai-parser) is a parser', 1, true)
    end
    assert.truthy(warned, "no warning")
    assert.same({ "max-score-picker" },
      S.eval(rt, "return require('lupin.runtime').current.profile_views.d.plugins"))
    S.endpoints(rt, 1)
    local res = run_on(rt, { id = "p", path = "/v1/completions", body = '{"model":"m","prompt":"x"}' })
    assert.equal(200, res.status)
    rt:free()
  end)
end)
