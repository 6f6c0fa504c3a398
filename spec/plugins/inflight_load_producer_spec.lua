-- inflight-load-producer: llm-d-router's
-- pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload vectors
-- (token_estimator_test.go, producer_test.go), a token being 4 characters.
local K = require "plugins.kit"
local S = require "support"

local T = "inflight-load-producer"
local TLS = "token-load-scorer"

-- The producer's exported estimate functions, called in the runtime.
local function call(rt, fn, ...)
  return S.eval(rt, ([[
    local m = require("lupin.generation.loader").load(%q, %q)
    local a = require("cjson").decode(%q)
    local r = m[%q](unpack(a.args, 1, a.n))
    return r == nil and "nil" or r
  ]]):format(S.ROOT .. "/plugins/" .. T .. ".lua", T, S.json.encode({ n = select("#", ...), args = { ... } }),
    fn))
end

local function output(rt, input, ratio, client, operator)
  return S.eval(rt, ([[
    local m = require("lupin.generation.loader").load(%q, %q)
    return m.output_tokens(%s, %s, %s, %s)
  ]]):format(S.ROOT .. "/plugins/" .. T .. ".lua", T, input, ratio, tostring(client),
    tostring(operator)))
end

-- The tokens (4 characters each) of prompt n tokens long.
local function prompt(n, c)
  return (c or "x"):rep(4 * n)
end

local function tokens(rt)
  return S.in_flight(rt, "in_flight_tokens")
end

