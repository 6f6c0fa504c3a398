-- llm-d-router's anthropic-parser: among the default parsers, or listed in
-- requestHandler.parsers, it claims /v1/messages (checked by its row) and
-- /v1/messages/count_tokens (forwarded as sent); other paths are not its.
-- Which parser reads which path: spec/core/parsers_spec.lua.
local S = require "support"
local cjson = require "cjson"

local T = "anthropic-parser"

local function cfg(params)
  return {
    plugins = { { type = "max-score-picker" }, { type = T, name = "claude", parameters = params } },
    schedulingProfiles = { { name = "d", plugins = { { pluginRef = "max-score-picker" } } } },
    requestHandler = { parsers = { { pluginRef = "claude" } } },
  }
end

local function status_of(rt, path, body)
  local req = assert(rt:begin({ path = path, body = body, check_body = true }))
  local res = req:schedule()
  req:finish("ok")
  return res.status, res.message
end

describe(T, function()
  it("checks /v1/messages, forwards count_tokens as sent, claims nothing else", function()
    local rt = S.loaded(cfg())
    S.endpoints(rt, 1)
    assert.equal(200, (status_of(rt, "/v1/messages",
      '{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]}')))
    local status, msg = status_of(rt, "/v1/messages", '{"model":"m","messages":[]}')
    assert.equal(400, status)
    assert.matches('missing "max_tokens"', msg, 1, true)
    assert.equal(200, (status_of(rt, "/v1/messages/count_tokens", "anything")))
    status, msg = status_of(rt, "/v1/completions", '{"model":"m","prompt":"x"}')
    assert.equal(400, status)
    assert.matches("no parser claims the path /v1/completions", msg, 1, true)
    rt:free()
  end)

  it("takes no parameters", function()
    local rt = S.runtime()
    local ok, err = rt:load_string(cjson.encode(cfg({ strict = true })), "cfg.json")
    rt:free()
    assert.is_nil(ok)
    assert.matches('unknown parameter "strict"; this plugin takes no parameters', err, 1, true)
  end)
end)
