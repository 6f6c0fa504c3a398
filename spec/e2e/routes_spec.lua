-- Every OpenAI-style route vLLM serves, through the real gateway and
-- lupin-sim: proxied, scheduled by the config's plugins, the model read from
-- the body (a form field for audio), a bad body refused with a 400 naming
-- the field, a GET on an unknown route a 404 listing them; the EPP's
-- model-name rewrite and served-endpoint headers, llm-d's header names, the
-- config's parser section and requestHandler.parsers: each path read by the
-- parser claiming it, another POST forwarded by passthrough-parser or
-- refused 400 (lua/lupin/runtime/openai.lua, parsers.lua, gateway/proxy/proxy.c).
local P = require "e2e.procs"
local support = require "support"
local openai = require "lupin.runtime.openai"
local json = P.json

local LONG = ("Retrieval-augmented generation embeds many documents. "):rep(12) -- 12 blocks

local function config(endpoints, extra)
  local cfg = {
    plugins = { { type = "prefix-cache-scorer" }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "prefix-cache-scorer" }, { pluginRef = "max-score-picker" } } } },
    endpoints = endpoints,
    gateway = { explainWithoutToken = 1 },
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local function eps(sim)
  local list = {}
  for i, port in ipairs(sim.ports) do
    list[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
  end
  return list
end

-- A valid body per route, the model it names (nil: vLLM's default, the one served)
local CASES = {
  { "/v1/completions", { model = "m", prompt = "hi", max_tokens = 2 }, "m" },
  { "/v1/chat/completions", { model = "rw", messages = { { role = "user", content = "hi" } },
    max_tokens = 2 }, "rw" },
  { "/v1/embeddings", { model = "m", input = { "a", "b" } }, "m" },
  { "/v1/responses", { model = "rw", input = "hi", instructions = "be brief" }, "rw" },
  { "/v1/messages", { model = "m", max_tokens = 5, system = "be brief",
    messages = { { role = "user", content = "hi" } } }, "m" },
  { "/tokenize", { model = "m", prompt = "hello" }, "m" },
  { "/detokenize", { tokens = { 1, 2, 3 } }, nil },
  { "/pooling", { model = "rw", input = "x" }, "rw" },
  { "/classify", { input = "x" }, nil },
  { "/score", { model = "m", text_1 = "q", text_2 = { "a", "b" } }, "m" },
  { "/v1/score", { queries = "q", documents = { "a" } }, nil },
  { "/rerank", { model = "m", query = "q", documents = { "a", "b" } }, "m" },
  { "/v1/rerank", { query = "q", documents = { "a" } }, nil },
  { "/v2/rerank", { model = "rw", query = "q", documents = { "a" }, top_n = 1 }, "rw" },
}

-- multipart/form-data with curl -F; returns status, headers, body
local function form(gw, path, fields, extra)
  local args = {}
  for _, f in ipairs(fields) do
    args[#args + 1] = "-F " .. P.quote(f)
  end
  return P.curl(("%s %s %s"):format(extra or "", table.concat(args, " "),
    P.quote(gw.base .. path)))
end

local function audio_file()
  local f = os.tmpname()
  local h = assert(io.open(f, "wb"))
  h:write("RIFF\0\0\0\0WAVEfmt \255\254binary") -- not UTF-8, not JSON
  h:close()
  return f
end

local function access_line(gw, id)
  return P.poll(function()
    for l in (P.read(gw.out) or ""):gmatch("[^\n]+") do
      if l:find('"id":"' .. id .. '"', 1, true) then
        return json.decode(l)
      end
    end
  end, "the access-log line of " .. id)
end

describe("routes", function()
  local sim, gw
  setup(function()
    sim = P.sim("--model m --lora rw --instant --seed 7", 2)
    gw = P.gateway(config(eps(sim)))
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("proxies every route vLLM serves: scheduled, the model read from the body", function()
    for i, c in ipairs(CASES) do
      local id = "route-" .. i
      local status, h, body = P.post(gw.base, c[1], c[2], "-H 'x-request-id: " .. id .. "'")
      assert.equal(200, status, c[1] .. ": " .. body)
      local served = h["x-gateway-destination-endpoint"]
      assert.truthy(served, c[1])
      assert.equal(served, h["x-gateway-destination-endpoint-served"], c[1])
      assert.equal(served, h["x-sim-endpoint"], c[1]) -- where it was sent is who answered
      if c[1]:find("completions", 1, true) then
        assert.equal(c[3], json.decode(body).model)
      else
        assert.equal(c[3] or "m", h["x-sim-model"], c[1])
      end
      local line = access_line(gw, id)
      assert.equal(c[1], line.path)
      assert.equal(c[3] or "", line.model, c[1])
      assert.equal(served, line.endpoint)
      assert.is_number(line.scheduling_us)
      assert.equal("ok", line.outcome)
    end
  end)

  it("proxies the audio routes' multipart forms, the model read from the form field", function()
    local f = audio_file()
    for _, path in ipairs({ "/v1/audio/transcriptions", "/v1/audio/translations" }) do
      local status, h, body = form(gw, path, { "model=rw", "file=@" .. f .. ";type=audio/wav",
        "language=en" }, "-H 'x-request-id: audio-" .. path:match("%a+$") .. "'")
      assert.equal(200, status, body)
      assert.equal("rw", h["x-sim-model"])
      assert.is_string(json.decode(body).text)
      assert.equal("rw", access_line(gw, "audio-" .. path:match("%a+$")).model)
    end
    os.remove(f)
  end)

  it("answers the OpenAI Python SDK's embeddings call (base64 floats)", function()
    -- client.embeddings.create(model="m", input="...") sends this request
    local status, h, body = P.post(gw.base, "/v1/embeddings",
      '{"input":"The food was delicious","model":"m","encoding_format":"base64"}',
      "-H 'authorization: Bearer sk-test' -H 'user-agent: OpenAI/Python 1.54.0'"
        .. " -H 'x-stainless-lang: python' -H 'x-stainless-retry-count: 0'"
        .. " -H 'accept: application/json'")
    assert.equal(200, status, body)
    local r = json.decode(body)
    assert.equal("list", r.object)
    assert.equal("m", r.model)
    assert.equal("embedding", r.data[1].object)
    assert.is_string(r.data[1].embedding)
    assert.equal(0, #r.data[1].embedding % 4) -- base64 of float32s
    assert.truthy(h["x-gateway-destination-endpoint"])
  end)

  it("feeds the prefix scorer what each route runs through the model", function()
    -- an embedding's input is prefilled: the same input again scores on the
    -- endpoint that took it; tokenize runs no model and records nothing
    local function totals(path, body)
      local _, h = P.post(gw.base, path, body, "-H 'x-lupin-explain: 1'")
      local t = {}
      for name, v in (h["x-lupin-explain"] or ""):match("totals=([^;]*)"):gmatch("([%w]+):([%d.]+)") do
        t[name] = tonumber(v)
      end
      return t, h["x-gateway-destination-endpoint"]
    end
    local t = totals("/tokenize", { model = "m", prompt = LONG .. "tok" })
    assert.same({ e1 = 0, e2 = 0 }, t)
    t = totals("/tokenize", { model = "m", prompt = LONG .. "tok" })
    assert.same({ e1 = 0, e2 = 0 }, t) -- still nothing recorded
    local _, first = totals("/v1/embeddings", { model = "m", input = LONG })
    local again, second = totals("/v1/embeddings", { model = "m", input = LONG })
    assert.equal(first, second)
    assert.is_true(math.max(again.e1, again.e2) > 0.9)
    assert.equal(0, math.min(again.e1, again.e2))
    -- rerank: the query is the shared prefix of every pair
    _, first = totals("/rerank", { model = "m", query = LONG .. "q", documents = { "a" } })
    again, second = totals("/rerank", { model = "m", query = LONG .. "q", documents = { "b", "c" } })
    assert.equal(first, second)
    assert.is_true(math.max(again.e1, again.e2) > 0.9)
  end)

  it("refuses a bad body with a 400 naming the field, before any endpoint sees it", function()
    local bad = {
      { "/v1/embeddings", { model = "m" }, "input", 'missing "input"' },
      { "/v1/embeddings", { input = "x" }, "model", 'missing "model"' },
      { "/v1/embeddings", { model = "m", input = 5 }, "input", "input must be a string" },
      { "/v1/responses", { model = "m" }, "input", 'missing "input"' },
      { "/v1/messages", { model = "m", messages = { { role = "user", content = "x" } } },
        "max_tokens", 'missing "max_tokens"' },
      { "/v1/messages", { model = "m", max_tokens = 1, messages = "hi" }, "messages",
        '"messages" must be a list' },
      { "/tokenize", { model = "m" }, "prompt", 'missing one of "prompt", "messages"' },
      { "/detokenize", { tokens = { "a" } }, "tokens", "tokens[0] must be an integer" },
      { "/pooling", { model = 3, input = "x" }, "model", '"model" must be a non-empty string' },
      { "/score", { text_1 = "q" }, "text_2", 'missing one of "text_2", "documents", "data_2"' },
      { "/rerank", { query = "q" }, "documents", 'missing "documents"' },
      { "/v2/rerank", { documents = { "a" } }, "query", 'missing "query"' },
      { "/v1/embeddings", "[1]", nil, "must be a JSON object" },
    }
    for i, c in ipairs(bad) do
      local status, _, body = P.post(gw.base, c[1], c[2], "-H 'x-request-id: bad-" .. i .. "'")
      assert.equal(400, status, c[1])
      local e = json.decode(body).error
      assert.matches(c[4], e.message, 1, true)
      assert.equal(c[3] or json.null, e.param, c[1])
      local line = access_line(gw, "bad-" .. i)
      assert.equal("", line.endpoint) -- never sent
      assert.equal("invalid_request", line.outcome)
    end
    local f = audio_file()
    local status, _, body = form(gw, "/v1/audio/transcriptions", { "file=@" .. f })
    assert.equal(400, status)
    assert.equal("model", json.decode(body).error.param)
    status, _, body = form(gw, "/v1/audio/translations", { "model=rw" })
    assert.equal(400, status)
    assert.equal("file", json.decode(body).error.param)
    os.remove(f)
    status, _, body = P.post(gw.base, "/v1/audio/transcriptions", { model = "rw" })
    assert.equal(400, status)
    assert.matches("multipart/form-data", json.decode(body).error.message, 1, true)
  end)

  it("answers an unknown route 404 listing every route, a wrong method 405", function()
    local status, _, body = P.get(gw.base .. "/v1/images/generations")
    assert.equal(404, status)
    local msg = json.decode(body).error.message
    assert.matches("unknown route GET /v1/images/generations", msg, 1, true)
    for _, path in ipairs(openai.paths()) do -- the gateway's table and the runtime's rows agree
      assert.matches(" " .. path .. "[,%s]", msg)
    end
    assert.matches("GET /v1/models", msg, 1, true)
    local h
    status, h = P.get(gw.base .. "/v1/embeddings")
    assert.equal(405, status)
    assert.equal("POST", h["allow"])
  end)

  it("routes by the path without its query, and names a long unknown path cut short", function()
    local status = P.get(gw.base .. "/v1/models?page=2")
    assert.equal(200, status)
    local long = "/v1/" .. ("x"):rep(2000)
    local _, body
    status, _, body = P.get(gw.base .. long .. "?q=1")
    assert.equal(404, status)
    local msg = json.decode(body).error.message
    assert.matches("unknown route GET /v1/xxx", msg, 1, true)
    assert.is_nil(msg:find(("x"):rep(400), 1, true)) -- at most 300 bytes of the path
    assert.is_nil(msg:find("?q=1", 1, true))
  end)
end)

describe("model-name rewrite and llm-d's headers", function()
  local up, sim, gw, gw_sim
  setup(function()
    up = P.upstream("--name A --model m")
    gw = P.gateway(config({ { name = "a", address = "127.0.0.1", port = up.port } }, {
      pluginDirs = { support.FIXTURES },
      plugins = { { type = "prefix-cache-scorer" }, { type = "max-score-picker" },
        { type = "spec-request-probe" } } }))
    sim = P.sim("--model m --lora rw --instant --seed 7", 1)
    gw_sim = P.gateway(config(eps(sim)))
  end)
  teardown(function()
    P.stop(gw)
    P.stop(up)
    P.stop(gw_sim)
    P.stop(sim)
  end)

  it("forwards the body with the rewritten model, every other byte the client's", function()
    local text = '{"model":"m","prompt":"hi","temperature":0.7,"top_p":1e-3,"max_tokens":2}'
    for _, name in ipairs({ "x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite" }) do
      local status, _, body = P.post(gw.base, "/v1/completions", text,
        "-H 'x-request-id: rw-" .. name .. "' -H '" .. name .. ": lora-two'")
      assert.equal(200, status, body)
      local r = json.decode(body)
      assert.equal("lora-two", r.model)
      assert.equal(#text + #"lora-two" - #"m", r.received.body_bytes) -- nothing reformatted
      assert.is_nil(r.received[name]) -- consumed
      assert.equal("lora-two", access_line(gw, "rw-" .. name).model) -- scheduled for it
    end
    -- llm-d's name wins over GIE's older one
    local _, _, body = P.post(gw.base, "/v1/completions", text,
      "-H 'x-llm-d-model-name-rewrite: new' -H 'x-gateway-model-name-rewrite: old'")
    assert.equal("new", json.decode(body).model)
    -- without the header, the body goes as it came
    _, _, body = P.post(gw.base, "/v1/completions", text)
    assert.equal(#text, json.decode(body).received.body_bytes)
    -- the EPP's series: the model asked for, and the one it was sent as
    assert.equal(2, P.metric(gw,
      'inference_objective_request_total{model_name="m",target_model_name="lora-two"}'))
    assert.equal(1, P.metric(gw,
      'inference_objective_request_total{model_name="m",target_model_name="new"}'))
    assert.equal(1, P.metric(gw, 'inference_objective_request_total{model_name="m",target_model_name="m"}'))
    assert.equal(0, P.metric(gw, 'inference_objective_running_requests{model_name="m"}'))
  end)

  it("rewrites the model of every route, a multipart form's field too", function()
    local _, h = P.post(gw_sim.base, "/v1/embeddings", { model = "m", input = "x" },
      "-H 'x-llm-d-model-name-rewrite: rw'")
    assert.equal("rw", h["x-sim-model"])
    local f = audio_file()
    local status
    status, h = form(gw_sim, "/v1/audio/transcriptions", { "model=m", "file=@" .. f },
      "-H 'x-gateway-model-name-rewrite: rw'")
    os.remove(f)
    assert.equal(200, status)
    assert.equal("rw", h["x-sim-model"])
  end)

  it("consumes llm-d's objective and fairness headers, forwards the SLO ones", function()
    local _, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi" },
      "-H 'x-llm-d-inference-objective: -1' -H 'x-llm-d-inference-fairness-id: team-a'"
        .. " -H 'x-gateway-inference-objective: 0' -H 'x-llm-d-slo-ttft-ms: 200'")
    local got = json.decode(body).received
    assert.is_nil(got["x-llm-d-inference-objective"])
    assert.is_nil(got["x-llm-d-inference-fairness-id"])
    assert.is_nil(got["x-gateway-inference-objective"])
    assert.equal("200", got["x-llm-d-slo-ttft-ms"])
  end)

  it("returns x-gateway-destination-endpoint-served, the endpoint that answered", function()
    local _, h = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi" },
      "-H 'x-gateway-destination-endpoint-served: 10.0.0.1:1'") -- a client's is dropped
    assert.equal(up.hostport, h["x-gateway-destination-endpoint-served"])
    assert.equal(up.hostport, h["x-probe-served"]) -- plugins see it among the response headers
  end)
end)

describe("the parser section", function()
  local up, gw
  teardown(function()
    P.stop(gw)
    P.stop(up)
  end)

  it("passthrough-parser: no body checks, the model from a header or the config", function()
    up = P.upstream("--name A --model m")
    gw = P.gateway(config({ { name = "a", address = "127.0.0.1", port = up.port } }, {
      plugins = { { type = "prefix-cache-scorer" }, { type = "max-score-picker" },
        { type = "passthrough-parser", name = "pt", parameters = { model = "fallback-model" } } },
      parser = { pluginRef = "pt" },
    }))
    -- a body the openai parser refuses (no prompt) is forwarded
    local status, _, body = P.post(gw.base, "/v1/completions", '{"model":"m","max_tokens":2}',
      "-H 'x-request-id: pt-1' -H 'x-gateway-model-name: from-header'")
    assert.equal(200, status, body)
    assert.equal("from-header", access_line(gw, "pt-1").model)
    status = P.post(gw.base, "/v1/completions", '{"model":"m","prompt":"x"}',
      "-H 'x-request-id: pt-2'")
    assert.equal(200, status)
    assert.equal("fallback-model", access_line(gw, "pt-2").model)
  end)
end)

describe("requestHandler.parsers", function()
  local up, gw, only
  setup(function()
    up = P.upstream("--name A --model m")
    local eps1 = { { name = "a", address = "127.0.0.1", port = up.port } }
    gw = P.gateway(config(eps1)) -- the defaults: openai, anthropic, vllmhttp, passthrough
    only = P.gateway(config(eps1, { requestHandler = { parsers = {
      { pluginRef = "openai-parser" }, { pluginRef = "anthropic-parser" } } } }))
  end)
  teardown(function()
    P.stop(only)
    P.stop(gw)
    P.stop(up)
  end)

  -- the 400's message; param: the one it must name (nil: none)
  local function refused(param, status, _, body)
    assert.equal(400, status, body)
    local err = json.decode(body).error
    assert.equal("invalid_request_error", err.type)
    assert.equal(param, err.param ~= json.null and err.param or nil)
    return err.message
  end

  it("routes each path to the parser that claims it, the rest to passthrough", function()
    -- openai-parser: /v1/chat/completions checked
    assert.equal(200, (P.post(gw.base, "/v1/chat/completions",
      { model = "m", messages = { { role = "user", content = "hi" } } })))
    refused("messages", P.post(gw.base, "/v1/chat/completions", { model = "m" }))
    -- anthropic-parser: /v1/messages checked (max_tokens is its own need)
    assert.equal(200, (P.post(gw.base, "/v1/messages",
      { model = "m", max_tokens = 2, messages = { { role = "user", content = "hi" } } })))
    refused("max_tokens", P.post(gw.base, "/v1/messages",
      { model = "m", messages = { { role = "user", content = "hi" } } }))
    -- vllmhttp-parser: /tokenize and /inference/v1/generate checked
    assert.equal(200, (P.post(gw.base, "/tokenize", { model = "m", prompt = "hi" })))
    refused("token_ids", P.post(gw.base, "/inference/v1/generate", { model = "m" }))
    assert.equal(200, (P.post(gw.base, "/inference/v1/generate", { model = "m",
      token_ids = { 1, 2 } })))
    -- a suffix claims a prefixed path: still a chat request
    refused("messages", P.post(gw.base, "/openai/v1/chat/completions", { model = "m" }))
    -- passthrough-parser: a path nobody claims is forwarded, its body unread
    local status, _, body = P.post(gw.base, "/v1/custom/thing?x=1", { model = "m", odd = true },
      "-H 'x-request-id: pt-any' -H 'x-gateway-model-name: hdr'")
    assert.equal(200, status, body)
    local line = access_line(gw, "pt-any")
    assert.equal("/v1/custom/thing", line.path)
    assert.equal("hdr", line.model)
  end)

  it("answers a path no listed parser claims 400, naming it and the parsers", function()
    assert.equal(200, (P.post(only.base, "/v1/messages",
      { model = "m", max_tokens = 2, messages = { { role = "user", content = "hi" } } })))
    for _, path in ipairs({ "/tokenize", "/v1/custom/thing" }) do
      local msg = refused(nil, P.post(only.base, path, { model = "m", prompt = "hi" }))
      assert.equal("no parser claims the path " .. path .. ": the configured parsers"
        .. " (requestHandler.parsers) are openai-parser (openai-parser), anthropic-parser"
        .. " (anthropic-parser); add one that claims it, or passthrough-parser last to forward"
        .. " any path unread", msg)
    end
    -- other methods on unknown paths are still the gateway's 404
    assert.equal(404, (P.get(only.base .. "/v1/custom/thing")))
  end)
end)
