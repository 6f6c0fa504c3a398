-- The OpenAI body checks a host asks for at begin (lupin_request_desc
-- .check_body, lua/lupin/openai.lua): decoded once, the model and stream
-- flag known to the host, and a body that fails reaches no plugin and is
-- answered 400 naming the parameter.
local K = require "plugins.kit"
local S = require "support"

local rt
setup(function()
  rt = S.loaded({
    plugins = { { type = "test-observer" }, { type = "test-scorer" }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "d", plugins = { { pluginRef = "test-scorer" },
      { pluginRef = "max-score-picker" } } } },
  })
  S.endpoints(rt, 2)
end)
teardown(function()
  rt:free()
end)

local function begin(path, body)
  return assert(rt:begin({ path = path, body = body, check_body = true }))
end

-- how many requests the observer (admit ... finish) saw to their finish
local function finished()
  return K.instance(rt, "test-observer", [[
    local n = 0
    for _ in pairs(self.finished) do n = n + 1 end
    return { n = n }]]).n
end

describe("check_body", function()
  it("gives the host the model and the stream flag, and plugins the decoded body", function()
    local before = finished()
    local req = begin("/v1/completions", '{"model":"m","prompt":["a","b"],"stream":true}')
    assert.same({ "m", true }, { req:model() })
    local res = req:schedule()
    assert.equal(200, res.status)
    req:finish("ok")
    req = begin("/v1/chat/completions", '{"model":"c","messages":[{"role":"user","content":"x"}]}')
    assert.same({ "c", false }, { req:model() })
    req:schedule()
    req:finish("ok")
    assert.equal(before + 2, finished()) -- valid requests reach the plugins
  end)

  it("leaves the body alone when not asked: no model known, no check", function()
    local req = assert(rt:begin({ path = "/v1/completions", body = "not json" }))
    assert.is_nil((req:model()))
    req:finish("cancelled")
  end)

  it("answers a body that fails with a 400 naming the parameter; no plugin runs", function()
    local cases = {
      { "/v1/completions", "[1]", "must be a JSON object" },
      { "/v1/completions", " \r\n\t[]", "must be a JSON object" },
      { "/v1/completions", "nope", "not valid JSON" },
      { "/v1/completions", "", "not valid JSON" },
      { "/v1/completions", '{"model":"m","prompt":"x","temperature":NaN}', "not valid JSON" },
      { "/v1/completions", '{"model":"m","prompt":"\255"}', "not valid UTF-8 at byte 24 (0xff)" },
      { "/v1/completions", '{"prompt":"x"}', 'missing "model"', "model" },
      { "/v1/completions", '{"model":""}', '"model" must be a non-empty string', "model" },
      { "/v1/completions", '{"model":"m","stream":1,"prompt":"x"}', '"stream" must be true or false',
        "stream" },
      { "/v1/completions", '{"model":"m"}', 'missing "prompt"', "prompt" },
      { "/v1/completions", '{"model":"m","prompt":5}', "prompt must be a string", "prompt" },
      { "/v1/completions", '{"model":"m","prompt":"x","n":"2"}', '"n" must be a number', "n" },
      { "/v1/completions", '{"model":"m","prompt":"x","max_tokens":1e400}',
        '"max_tokens" must be a finite number', "max_tokens" },
      { "/v1/chat/completions", '{"model":"m","messages":[3]}', "messages[0] must be an object",
        "messages" },
    }
    local before = finished()
    for _, c in ipairs(cases) do
      local req = begin(c[1], c[2])
      local res = req:schedule()
      assert.equal(400, res.status, c[2])
      assert.equal("invalid_request", res.outcome)
      assert.matches(c[3], res.message, 1, true)
      assert.equal(c[4], res.param)
      assert.is_nil(res.plugin)
      req:finish("ok")
    end
    assert.equal(before, finished(), "a plugin saw an invalid request")
  end)
end)