-- A config: the producer, a header-based-testing-filter and max-score-picker
-- in one profile; extra plugins before them.
local function runtime(params, extra, n)
  local plugins, refs = {}, {}
  for _, p in ipairs(extra or {}) do
    plugins[#plugins + 1] = p
  end
  plugins[#plugins + 1] = { type = T, parameters = params }
  plugins[#plugins + 1] = { type = "header-based-testing-filter" }
  plugins[#plugins + 1] = { type = "max-score-picker" }
  refs[1] = { pluginRef = "header-based-testing-filter" }
  refs[2] = { pluginRef = "max-score-picker" }
  local rt = S.loaded(K.config(plugins, refs))
  S.endpoints(rt, n or 3)
  return rt
end

local function send(rt, target, body, path)
  local req = assert(rt:begin({ path = path or "/v1/completions", body = S.json.encode(body),
    headers = { ["test-epp-endpoint-selection"] = target } }))
  local res = req:schedule()
  assert.equal(200, res.status)
  return req
end

-- A P/D config: profiles prefill and decode (kit-pd-profiles), each keeping
-- the endpoints of its role, or all of them when same.
local function pd(params, same)
  local function refs(r)
    return { { pluginRef = same and "max-score-picker" or r .. "-filter" } }
  end
  local rt = S.loaded({
    plugins = { { type = "kit-pd-profiles" }, { type = T, parameters = params },
      { type = "spec-role-filter", name = "prefill-filter", parameters = { role = "prefill" } },
      { type = "spec-role-filter", name = "decode-filter", parameters = { role = "decode" } },
      { type = "max-score-picker" } },
    schedulingProfiles = {
      { name = "prefill", plugins = refs("prefill") },
      { name = "decode", plugins = refs("decode") },
    },
  })
  if same then
    S.endpoints(rt, 1)
  else
    S.endpoints(rt, 2, { { labels = { ["llm-d.ai/role"] = "prefill" } },
      { labels = { ["llm-d.ai/role"] = "decode" } } })
  end
  return rt
end

local function begin_pd(rt, body)
  local req = assert(rt:begin({ path = "/v1/completions", body = S.json.encode(body) }))
  assert.equal(200, req:schedule().status)
  return req
end

describe(T, function()
  -- token_estimator_test.go, TestSimpleTokenEstimator_EstimateOutput
  it("estimates output as round(input × ratio), capped by the client and the operator", function()
    local rt = S.runtime()
    local cases = {
      { 2.0, nil, 0, nil, 0 }, -- zero input
      { 2.0, nil, -5, nil, 0 }, -- negative input
      { 2.0, nil, 8, nil, 16 }, -- no caps
      { 0.0, nil, 100, nil, 0 }, -- zero ratio
      { 1.5, nil, 100, 50, 50 }, -- client cap binds
      { 1.5, nil, 100, 500, 150 }, -- client cap looser
      { 1.5, nil, 100, 0, 0 }, -- client cap zero binds
      { 1.5, nil, 100, -10, 150 }, -- negative client cap ignored
      { 1.5, 40, 100, nil, 40 }, -- operator cap binds
      { 1.5, 80, 100, 30, 30 }, -- both, client tighter
      { 1.5, 30, 100, 80, 30 }, -- both, operator tighter
      { 1.5, 500, 100, 500, 150 }, -- both, estimate tightest
      { 1.5, nil, 1, nil, 2 }, -- round half up: 1.5 → 2
    }
    for i, c in ipairs(cases) do
      local ratio, operator, input, client, want = c[1], c[2], c[3], c[4], c[5]
      assert.equal(want, output(rt, input, ratio, client, operator), "case " .. i)
    end
  end)

  -- TestSimpleTokenEstimator_EstimateInput: tokens are ceil(characters / 4)
  it("counts ceil(prompt characters / 4) input tokens", function()
    local rt = S.runtime()
    assert.equal(0, call(rt, "input_tokens", { prompt = "" }))
    assert.equal(7, call(rt, "input_tokens", { prompt = prompt(7) }))
    assert.equal(7, call(rt, "input_tokens", { prompt = ("x"):rep(25) }))
    assert.equal(1, call(rt, "input_tokens", { prompt = "x" }))
  end)

  -- upstream's openai parser: chat reads max_completion_tokens then
  -- max_tokens, completions max_tokens, responses max_output_tokens; a
  -- negative or fractional value is skipped for the next name
  it("reads the client's output cap where each route carries it", function()
    local rt = S.runtime()
    local function cap(path, body)
      return call(rt, "client_cap", { path = path, body = body })
    end
    assert.equal(5, cap("/v1/chat/completions", { max_completion_tokens = 5, max_tokens = 9 }))
    assert.equal(9, cap("/v1/chat/completions", { max_tokens = 9 }))
    assert.equal(9, cap("/v1/chat/completions", { max_completion_tokens = -1, max_tokens = 9 }))
    assert.equal(9, cap("/v1/chat/completions", { max_completion_tokens = 2.5, max_tokens = 9 }))
    assert.equal(0, cap("/v1/completions", { max_tokens = 0 }))
    assert.equal("nil", cap("/v1/completions", { max_completion_tokens = 9 }))
    assert.equal("nil", cap("/v1/completions", { max_tokens = "9" }))
    assert.equal(4, cap("/v1/responses", { max_output_tokens = 4, max_tokens = 1 }))
    assert.equal("nil", cap("/v1/embeddings", { max_tokens = 4 }))
    assert.equal("nil", cap("/v1/completions", false))
  end)

  -- TestUncachedInputTokens_Overestimate and the PrefixCacheDiscount cases:
  -- NewPrefixCacheMatchInfo(match, total, 4 tokens a block = 16 characters)
  it("counts the input less the blocks cached on the endpoint, plus the tail past them", function()
    local rt = S.runtime()
    local function left(input, match, total)
      return S.eval(rt, ([[
        local m = require("lupin.generation.loader").load(%q, %q)
        local info = { block_size = 16, total = %d, matches = { [7] = %d } }
        return m.uncached(%d, info, { id = 7 })
      ]]):format(S.ROOT .. "/plugins/" .. T .. ".lua", T, total, match, input))
    end
    assert.equal(4, left(5, 1, 2)) -- the index's 8 - 4 over the smaller estimate of 5
    assert.equal(4, left(8, 1, 2))
    assert.equal(0, left(8, 2, 2)) -- fully cached
    assert.equal(8, left(8, 0, 2)) -- none cached
    assert.equal(4 + 12, left(20, 1, 2)) -- 12 tokens past the indexed 8
    assert.equal(9, call(rt, "uncached", 9, false, { id = 7 })) -- no matches: all of it
  end)

  -- producer_test.go TestInFlightLoadProducer_Produce and _Lifecycle, with
  -- addEstimatedOutputTokens (newTestProducer): 4 input + 6 output = 10
  it("publishes each candidate's tokens and holds them on the pick until the end", function()
    local rt = runtime({ addEstimatedOutputTokens = true })
    local req = send(rt, "ep2", { model = "m", prompt = prompt(4) })
    assert.same({ ep2 = 10 }, tokens(rt))
    assert.same({ ep2 = 1 }, S.in_flight(rt))
    local pub = K.instance(rt, T, ([[
      local eps = require("lupin.runtime.pool").list
      local ctx = { request = { prompt = %q, path = "/v1/completions", body = {} }, shared = {} }
      self:prepare(ctx, eps)
      local p = ctx.shared[self.name]
      return { input = p.input, output = p.output, ep1 = p.tokens[eps[1].id],
        ep3 = p.tokens[eps[3].id] }]]):format(prompt(4)))
    assert.same({ input = 4, output = 6, ep1 = 10, ep3 = 10 }, pub)
    req:finish("ok")
    assert.same({}, tokens(rt))
    assert.same({}, S.in_flight(rt))
  end)

  it("is what token-load-scorer adds for the request it scores", function()
    local rt = S.loaded(K.config({ { type = T, parameters = { addEstimatedOutputTokens = true } },
      { type = TLS, parameters = { queueThresholdTokens = 100 } },
      { type = "header-based-testing-filter" } },
      { { pluginRef = "header-based-testing-filter" }, { pluginRef = TLS } }))
    S.endpoints(rt, 2)
    local held = send(rt, "ep1", { model = "m", prompt = prompt(4), max_tokens = 500 })
    assert.same({ ep1 = 10 }, tokens(rt)) -- the producer's 4 + 6, not the scorer's 4 + 500
    -- the next request, 8 + 12 tokens: ep1 (10 + 20)/100 → 0.7, ep2 0.8
    local out = S.eval(rt, ([[
      local rt = require("lupin.runtime")
      local gen = rt.current
      local eps = require("lupin.runtime.pool").list
      local shared = {}
      local ctx = { request = { prompt = %q, path = "/v1/completions", body = {} },
        shared = shared }
      gen.by_name[%q].obj:prepare(ctx, eps)
      local out = {}
      for i, s in ipairs(gen.by_name[%q].obj:score(ctx, eps)) do
        out[i] = ("%%.17g"):format(s)
      end
      return out]]):format(prompt(8), T, TLS))
    assert.same({ "0.69999999999999996", "0.80000000000000004" }, out)
    held:finish("cancelled")
    assert.same({}, tokens(rt))
  end)

  -- TestInFlightLoadProducer_ExcludeOutputTokens_StartOfStreamRelease: the
  -- default counts input only, released at the first chunk; the request
  -- stays in flight (the core's count) to the end
  it("counts input only by default and releases it at the first streamed byte", function()
    local rt = runtime(nil)
    local req = send(rt, "ep1", { model = "m", prompt = prompt(4), max_tokens = 100,
      stream = true })
    assert.same({ ep1 = 4 }, tokens(rt))
    req:response_header(200, { ["Content-Type"] = "text/event-stream" })
    assert.same({ ep1 = 4 }, tokens(rt)) -- a head is not a token
    req:response_chunk("data: 1\n\n")
    assert.same({}, tokens(rt))
    assert.same({ ep1 = 1 }, S.in_flight(rt))
    req:response_chunk("data: 2\n\n")
    assert.same({}, tokens(rt))
    req:finish("ok")
    assert.same({}, S.in_flight(rt))
  end)

  -- _ExcludeOutputTokens_SingleChunk and _EndOfStreamWithoutStart: a response
  -- not streamed holds its tokens to the end; one that never started is
  -- released at the end on every path
  it("holds a response that is not streamed to its end, and releases on every path", function()
    local rt = runtime(nil)
    local a = send(rt, "ep1", { model = "m", prompt = prompt(4) })
    a:response_header(200, {})
    a:response_chunk('{"choices":[]}')
    assert.same({ ep1 = 4 }, tokens(rt))
    a:finish("ok")
    assert.same({}, tokens(rt))
    for i, outcome in ipairs({ "ok", "upstream_error", "cancelled", "timeout" }) do
      local req = send(rt, "ep" .. (i % 3 + 1), { model = "m", prompt = prompt(i), stream = true })
      assert.equal(i, tokens(rt)["ep" .. (i % 3 + 1)])
      req:finish(outcome)
      assert.same({}, tokens(rt))
    end
    assert.equal(0, (rt:check_leaks()))
  end)

  -- TestInFlightLoadProducer_MultiPodLifecycle (addEstimatedOutputTokens):
  -- the prefill endpoint is released at the first chunk, decode at the end
  it("releases the prefill profile's endpoint at the first chunk, with output tokens", function()
    local rt = pd({ addEstimatedOutputTokens = true })
    local req = begin_pd(rt, { model = "m", prompt = prompt(4), stream = true })
    assert.same({ ep1 = 10, ep2 = 10 }, tokens(rt))
    req:response_chunk("data: 1\n\n")
    assert.same({ ep2 = 10 }, tokens(rt))
    req:finish("ok")
    assert.same({}, tokens(rt))
  end)

  -- _ExcludeOutputTokens_PrefillReleasedAtStartOfStream: input only, both
  -- endpoints' tokens go at the first chunk
  it("releases every profile's input at the first chunk by default", function()
    local rt = pd(nil)
    local req = begin_pd(rt, { model = "m", prompt = prompt(4), stream = true })
    assert.same({ ep1 = 4, ep2 = 4 }, tokens(rt))
    assert.same({ ep1 = 1, ep2 = 1 }, S.in_flight(rt))
    req:response_chunk("data: 1\n\n")
    assert.same({}, tokens(rt))
    req:finish("ok")
    assert.same({}, S.in_flight(rt))
  end)

  -- _BalancedAddRelease_MultipleProfilesSameEndpoint: two profiles on one
  -- endpoint hold 20 tokens; the first chunk takes prefill's 10
  it("holds each profile's share on an endpoint two profiles chose", function()
    local rt = pd({ addEstimatedOutputTokens = true }, true)
    local req = begin_pd(rt, { model = "m", prompt = prompt(4), stream = true })
    assert.same({ ep1 = 20 }, tokens(rt))
    req:response_chunk("data: 1\n\n")
    assert.same({ ep1 = 10 }, tokens(rt))
    req:finish("ok")
    assert.same({}, tokens(rt))
  end)

  -- _PrefixCacheDiscount and _PerEndpoint: 8 input tokens in blocks of 4
  -- (prefix-cache-scorer's 16 characters), one of two cached on ep1:
  -- 4 + 12 there, 8 + 12 elsewhere
  it("discounts what the prefix plugin matched on each endpoint", function()
    local scorer = { type = "prefix-cache-scorer", parameters = { blockSize = 16,
      autoTune = false } }
    local rt = runtime({ addEstimatedOutputTokens = true }, { scorer })
    local seed = prompt(4, "a") .. prompt(4, "b")
    send(rt, "ep1", { model = "m", prompt = seed }):finish("ok")
    local req = send(rt, "ep1", { model = "m", prompt = prompt(4, "a") .. prompt(4, "c") })
    assert.same({ ep1 = 16 }, tokens(rt))
    req:finish("ok")
    req = send(rt, "ep2", { model = "m", prompt = prompt(4, "a") .. prompt(4, "d") })
    assert.same({ ep2 = 20 }, tokens(rt))
    req:finish("ok")
    req = send(rt, "ep1", { model = "m", prompt = seed })
    assert.same({ ep1 = 12 }, tokens(rt)) -- fully cached: the output alone
    req:finish("ok")
    assert.same({}, tokens(rt))
  end)

  -- TestInFlightLoadProducer_PrefixMatchInfoProducerName
  it("reads the prefix producer prefixMatchInfoProducerName names, else a default one", function()
    local approx = { type = "approx-prefix-cache-producer", name = "mine" }
    local rt = runtime({ prefixMatchInfoProducerName = "mine" }, { approx })
    assert.equal("mine", K.instance(rt, T, "self.source"))
    rt = runtime(nil, { { type = "approx-prefix-cache-producer" } })
    assert.equal("approx-prefix-cache-producer", K.instance(rt, T, "self.source"))
    rt = runtime(nil, { { type = "prefix-cache-scorer" } })
    assert.equal("prefix-cache-scorer", K.instance(rt, T, "self.source"))
    rt = runtime(nil, { approx }) -- another name: not upstream's default key
    assert.is_false(K.instance(rt, T, "self.source or false"))
    local err = K.load_error({ '{"type": "inflight-load-producer", "parameters":'
      .. ' {"prefixMatchInfoProducerName": "nope"}}' })
    assert.matches('^spec%.json:3: plugins%[0%]%.parameters%.prefixMatchInfoProducerName: plugin'
      .. ' "inflight%-load%-producer" %(inflight%-load%-producer%): prefixMatchInfoProducerName'
      .. ' "nope" names no approx%- or precise%-prefix%-cache%-producer instance$', err)
  end)

  -- TestInFlightLoadProducerFactory_OutputRatio and _MaxEstimatedOutputTokens
  it("takes outputRatio and maxEstimatedOutputTokens, refusing negatives", function()
    assert.same({ addEstimatedOutputTokens = false, outputRatio = 1.5 }, K.params(S.runtime(), T))
    local function held(params, n)
      params.addEstimatedOutputTokens = true
      local rt = runtime(params)
      local req = send(rt, "ep1", { model = "m", prompt = prompt(n) })
      local t = tokens(rt).ep1
      req:finish("ok")
      return t
    end
    assert.equal(10 + 15, held({}, 10))
    assert.equal(10 + 20, held({ outputRatio = 2.0 }, 10))
    assert.equal(10, held({ outputRatio = 0 }, 10))
    assert.equal(100 + 40, held({ maxEstimatedOutputTokens = 40 }, 100))
    assert.equal(100 + 150, held({ maxEstimatedOutputTokens = 1000 }, 100))
    local err = K.load_error({ '{"type": "inflight-load-producer", "parameters":'
      .. ' {"outputRatio": -1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.outputRatio: must be a number"
      .. " between 0 and 1000000, got %-1", err)
    err = K.load_error({ '{"type": "inflight-load-producer", "parameters":'
      .. ' {"maxEstimatedOutputTokens": -1}}' })
    assert.matches("plugins%[0%]%.parameters%.maxEstimatedOutputTokens: must be an integer", err)
    err = K.load_error({ '{"type": "inflight-load-producer", "parameters":'
      .. ' {"maxEstimatedOutputTokens": 2.5}}' })
    assert.matches("plugins%[0%]%.parameters%.maxEstimatedOutputTokens: must be an integer", err)
    err = K.load_error({ '{"type": "inflight-load-producer", "parameters":'
      .. ' {"addEstimatedOutputTokens": "yes"}}' })
    assert.matches("plugins%[0%]%.parameters%.addEstimatedOutputTokens: must be a boolean", err)
    err = K.load_error({ '{"type": "inflight-load-producer", "parameters": {"ratio": 2}}' })
    assert.matches("plugins%[0%]%.parameters%.ratio", err)
  end)

  -- TestTokenLoadScorer's client cap (PR 1750): 10 input, client max 3 → 13
  it("caps the output estimate by the client's max_tokens", function()
    local rt = runtime({ addEstimatedOutputTokens = true })
    local req = send(rt, "ep1", { model = "m", prompt = prompt(10), max_tokens = 3 })
    assert.same({ ep1 = 13 }, tokens(rt))
    req:finish("ok")
    req = send(rt, "ep1", { model = "m", messages = { { role = "user", content = "hi" } },
      max_completion_tokens = 1, max_tokens = 50 }, "/v1/chat/completions")
    assert.same({ ep1 = 8 + 1 }, tokens(rt)) -- the messages' JSON: 32 characters
    req:finish("ok")
  end)

  it("warns that syncCrossReplicaState has no effect, at its line", function()
    local rt = runtime({ syncCrossReplicaState = true })
    local warned
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:match("plugins%[0%]%.parameters%.syncCrossReplicaState: plugin"
        .. ' "inflight%-load%-producer" %(inflight%-load%-producer%): has no effect in lupin:'
        .. " no cross%-replica syncer exists")
    end
    assert.truthy(warned)
    rt = runtime({ syncCrossReplicaState = false }) -- what lupin does: nothing to say
    for _, l in ipairs(rt:logs()) do
      assert.is_nil(l[2]:match("syncCrossReplicaState"))
    end
  end)

  it("is a data producer: an entry in a profile is skipped with a warning", function()
    local rt = S.loaded(K.config({ { type = T } }, { { pluginRef = T } }))
    local warned
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:match('plugin "inflight%-load%-producer" %(inflight%-load%-producer%)'
        .. " produces data before the profiles run")
    end
    assert.truthy(warned)
  end)
end)
