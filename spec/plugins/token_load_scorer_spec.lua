local K = require "plugins.kit"
local S = require "support"

local T = "token-load-scorer"

local function runtime(params, picker)
  local rt = S.loaded(K.config({
    { type = "header-based-testing-filter" },
    { type = T, parameters = params },
    { type = picker or "max-score-picker" },
  }, { { pluginRef = "header-based-testing-filter" }, { pluginRef = T },
    { pluginRef = picker or "max-score-picker" } }))
  S.endpoints(rt, 3)
  return rt
end

local function send(rt, target, body, headers)
  headers = headers or {}
  headers["test-epp-endpoint-selection"] = target
  local req = assert(rt:begin({ path = "/v1/completions", headers = headers,
    body = body or '{"model":"m","prompt":"abcdefghij","max_tokens":7}' })) -- 3 + 7 tokens
  return req, req:schedule()
end

local function tokens(rt) -- the core's counters, shared by every runtime of the process
  return S.in_flight(rt, "in_flight_tokens")
end

local function scores(rt)
  local out = K.instance(rt, T, [[
    local out = {}
    local ctx = { request = { prompt = "", body = false }, shared = {} } -- adds 0 tokens
    for i, s in ipairs(self:score(ctx, require("lupin.runtime.pool").list)) do
      out[i] = ("%.17g"):format(s)
    end
    return out]])
  for i, v in ipairs(out) do
    out[i] = tonumber(v)
  end
  return out
end

local function estimate(rt, body)
  return S.eval(rt, ([[
    local m = require("lupin.generation.loader").load(%q, "token-load-scorer")
    local body = require("cjson").decode(%q)
    local prompt = type(body.prompt) == "string" and body.prompt
      or body.messages and require("cjson").encode(body.messages) or ""
    return m.estimate({ body = body, prompt = prompt })
  ]]):format(S.ROOT .. "/plugins/token-load-scorer.lua", S.json.encode(body)))
end

