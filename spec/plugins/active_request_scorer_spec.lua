local K = require "plugins.kit"
local S = require "support"

local T = "active-request-scorer"

-- Requests go where the header-based testing filter sends them; two
-- instances score side by side on the same counts (ep.in_flight, the core's):
-- "ar" (defaults) and "ar2" (idleThreshold 2, maxBusyScore 0.5).
local function runtime(picker)
  local rt = S.loaded(K.config({
    { type = "header-based-testing-filter" },
    { type = T, name = "ar" },
    { type = T, name = "ar2", parameters = { idleThreshold = 2, maxBusyScore = 0.5 } },
    { type = picker or "max-score-picker" },
  }, { { pluginRef = "header-based-testing-filter" }, { pluginRef = "ar" }, { pluginRef = "ar2" },
    { pluginRef = picker or "max-score-picker" } }))
  S.endpoints(rt, 3)
  return rt
end

local function send(rt, target, headers)
  headers = headers or {}
  headers["test-epp-endpoint-selection"] = target
  local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m","prompt":"p"}',
    headers = headers }))
  return req, req:schedule()
end

local function counts(rt)
  return S.in_flight(rt)
end

local function scores(rt, name)
  return K.instance(rt, name, [[
    local out = {}
    for i, s in ipairs(self:score(nil, require("lupin.runtime.pool").list)) do
      out[i] = ("%.17g"):format(s)
    end
    return out]])
end

local function numbers(list)
  for i, v in ipairs(list) do
    list[i] = tonumber(v)
  end
  return list
end

