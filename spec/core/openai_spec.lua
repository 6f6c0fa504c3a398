-- The OpenAI body checks a host asks for at begin (lupin_request_desc
-- .check_body, lua/lupin/runtime/openai.lua): decoded once, the model and stream
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

  it("keeps no Lua copy of a checked body, only its values and its size", function()
    local text = '{"model":"m","prompt":"' .. ("x"):rep(1000) .. '"}'
    local seen = function(id)
      return S.eval(rt, ([[local out = {}
        require("lupin.runtime.leaks").each_live(function(r)
          if r.id == %q then
            local v = r.request
            out = { raw = rawget(v, "raw_body") or false, bytes = rawget(v, "body_bytes"),
              prompt = #v.prompt }
          end
        end)
        return out]]):format(id))
    end
    local req = assert(rt:begin({ id = "copy-0", path = "/v1/completions", body = text,
      check_body = true }))
    assert.same({ raw = false, bytes = #text, prompt = 1000 }, seen("copy-0"))
    req:finish("ok")
    -- a body decoded on first use is kept until then
    req = assert(rt:begin({ id = "copy-1", path = "/v1/completions", body = text }))
    assert.same({ raw = text, bytes = #text, prompt = 1000 }, seen("copy-1"))
    req:finish("ok")
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
      -- not UTF-8 and not JSON either: the UTF-8 refusal, as it is the first
      { "/v1/completions", '{"model":"m","prompt":"\226\130', "not valid UTF-8 at byte 24 (0xe2)" },
      { "/v1/completions", '{"model":"m","prompt":"x"} \237\160\128', "not valid UTF-8 at byte 28 (0xed)" },
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
      -- what the fast decoder refuses is read again from the host's bytes
      { "/v1/completions", " \r\n\t[1]", "must be a JSON object" },
      { "/v1/completions", "nope", "not valid JSON" },
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

-- The route table (lua/lupin/runtime/openai.lua ROUTES): one row per API path vLLM
-- serves, each with its required fields, whether the model is required, and
-- the text it feeds ctx.request.prompt.
describe("the route table", function()
  local openai = require "lupin.runtime.openai"
  local cjson = require "cjson"

  -- a valid body per route, and the prompt it feeds the prefix scorer
  local VALID = {
    ["/v1/completions"] = { { model = "m", prompt = { "a", "b" } }, "a b" },
    ["/v1/chat/completions"] = { { model = "m", messages = { { role = "user", content = "x" } } },
      '[{"content":"x","role":"user"}]' },
    ["/v1/embeddings"] = { { model = "m", input = { "doc one", "doc two" } }, "doc one doc two" },
    ["/v1/responses"] = { { model = "m", instructions = "sys. ", input = "hi" }, "sys. hi" },
    ["/v1/messages"] = { { model = "m", max_tokens = 3, system = "sys",
      messages = { { role = "user", content = "x" } } }, 'sys[{"content":"x","role":"user"}]' },
    ["/tokenize"] = { { prompt = "count me" }, "" },
    ["/detokenize"] = { { tokens = { 1, 2 } }, "" },
    ["/pooling"] = { { input = "pool me" }, "pool me" },
    ["/classify"] = { { model = "m", input = { "c1" } }, "c1" },
    ["/score"] = { { text_1 = "the query", text_2 = { "a" } }, "the query" },
    ["/v1/score"] = { { queries = "q2", documents = { "a" } }, "q2" },
    ["/rerank"] = { { query = "rq", documents = { "a", "b" } }, "rq" },
    ["/v1/rerank"] = { { query = "rq", documents = { "a" } }, "rq" },
    ["/v2/rerank"] = { { model = "m", query = { "rq" }, documents = { "a" } }, "rq" },
    ["/v1/completions/render"] = { { model = "m", prompt = "r" }, "r" },
    ["/v1/chat/completions/render"] = { { model = "m", messages = { { role = "user",
      content = "r" } } }, '[{"content":"r","role":"user"}]' },
    ["/v1/messages/count_tokens"] = { { model = "m", messages = { { role = "user",
      content = "x" } } }, "" },
    ["/inference/v1/generate"] = { { token_ids = { 7, 8 }, sampling_params = { max_tokens = 2 } },
      "7 8" },
  }

  it("feeds the same prompt whatever order a message's keys come in", function()
    local a = openai.check("/v1/chat/completions",
      '{"model":"m","messages":[{"role":"system","content":"s","name":"n"},{"content":"q","role":"user"}]}')
    local b = openai.check("/v1/chat/completions",
      '{"messages":[{"name":"n","content":"s","role":"system"},{"role":"user","content":"q"}],"model":"m"}')
    assert.equal(openai.prompt("/v1/chat/completions", a), openai.prompt("/v1/chat/completions", b))
    assert.equal('[{"content":"s","name":"n","role":"system"},{"content":"q","role":"user"}]',
      openai.prompt("/v1/chat/completions", b))
  end)

  it("has a row for every route vLLM serves, each with a spec here", function()
    local paths = openai.paths()
    for _, p in ipairs(paths) do
      assert.truthy(VALID[p] or p:find("^/v1/audio/"), "no valid body for " .. p)
    end
    for p in pairs(VALID) do
      assert.truthy(openai.ROUTES[p], p)
    end
    assert.equal(20, #paths)
  end)

  it("reads a prefixed path by the row of the longest suffix it ends with", function()
    assert.equal(openai.ROUTES["/v1/chat/completions"], openai.route("/openai/v1/chat/completions"))
    assert.equal(openai.ROUTES["/v1/chat/completions"],
      openai.route("/x/v1/chat/completions/render/"))
    assert.equal(openai.ROUTES["/v1/messages"], openai.route("/anthropic/v1/messages"))
    assert.equal(openai.ROUTES["/rerank"], openai.route("/api/rerank"))
    assert.equal(openai.ROUTES["/v1/completions"], openai.route("/nothing/known"))
    local _, msg, param = openai.check("/proxy/v1/chat/completions", '{"model":"m"}')
    assert.equal("messages", param, msg)
  end)

  it("is the list a host serves, through lupin_runtime_routes", function()
    local own = S.runtime()
    local routes = own:routes()
    own:free()
    assert.same(openai.paths(), routes)
    assert.equal("/classify", routes[1])
  end)

  for path, c in pairs(VALID) do
    it(path .. ": a valid body passes and feeds its prompt", function()
      local body, msg = openai.check(path, cjson.encode(c[1]))
      assert.is_table(body, msg)
      assert.equal(c[2], openai.prompt(path, body))
    end)

    local row = openai.ROUTES[path]
    it(path .. ": each required field missing is a 400 naming it", function()
      for _, need in ipairs(row.need) do
        local names = type(need[1]) == "table" and need[1] or { need[1] }
        local b = cjson.decode(cjson.encode(c[1]))
        for _, n in ipairs(names) do
          b[n] = nil
        end
        local ok, msg, param = openai.check(path, cjson.encode(b))
        assert.is_nil(ok)
        assert.equal(names[1], param)
        assert.matches("missing", msg, 1, true)
      end
      local b = cjson.decode(cjson.encode(c[1]))
      b.model = nil
      local ok, _, param = openai.check(path, cjson.encode(b))
      if row.model then -- the model is required where OpenAI requires it
        assert.equal("model", param)
      else -- optional where vLLM serves its one model by default
        assert.is_table(ok)
      end
    end)
  end

  it("checks the types of what a route needs, naming the field", function()
    local cases = {
      { "/v1/embeddings", { model = "m", input = 3 }, "input", "input must be a string" },
      { "/v1/embeddings", { model = "m", input = { true } }, "input", "input[0] must be a string" },
      { "/v1/responses", { model = "m", input = 3 }, "input", '"input" must be a string or a list' },
      { "/v1/messages", { model = "m", messages = {}, max_tokens = 1.5 }, "max_tokens",
        '"max_tokens" must be an integer' },
      { "/detokenize", { tokens = "12" }, "tokens", '"tokens" must be a list of token ids' },
      { "/detokenize", { tokens = { 1.5 } }, "tokens", "tokens[0] must be an integer token id" },
      { "/rerank", { query = 1, documents = {} }, "query", '"query" must be a string or a list' },
      { "/tokenize", { messages = "hi" }, "messages", '"messages" must be a list' },
      { "/pooling", { model = "", input = "x" }, "model", '"model" must be a non-empty string' },
      { "/v1/responses", { model = "m", input = "x", max_output_tokens = "9" },
        "max_output_tokens", '"max_output_tokens" must be a number' },
    }
    for _, c in ipairs(cases) do
      local ok, msg, param = openai.check(c[1], cjson.encode(c[2]))
      assert.is_nil(ok, c[1])
      assert.equal(c[3], param, c[1])
      assert.matches(c[4], msg, 1, true)
    end
  end)

  it("reads a path no row names as a completion (the EPP's parser does too)", function()
    assert.is_nil((openai.check("/v1/other", '{"model":"m"}')))
    assert.is_table(openai.check("/v1/other", '{"model":"m","prompt":"x"}'))
  end)

  describe("multipart forms (the audio routes)", function()
    local CT = "multipart/form-data; boundary=XyZ"
    local function form(parts, boundary)
      boundary = boundary or "XyZ"
      local out = {}
      for _, p in ipairs(parts) do
        local file = p[3] and ('; filename="%s"'):format(p[3]) or ""
        out[#out + 1] = ('--%s\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n'):format(
          boundary, p[1], file, p[2])
      end
      return table.concat(out) .. "--" .. boundary .. "--\r\n"
    end

    it("reads the model and stream fields; the file is binary and need not be UTF-8", function()
      local text = form({ { "model", "whisper" }, { "file", "\255\0\254binary", "a.wav" },
        { "stream", "true" } })
      local body = openai.check("/v1/audio/transcriptions", text, CT)
      assert.equal("whisper", body.model)
      assert.is_true(body.stream)
      assert.same({ filename = "a.wav", size = 9 }, body.file)
      assert.equal("", openai.prompt("/v1/audio/transcriptions", body))
      body = openai.check("/v1/audio/translations", form({ { "model", "w" }, { "file", "x", "f" } },
        "b-1"), 'multipart/form-data; boundary="b-1"')
      assert.equal("w", body.model)
    end)

    it("refuses what is not a form, a form without model or file, a bad stream", function()
      local cases = {
        { form({ { "model", "w" }, { "file", "x", "f" } }), "application/json", nil,
          "multipart/form-data" },
        { form({ { "model", "w" }, { "file", "x", "f" } }), nil, nil, "got content-type none" },
        { form({ { "file", "x", "f" } }), CT, "model", 'missing "model"' },
        { form({ { "model", "w" } }), CT, "file", 'missing "file"' },
        { form({ { "model", "" }, { "file", "x", "f" } }), CT, "model", "non-empty" },
        { form({ { "model", "w" }, { "file", "x", "f" }, { "stream", "yes" } }), CT, "stream",
          '"stream" must be true or false' },
        { "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nw", CT, nil,
          "ends inside a part" },
        { "no parts", CT, nil, "holds no part" },
      }
      for i, c in ipairs(cases) do
        local ok, msg, param = openai.check("/v1/audio/transcriptions", c[1], c[2])
        assert.is_nil(ok, i)
        assert.equal(c[3], param, i)
        assert.matches(c[4], msg, 1, true)
      end
    end)
  end)
end)

describe("routes through the runtime", function()
  local K2 = require "plugins.kit"
  local rt2
  setup(function()
    rt2 = S.loaded({
      plugins = { { type = "spec-request-probe" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "d", plugins = { { pluginRef = "max-score-picker" } } } },
    })
    S.endpoints(rt2, 2)
  end)
  teardown(function()
    rt2:free()
  end)

  local function run(d)
    d.check_body = true
    local req = assert(rt2:begin(d))
    local model = req:model()
    local res = req:schedule()
    req:finish("ok")
    return res, model, K2.instance(rt2, "spec-request-probe", "self.seen")[d.id]
  end

  it("schedules each route with its model and prompt as plugins see them", function()
    local res, model, seen = run({ id = "e1", path = "/v1/embeddings",
      body = '{"model":"emb","input":["x","y"]}' })
    assert.equal(200, res.status)
    assert.equal("emb", model)
    assert.same({ model = "emb", prompt = "x y", stream = false, body_model = "emb", body = true },
      seen)
    res, model, seen = run({ id = "r1", path = "/rerank", body = '{"query":"q","documents":["a"]}' })
    assert.equal(200, res.status)
    assert.is_nil(model) -- vLLM's default model: none named
    assert.equal("q", seen.prompt)
  end)

  it("takes the model-name rewrite (llm-d's name first) as the model scheduled for", function()
    local _, model, seen = run({ id = "w1", path = "/v1/completions",
      body = '{"model":"base","prompt":"x"}',
      headers = { ["x-gateway-model-name-rewrite"] = "lora-a" } })
    assert.equal("lora-a", model)
    assert.same({ "lora-a", "lora-a" }, { seen.model, seen.body_model })
    _, model = run({ id = "w2", path = "/v1/completions", body = '{"model":"base","prompt":"x"}',
      headers = { ["x-llm-d-model-name-rewrite"] = "new", ["x-gateway-model-name-rewrite"] = "old" } })
    assert.equal("new", model)
    _, model = run({ id = "w3", path = "/v1/completions", body = '{"model":"base","prompt":"x"}',
      headers = { ["x-llm-d-model-name-rewrite"] = "" } })
    assert.equal("base", model) -- empty: no rewrite
    local res = run({ id = "w4", path = "/v1/completions", body = '{"prompt":"x"}',
      headers = { ["x-llm-d-model-name-rewrite"] = "m" } })
    assert.equal(400, res.status) -- the body is still checked
    assert.equal("model", res.param)
  end)

  it("reads a multipart form's model through the request's content-type", function()
    local text = '--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
      .. '--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n\255\r\n--b--\r\n'
    local res, model, seen = run({ id = "a1", path = "/v1/audio/transcriptions", body = text,
      headers = { ["Content-Type"] = "multipart/form-data; boundary=b" } })
    assert.equal(200, res.status)
    assert.equal("whisper", model)
    assert.equal("", seen.prompt)
  end)
end)
