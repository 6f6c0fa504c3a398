-- llm-d-router's vllmhttp-parser: among the default parsers, or listed in
-- requestHandler.parsers, it claims vLLM's own routes: upstream's
-- /inference/v1/generate (token_ids required) and lupin's /tokenize,
-- /detokenize, /pooling, /classify, /score, /rerank forms; OpenAI's are not
-- its.  Which parser reads which path: spec/core/parsers_spec.lua.
local S = require "support"
local cjson = require "cjson"

local T = "vllmhttp-parser"

local function cfg(params)
  return {
    plugins = { { type = "max-score-picker" }, { type = T, parameters = params } },
    schedulingProfiles = { { name = "d", plugins = { { pluginRef = "max-score-picker" } } } },
    requestHandler = { parsers = { { pluginRef = T } } },
  }
end

local function status_of(rt, path, body)
  local req = assert(rt:begin({ path = path, body = body, check_body = true }))
  local res = req:schedule()
  req:finish("ok")
  return res.status, res.message
end

describe(T, function()
  it("checks generate and vLLM's routes, claims no OpenAI route", function()
    local rt = S.loaded(cfg())
    S.endpoints(rt, 1)
    assert.equal(200, (status_of(rt, "/inference/v1/generate", '{"token_ids":[1,2,3]}')))
    local status, msg = status_of(rt, "/inference/v1/generate", '{"token_ids":["a"]}')
    assert.equal(400, status)
    assert.matches("token_ids[0] must be an integer token id", msg, 1, true)
    for path, body in pairs({ ["/tokenize"] = '{"prompt":"x"}', ["/detokenize"] = '{"tokens":[1]}',
      ["/pooling"] = '{"input":"x"}', ["/classify"] = '{"input":"x"}',
      ["/v1/score"] = '{"text_1":"q","text_2":["a"]}',
      ["/v2/rerank"] = '{"query":"q","documents":["a"]}' }) do
      assert.equal(200, (status_of(rt, path, body)), path)
    end
    status, msg = status_of(rt, "/v1/chat/completions",
      '{"model":"m","messages":[{"role":"user","content":"x"}]}')
    assert.equal(400, status)
    assert.matches("no parser claims the path /v1/chat/completions: the configured parsers"
      .. " (requestHandler.parsers) are vllmhttp-parser (vllmhttp-parser)", msg, 1, true)
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