describe(T, function()
  it("scores (max - c) / max, 1 for idle endpoints", function()
    local rt = runtime()
    local held = {}
    for _ = 1, 4 do
      held[#held + 1] = send(rt, "ep1")
    end
    for _ = 1, 2 do
      held[#held + 1] = send(rt, "ep2")
    end
    assert.same({ ep1 = 4, ep2 = 2 }, counts(rt))
    assert.same({ 0, 0.5, 1 }, numbers(scores(rt, "ar")))
    -- idleThreshold 2: ep2 is idle; maxBusyScore 0.5 scales the busy ones
    assert.same({ 0, 1, 1 }, numbers(scores(rt, "ar2")))
    held[#held + 1] = send(rt, "ep3")
    held[#held + 1] = send(rt, "ep3")
    held[#held + 1] = send(rt, "ep3")
    assert.same({ 0, 1, 0.5 * (4 - 3) / 4 }, numbers(scores(rt, "ar2")))
    for _, req in ipairs(held) do
      req:finish("ok")
    end
    assert.same({}, counts(rt))
    assert.same({ 1, 1, 1 }, numbers(scores(rt, "ar")))
  end)

  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/activerequest/
  -- active_request_test.go: TestActiveRequestScorer_Score,
  -- TestActiveRequest_IdleThresholdAndMaxBusyScore (binary and hybrid modes) and
  -- TestActiveRequest_DefaultParamsProduceContinuousScores
  it("scores as upstream's active_request_test.go expects", function()
    local rt = S.loaded(K.config({
      { type = "header-based-testing-filter" }, { type = T, name = "ar" },
      { type = T, name = "bin", parameters = { idleThreshold = 0, maxBusyScore = 0 } },
      { type = T, name = "hyb", parameters = { idleThreshold = 1, maxBusyScore = 0.5 } },
      { type = "max-score-picker" },
    }, { { pluginRef = "header-based-testing-filter" }, { pluginRef = "ar" },
      { pluginRef = "bin" }, { pluginRef = "hyb" }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3)
    local function load(want, name)
      local held = {}
      for i, n in ipairs(want) do
        for _ = 1, n do
          held[#held + 1] = send(rt, "ep" .. i)
        end
      end
      local got = numbers(scores(rt, name))
      for _, req in ipairs(held) do
        req:finish("ok")
      end
      return got
    end
    assert.same({ 1, 1, 1 }, load({ 0, 0, 0 }, "ar")) -- "no load attribute set"
    assert.same({ 0.5, 1, 0 }, load({ 3, 0, 6 }, "ar")) -- "all ... different request counts"
    assert.same({ 0, 1, 0.75 }, load({ 4, 0, 1 }, "ar")) -- "some endpoints have load data"
    assert.same({ 0, 1, 1 }, load({ 1, 0, 0 }, "bin")) -- binary: busy 0, idle 1
    assert.same({ 1, 0, 1 }, load({ 1, 2, 0 }, "hyb")) -- hybrid: 1 request is idle
    local light = load({ 3, 11, 0 }, "ar") -- default parameters stay continuous
    assert.near(0.7272, light[1], 0.001)
    assert.same({ 0, 1 }, { light[2], light[3] })
  end)

  it("scores nothing for no endpoints and 1 for all when nothing is in flight", function()
    local rt = runtime()
    assert.same({ 1, 1, 1 }, numbers(scores(rt, "ar")))
    assert.same({}, K.instance(rt, "ar", "#self:score(nil, {}) == 0 and {} or 'not empty'"))
  end)

  it("steers new requests away from busy endpoints end to end", function()
    local rt = S.loaded(K.config({ { type = T } }, { { pluginRef = T } }))
    S.endpoints(rt, 3)
    local held, seen = {}, {}
    for _ = 1, 3 do
      local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}' }))
      local res = req:schedule()
      held[#held + 1] = req
      seen[res.picks[1].name] = true
    end
    -- each new request went to an endpoint with nothing in flight
    assert.same({ ep1 = true, ep2 = true, ep3 = true }, seen)
    for _, req in ipairs(held) do
      req:finish("cancelled")
    end
    assert.same({}, counts(rt))
  end)

  it("returns to zero after successes, upstream errors, cancels, timeouts and picker failures",
    function()
    local rt = runtime("kit-failing-picker")
    local live, ends = {}, { "ok", "upstream_error", "cancelled", "timeout" }
    local function in_flight()
      local n = 0
      for _, l in ipairs(live) do
        n = n + (l.counted and 1 or 0)
      end
      return n
    end
    local function total()
      local n = 0
      for _, c in pairs(counts(rt)) do
        n = n + c
      end
      return n
    end
    for i = 1, 30 do
      local fail = i % 5 == 0
      local req, res = send(rt, "ep" .. (i % 3 + 1), fail and { ["x-kit-fail"] = "1" } or nil)
      -- a failed picker is a 500 and pre_request never runs: nothing counted
      assert.equal(fail and 500 or 200, res.status)
      live[#live + 1] = { req = req, counted = not fail }
      if i % 4 == 0 then -- end the oldest while others are still in flight
        table.remove(live, 1).req:finish(ends[(i / 4) % 4 + 1])
      end
      assert.equal(in_flight(), total())
    end
    assert.is_true(in_flight() > 10)
    for i, l in ipairs(live) do
      l.req:finish(ends[i % 4 + 1])
    end
    assert.same({}, counts(rt))
    assert.equal(0, (rt:check_leaks()))
  end)

  it("counts an endpoint two profiles chose once and releases it", function()
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
    assert.same({ ep1 = 1 }, counts(rt))
    req:finish("upstream_error")
    assert.same({}, counts(rt))
    assert.equal(0, (rt:check_leaks()))
  end)

  it("counts the decode and the prefill endpoint of a P/D request", function()
    local rt = S.loaded({
      plugins = { { type = "kit-two-profile-handler" }, { type = "decode-filter" },
        { type = "prefill-filter" }, { type = T } },
      schedulingProfiles = {
        { name = "a", plugins = { { pluginRef = "decode-filter" }, { pluginRef = T } } },
        { name = "b", plugins = { { pluginRef = "prefill-filter" }, { pluginRef = T } } },
      },
    })
    S.endpoints(rt, 3, { { labels = { ["llm-d.ai/role"] = "prefill" } },
      { labels = { ["llm-d.ai/role"] = "decode" } }, { labels = { ["llm-d.ai/role"] = "decode" } } })
    local held = {}
    for i = 1, 3 do
      local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}' }))
      local res = req:schedule()
      assert.equal(200, res.status)
      held[i] = req
    end
    -- every prefill went to ep1; the decodes spread over ep2 and ep3 by load
    local c = counts(rt)
    assert.equal(3, c.ep1)
    assert.equal(3, c.ep2 + c.ep3)
    assert.is_true(c.ep2 >= 1 and c.ep3 >= 1)
    for _, req in ipairs(held) do
      req:finish("cancelled")
    end
    assert.same({}, counts(rt))
  end)

  it("keeps counting across a hot reload: old requests stay counted until they end", function()
    local config = K.config({ { type = "header-based-testing-filter" }, { type = T } },
      { { pluginRef = "header-based-testing-filter" }, { pluginRef = T } })
    local rt = S.loaded(config)
    S.endpoints(rt, 2)
    local req = send(rt, "ep2")
    assert(rt:load_string(S.json.encode(config), "spec.json"))
    assert.same({ ep2 = 1 }, counts(rt))
    assert.same({ "1", "0" }, scores(rt, T)) -- the new instance sees the old request
    req:finish("ok")
    assert.same({}, counts(rt))
  end)

  it("defaults idleThreshold 0 and maxBusyScore 1, accepts llm-d's requestTimeout", function()
    local rt = S.runtime()
    assert.same({ idleThreshold = 0, maxBusyScore = 1 }, K.params(rt, T))
    assert.same({ idleThreshold = 0, maxBusyScore = 1, requestTimeout = "2m" },
      K.params(rt, T, { requestTimeout = "2m" }))
  end)

  -- upstream's Parameters.InFlightLoadProducerName: the counts come from that
  -- inflight-load-producer; lupin's are the core's, the name checked at load
  it("takes inFlightLoadProducerName naming an inflight-load-producer, refuses another", function()
    local rt = S.loaded(K.config({ { type = "inflight-load-producer", name = "load" },
      { type = "header-based-testing-filter" },
      { type = T, parameters = { inFlightLoadProducerName = "load" } } },
      { { pluginRef = "header-based-testing-filter" }, { pluginRef = T } }))
    S.endpoints(rt, 2)
    local req = send(rt, "ep2")
    assert.same({ ep2 = 1 }, counts(rt))
    assert.same({ "1", "0" }, scores(rt, T))
    req:finish("ok")
    local err = K.load_error({ '{"type": "queue-scorer"}',
      '{"type": "active-request-scorer", "parameters": {"inFlightLoadProducerName": "nope"}}' })
    assert.matches('^spec%.json:4: plugins%[1%]%.parameters%.inFlightLoadProducerName: plugin'
      .. ' "active%-request%-scorer" %(active%-request%-scorer%): inFlightLoadProducerName "nope"'
      .. " names no inflight%-load%-producer instance$", err)
    err = K.load_error({ '{"type": "queue-scorer"}', '{"type": "active-request-scorer",'
      .. ' "parameters": {"inFlightLoadProducerName": "queue-scorer"}}' })
    assert.matches('names no inflight%-load%-producer instance %(it is a queue%-scorer%)$', err)
  end)

  it("refuses parameters out of bounds with file, line and path", function()
    local err = K.load_error({ '{"type": "queue-scorer"}',
      '{"type": "active-request-scorer", "parameters": {"maxBusyScore": 1.5}}' })
    assert.matches("^spec%.json:4: plugins%[1%]%.parameters%.maxBusyScore: must be a number between"
      .. " 0 and 1, got 1.5", err)
    err = K.load_error({ '{"type": "active-request-scorer", "parameters": {"idleThreshold": 0.5}}' })
    assert.matches("plugins%[0%]%.parameters%.idleThreshold: must be an integer", err)
  end)
end)