describe(T, function()
  it("estimates ceil(prompt characters / 4) + max_tokens", function()
    local rt = S.runtime()
    assert.equal(3 + 7, estimate(rt, { prompt = "abcdefghij", max_tokens = 7 }))
    assert.equal(1, estimate(rt, { prompt = "abc" }))
    assert.equal(0, estimate(rt, { prompt = "" }))
    assert.equal(2 + 5, estimate(rt, { prompt = "abcdefgh", max_completion_tokens = 5 }))
    assert.equal(2 + 4, estimate(rt, { prompt = "abcdefgh", max_tokens = 4,
      max_completion_tokens = 50 }))
    assert.equal(2, estimate(rt, { prompt = "abcdefgh", max_tokens = -3 }))
    assert.equal(2, estimate(rt, { prompt = "abcdefgh", max_tokens = "9" }))
    assert.equal(2 + 2, estimate(rt, { prompt = "abcdefgh", max_tokens = 2.9 }))
    -- chat: the JSON of the messages, [{"role":"user","content":"hi"}] = 32 characters
    assert.equal(8, estimate(rt, { messages = { { role = "user", content = "hi" } } }))
  end)

  it("scores 1 - min(1, tokens / queueThresholdTokens)", function()
    local rt = runtime({ queueThresholdTokens = 40 })
    local held = {}
    held[1] = send(rt, "ep1")
    assert.same({ ep1 = 10 }, tokens(rt))
    assert.same({ 0.75, 1, 1 }, scores(rt))
    held[#held + 1] = send(rt, "ep2")
    held[#held + 1] = send(rt, "ep2")
    assert.same({ 0.75, 0.5, 1 }, scores(rt))
    for _ = 1, 4 do
      held[#held + 1] = send(rt, "ep1") -- 50 tokens: over the threshold
    end
    assert.same({ 0, 0.5, 1 }, scores(rt))
    for _, req in ipairs(held) do
      req:finish("ok")
    end
    assert.same({}, tokens(rt))
    assert.same({ 1, 1, 1 }, scores(rt))
    assert.same({}, K.instance(rt, T,
      "#self:score({ request = { prompt = '' }, shared = {} }, {}) == 0 and {} or 'not empty'"))
  end)

  it("returns to zero after successes, upstream errors, cancels and picker failures", function()
    local rt = runtime(nil, "kit-failing-picker")
    local live, ends = {}, { "ok", "upstream_error", "cancelled", "timeout" }
    local expected = 0
    for i = 1, 24 do
      local fail = i % 5 == 0
      local body = ('{"model":"m","prompt":"%s","max_tokens":%d}'):format(("x"):rep(i), i)
      local req, res = send(rt, "ep" .. (i % 3 + 1), body, fail and { ["x-kit-fail"] = "1" })
      assert.equal(fail and 500 or 200, res.status)
      local n = fail and 0 or math.ceil(i / 4) + i
      expected = expected + n
      live[#live + 1] = { req = req, n = n }
      if i % 3 == 0 then
        local l = table.remove(live, 1)
        l.req:finish(ends[(i / 3) % 4 + 1])
        expected = expected - l.n
      end
      local total = 0
      for _, t in pairs(tokens(rt)) do
        total = total + t
      end
      assert.equal(expected, total)
    end
    for i, l in ipairs(live) do
      l.req:finish(ends[i % 4 + 1])
    end
    assert.same({}, tokens(rt))
    assert.equal(0, (rt:check_leaks()))
  end)

  it("steers requests away from token-heavy endpoints end to end", function()
    local rt = S.loaded(K.config({ { type = T, parameters = { queueThresholdTokens = 100 } } },
      { { pluginRef = T } }))
    S.endpoints(rt, 2)
    local big = assert(rt:begin({ path = "/v1/completions",
      body = '{"model":"m","prompt":"p","max_tokens":50}' }))
    local first = big:schedule().picks[1].name
    local names = K.picks(rt)
    assert.are_not.equal(first, names[1])
    big:finish("ok")
  end)

  -- llm-d-router .../scorer/tokenload/token_load_test.go, TestTokenLoadScorer
  -- "in-flight load only": 0, 500 and 1000 tokens in flight of 1000, none for
  -- this request; "missing data key degrades gracefully": nothing in flight is 1.
  it("scores in-flight tokens alone as TestTokenLoadScorer expects", function()
    local rt = runtime({ queueThresholdTokens = 1000 })
    assert.same({ 1, 1, 1 }, scores(rt))
    local a = send(rt, "ep2", '{"model":"m","prompt":"","max_tokens":500}')
    local b = send(rt, "ep3", '{"model":"m","prompt":"","max_tokens":1000}')
    assert.same({ 1, 0.5, 0 }, scores(rt))
    a:finish("ok")
    b:finish("ok")
  end)

  -- TestTokenLoadScorer "in-flight load plus current request impact":
  -- 0, 250 and 750 tokens in flight of 1000, and 250 for this request.
  it("counts this request's tokens in the load it scores", function()
    local rt = runtime({ queueThresholdTokens = 1000 })
    local a = send(rt, "ep2", '{"model":"m","prompt":"","max_tokens":250}')
    local b = send(rt, "ep3", '{"model":"m","prompt":"","max_tokens":750}')
    assert.same({ ep2 = 250, ep3 = 750 }, tokens(rt))
    local out = K.instance(rt, T, [[
      local ctx = { request = { prompt = ("x"):rep(1000), body = false }, shared = {} }
      local out = {}
      for i, s in ipairs(self:score(ctx, require("lupin.runtime.pool").list)) do
        out[i] = ("%.17g"):format(s)
      end
      return out]])
    assert.same({ "0.75", "0.5", "0" }, out)
    a:finish("ok")
    b:finish("timeout")
    assert.same({}, tokens(rt))
  end)

  it("holds a request's estimate once on an endpoint two profiles chose", function()
    local rt = S.loaded({
      plugins = { { type = "kit-two-profile-handler" }, { type = "header-based-testing-filter" },
        { type = T } },
      schedulingProfiles = {
        { name = "a", plugins = { { pluginRef = "header-based-testing-filter" }, { pluginRef = T } } },
        { name = "b", plugins = { { pluginRef = T } } },
      },
    })
    S.endpoints(rt, 1)
    local req, res = send(rt, "ep1")
    assert.equal(200, res.status)
    assert.same({ ep1 = 10 }, tokens(rt))
    req:finish("cancelled")
    assert.same({}, tokens(rt))
  end)

  it("counts only the tokens not cached on each endpoint", function()
    local rt = runtime({ queueThresholdTokens = 1000 })
    local out = K.instance(rt, T, [[
      local eps = require("lupin.runtime.pool").list
      -- ep1 holds 10 blocks of 64 characters: 160 of the 250 tokens; ep3 more than all
      local st = { block_size = 64, matches = { [eps[1].id] = 10, [eps[3].id] = 20 } }
      local ctx = { request = { prompt = ("x"):rep(1000), body = false },
        shared = { ["prefix-cache-scorer"] = st } }
      local out = {}
      for i, s in ipairs(self:score(ctx, eps)) do
        out[i] = ("%.17g"):format(s)
      end
      return out]])
    assert.same({ "0.91000000000000003", "0.75", "1" }, out) -- 1 - 90/1000
  end)

  -- token_load.go: with inFlightLoadProducerName the load and the request's
  -- tokens are that producer's (InFlightLoad, UncachedRequestTokens)
  it("reads the inflight-load-producer named, and holds nothing of its own", function()
    local rt = S.loaded(K.config({
      { type = "inflight-load-producer", name = "load", parameters = { outputRatio = 2,
        addEstimatedOutputTokens = true } },
      { type = "header-based-testing-filter" },
      { type = T, parameters = { queueThresholdTokens = 100, inFlightLoadProducerName = "load" } },
    }, { { pluginRef = "header-based-testing-filter" }, { pluginRef = T } }))
    S.endpoints(rt, 3)
    assert.equal("load", K.instance(rt, T, "self.inflight"))
    -- 3 input + round(3 × 2) = 9, where the scorer's own estimate is 3 + 7
    local req = send(rt, "ep1")
    assert.same({ ep1 = 9 }, tokens(rt))
    -- a request of 10 tokens scores (in flight + 10 + 20) / 100
    local out = S.eval(rt, ([[
      local gen = require("lupin.runtime").current
      local eps = require("lupin.runtime.pool").list
      local ctx = { request = { prompt = %q, path = "/v1/completions", body = {} }, shared = {} }
      gen.by_name.load.obj:prepare(ctx, eps)
      local out = {}
      for i, s in ipairs(gen.by_name[%q].obj:score(ctx, eps)) do
        out[i] = ("%%.17g"):format(s)
      end
      return out]]):format(("x"):rep(40), T))
    assert.same({ "0.60999999999999999", "0.69999999999999996", "0.69999999999999996" }, out)
    req:finish("timeout")
    assert.same({}, tokens(rt))
  end)

  -- upstream's default key names the producer "inflight-load-producer"; lupin
  -- also takes the only one, and keeps its own estimate without any
  it("finds a producer by upstream's default name, else the only one, else uses its own", function()
    local function inflight(plugins)
      plugins[#plugins + 1] = { type = T }
      local rt = S.loaded(K.config(plugins, { { pluginRef = T } }))
      return K.instance(rt, T, "self.inflight or false")
    end
    assert.equal("inflight-load-producer", inflight({ { type = "inflight-load-producer" },
      { type = "inflight-load-producer", name = "other" } }))
    assert.equal("other", inflight({ { type = "inflight-load-producer", name = "other" } }))
    assert.is_false(inflight({ { type = "inflight-load-producer", name = "a" },
      { type = "inflight-load-producer", name = "b" } }))
    assert.is_false(inflight({}))
    local err = K.load_error({ '{"type": "token-load-scorer", "parameters":'
      .. ' {"inFlightLoadProducerName": "nope"}}' })
    assert.matches('^spec%.json:3: plugins%[0%]%.parameters%.inFlightLoadProducerName: plugin'
      .. ' "token%-load%-scorer" %(token%-load%-scorer%): inFlightLoadProducerName "nope" names'
      .. " no inflight%-load%-producer instance$", err)
  end)

  -- token_load.go's factory: `if cfg.QueueThresholdTokens <= 0 { default }`.
  it("defaults queueThresholdTokens to 4194304, and takes 0 for it with a warning", function()
    assert.same({ queueThresholdTokens = 4194304, prefixPluginName = "prefix-cache-scorer" },
      K.params(S.runtime(), T))
    local rt = runtime({ queueThresholdTokens = 0 })
    assert.equal(4194304, K.instance(rt, T, "self.params.queueThresholdTokens"))
    local warned
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:match("plugins%[1%]%.parameters%.queueThresholdTokens: plugin "
        .. '"token%-load%-scorer" %(token%-load%-scorer%): 0 out of range, using 4194304 instead')
    end
    assert.truthy(warned)
    local err = K.load_error({ '{"type": "token-load-scorer", "parameters": {"queueThresholdTokens": "x"}}' })
    assert.matches("plugins%[0%]%.parameters%.queueThresholdTokens: must be an integer", err)
  end)
end)
