-- predicted-latency-producer through a real runtime: cold start, training on
-- the core's timing of streamed responses, what it publishes, a bad objective
-- header refused with a 400, the parameters.  Its convergence on a known
-- latency model is spec/e2e/latency_prediction_spec.lua's (lupin-sim).
local S = require "support"
local P = require "prefix_support"

local T = "predicted-latency-producer"

local function config(params, extra)
  local plugins = { { type = T, parameters = params }, { type = "spec-latency-probe" },
    { type = "max-score-picker" } }
  for _, p in ipairs(extra or {}) do
    table.insert(plugins, 1, p)
  end
  return {
    plugins = plugins,
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "spec-latency-probe" }, { pluginRef = "max-score-picker" } } } },
  }
end

local function seen(rt, id)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name["spec-latency-probe"]
    .obj.seen[%q] ]]):format(id))
end

-- One streamed request to endpoint `to` (nil: any, every endpoint a
-- candidate) with opts.events output events; returns the schedule result.
local function stream(rt, id, to, opts)
  opts = opts or {}
  local req = assert(rt:begin({ id = id, path = "/v1/completions", subset = to and { to },
    headers = opts.headers,
    body = ('{"model":"m","prompt":"%s","max_tokens":4,"stream":true}'):format(
      opts.prompt or ("abcd"):rep(50)) }))
  local res = req:schedule()
  if res.status == 200 then
    req:response_header(200, { ["content-type"] = "text/event-stream" })
    for i = 1, opts.events or 4 do
      req:response_chunk(("data: %d\n\n"):format(i))
    end
    req:response_chunk("data: [DONE]\n\n")
    req:response_complete()
  end
  req:finish(opts.outcome or (res.status == 200 and "ok" or "rejected"))
  return res
end

local function metrics(n)
  local m = {}
  for i = 1, n do
    m[i] = { waiting_queue_size = i - 1, running_requests = 2 * i, kv_cache_usage = 0.1 * i }
  end
  return m
end

describe(T, function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  it("has upstream's defaults and lupin's, and refuses bad parameters", function()
    assert.same({ sloBufferFactor = 1, streamingMode = false, endpointRoleLabel = "",
      predictInProduce = true, groupLabel = "",
      perEndpoint = true, minSamples = 16, halfLifeSeconds = 120, quantile = 0,
      useEncoderCacheFeatures = false }, P.defaults(T))
    assert.matches("parameters.sloBufferFactor: must be a number between 0.001 and 1000, got 0",
      P.config_error(T, { sloBufferFactor = 0 }))
    assert.matches("parameters.quantile: must be a number between 0 and 0.999, got 1",
      P.config_error(T, { quantile = 1 }))
    assert.matches("useEncoderCacheFeatures is not supported",
      P.config_error(T, { useEncoderCacheFeatures = true }))
  end)

  it("names a prefixMatchInfoProducerName that is not in the config", function()
    local rt2 = S.runtime()
    local ok, err = rt2:load_string(require("cjson").encode(config(
      { prefixMatchInfoProducerName = "nope" })), "spec.json")
    rt2:free()
    assert.is_nil(ok)
    assert.matches('prefixMatchInfoProducerName "nope" names no approx%- or precise%-prefix%-cache%-producer', err)
  end)

  it("predicts nothing while cold and publishes the objectives and prefix matches", function()
    rt = S.loaded(config({ streamingMode = true }))
    S.endpoints(rt, 2, metrics(2))
    stream(rt, "r1", "ep1", { headers = { ["x-llm-d-slo-ttft-ms"] = "250",
      ["x-slo-tpot-ms"] = "30" } })
    local s = seen(rt, "r1")
    assert.same({ ttft = 250, tpot = 30 }, s.slo)
    assert.is_true(s.streaming)
    assert.same({}, s.endpoints) -- no model has a sample yet
    assert.equal(0, s.prefix.ep1 or 0)
  end)

  it("learns from streamed responses, predicts once minSamples are in, judges objectives", function()
    rt = S.loaded(config({ streamingMode = true, minSamples = 3 }))
    S.endpoints(rt, 2, metrics(2))
    for i = 1, 3 do
      assert.equal(200, stream(rt, "warm" .. i, "ep1").status)
    end
    stream(rt, "probe", nil, { headers = { ["x-llm-d-slo-ttft-ms"] = "100000" } })
    local e = seen(rt, "probe").endpoints
    -- ep1's own model and the group's have 3 samples; ep2 reads the group's
    assert.is_table(e.ep1)
    assert.is_table(e.ep2)
    assert.is_true(e.ep1.ttft >= 0 and e.ep1.ttft < 1000) -- milliseconds, in process
    assert.is_true(e.ep1.ttft_valid) -- far under 100 s
    assert.near(100000 - e.ep1.ttft, e.ep1.ttft_headroom, 1e-6)
    -- a TTFT objective alone: TPOT is no constraint (upstream would count it missed)
    assert.equal(0, e.ep1.tpot_headroom)
    assert.is_true(e.ep1.tpot_valid)
    -- no objective at all: 0 − the predictions, as upstream (the least wins)
    stream(rt, "none", nil)
    local n = seen(rt, "none").endpoints.ep1
    assert.equal(-n.ttft, n.ttft_headroom)
    assert.equal(-n.tpot, n.tpot_headroom)
    assert.is_false(n.valid)
    -- a TPOT objective alone: TTFT neutral
    stream(rt, "tpot", nil, { headers = { ["x-llm-d-slo-tpot-ms"] = "100000" } })
    local t = seen(rt, "tpot").endpoints.ep1
    assert.equal(0, t.ttft_headroom)
    assert.is_true(t.ttft_valid and t.tpot_valid and t.valid)
  end)

  it("does not learn from requests that failed or were not streamed in streamingMode", function()
    rt = S.loaded(config({ streamingMode = true, minSamples = 1 }))
    S.endpoints(rt, 1)
    stream(rt, "bad", "ep1", { outcome = "upstream_error" })
    stream(rt, "probe", "ep1")
    assert.same({}, seen(rt, "probe").endpoints)
  end)

  it("refuses a bad objective header with a 400 that names it", function()
    rt = S.loaded(config({}))
    S.endpoints(rt, 1)
    for _, v in ipairs({ "soon", "0", "-5", "nan", "" }) do
      local res = stream(rt, "bad-" .. v, "ep1", { headers = { ["x-llm-d-slo-ttft-ms"] = v } })
      assert.equal(400, res.status, v)
      assert.matches("x-llm-d-slo-ttft-ms", res.message, 1, true)
    end
    local res = stream(rt, "bad-tpot", "ep1", { headers = { ["x-slo-tpot-ms"] = "fast" } })
    assert.equal(400, res.status)
    assert.matches("x-slo-tpot-ms", res.message, 1, true)
    assert.equal(200, stream(rt, "fine", "ep1", { headers = { ["x-llm-d-slo-ttft-ms"] = "12.5" } })
      .status)
  end)

  it("without streamingMode, TPOT is neutral and the whole response trains TTFT", function()
    rt = S.loaded(config({ minSamples = 1 }))
    S.endpoints(rt, 1)
    stream(rt, "w", "ep1")
    stream(rt, "probe", "ep1", { headers = { ["x-llm-d-slo-tpot-ms"] = "1" } })
    local e = seen(rt, "probe").endpoints.ep1
    assert.is_false(seen(rt, "probe").streaming)
    assert.equal(0, e.tpot_headroom)
    assert.is_true(e.tpot_valid)
  end)

  it("neutralizes TPOT on prefill endpoints (endpointRoleLabel) and groups by role", function()
    rt = S.loaded(config({ streamingMode = true, minSamples = 1,
      endpointRoleLabel = "llm-d.ai/role" }))
    S.endpoints(rt, 2, { { labels = { ["llm-d.ai/role"] = "prefill" } },
      { labels = { ["llm-d.ai/role"] = "decode" } } })
    stream(rt, "w1", "ep1", { events = 6 })
    stream(rt, "w2", "ep2", { events = 6 })
    stream(rt, "probe", nil, { headers = { ["x-llm-d-slo-tpot-ms"] = "100000" } })
    local e = seen(rt, "probe").endpoints
    assert.equal(0, e.ep1.tpot_headroom) -- prefill: neutral
    assert.is_true(e.ep2.tpot_headroom > 0)
    local groups = S.eval(rt, [[local self = require("lupin.runtime").current
      .by_name["predicted-latency-producer"].obj
      local out = {}
      for _, ep in ipairs(require("lupin.runtime.pool").list) do
        out[ep.name] = require("lupin.latency").group(self, ep)
      end
      return out]])
    assert.same({ ep1 = "llm-d.ai/role=prefill", ep2 = "llm-d.ai/role=decode" }, groups)
  end)

  it("with predictInProduce false trains but publishes no predictions", function()
    rt = S.loaded(config({ streamingMode = true, minSamples = 1, predictInProduce = false }))
    S.endpoints(rt, 1)
    stream(rt, "w", "ep1")
    stream(rt, "probe", "ep1")
    assert.same({}, seen(rt, "probe").endpoints)
  end)

  it("reads the matches of an approx-prefix-cache-producer listed before it", function()
    rt = S.loaded(config({ streamingMode = true },
      { { type = "approx-prefix-cache-producer", parameters = { autoTune = false } } }))
    S.endpoints(rt, 2)
    local prompt = ("abcd"):rep(64)
    stream(rt, "first", "ep1", { prompt = prompt })
    stream(rt, "second", nil, { prompt = prompt })
    local s = seen(rt, "second")
    assert.equal(1, s.prefix.ep1)
    assert.is_nil(s.prefix.ep2)
  end)

  it("keeps a prefix index of its own when no prefix producer is configured", function()
    rt = S.loaded(config({ streamingMode = true }))
    S.endpoints(rt, 2)
    local prompt = ("wxyz"):rep(64)
    stream(rt, "first", "ep2", { prompt = prompt })
    stream(rt, "second", nil, { prompt = prompt })
    assert.equal(1, seen(rt, "second").prefix.ep2)
  end)

  it("treats an endpoint that never reported a metric as zero load, noted in explain", function()
    rt = S.loaded(config({ streamingMode = true, minSamples = 1 }))
    S.endpoints(rt, 1)
    stream(rt, "w", "ep1")
    local req = assert(rt:begin({ id = "x", path = "/v1/completions", explain = true,
      body = '{"model":"m","prompt":"hello","stream":true}' }))
    req:schedule()
    local record = require("cjson").decode(req:explain())
    req:finish("ok")
    local published
    for _, step in ipairs(record.steps) do
      if step.plugin == T then
        published = step.published
      end
    end
    local ep1 = published.endpoints.ep1
    assert.same({ "waiting", "running", "kv_usage" }, ep1.missing)
    assert.equal(0, ep1.features.waiting)
    assert.equal(1, ep1.features.bias)
    assert.equal("endpoint", ep1.ttft.from) -- its own model has minSamples
  end)

  it("warns at their lines about upstream parameters that have no effect", function()
    local path = S.tmpdir() .. "/latency.json"
    S.write(path, require("cjson").encode({ plugins = { { type = T, parameters = {
      samplingMean = 500, contextTTL = "5m" } }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "max-score-picker" } } } } }))
    local out = S.program("lupin", "check --config " .. path)
    assert.matches("parameters.samplingMean: plugin \"predicted-latency-producer\"", out, 1, true)
    assert.matches("has no effect in lupin: mid-stream TPOT sampling was removed upstream", out, 1,
      true)
    assert.matches("has no effect in lupin: a request's prediction state ends with the request",
      out, 1, true)
    assert.matches("rc=0", out, 1, true)
  end)

  it("feeds latency-slo-admitter, which runs after it and sheds what no endpoint can serve", function()
    rt = S.loaded(config({ streamingMode = true, minSamples = 1 },
      { { type = "latency-slo-admitter" } }))
    S.endpoints(rt, 2, { { kv_cache_usage = 0.5 }, { kv_cache_usage = 0.5 } }) -- none cold
    stream(rt, "w1", "ep1")
    stream(rt, "w2", "ep2")
    local held = {}
    for i, to in ipairs({ "ep1", "ep2" }) do -- none idle
      held[i] = assert(rt:begin({ id = "held" .. i, path = "/v1/completions", subset = { to },
        body = '{"model":"m","prompt":"hi","stream":true}' }))
      assert.equal(200, held[i]:schedule().status)
    end
    local tight = { ["x-llm-d-slo-ttft-ms"] = "0.000001" }
    local shed = { ["x-llm-d-slo-ttft-ms"] = "0.000001", ["x-gateway-inference-objective"] = "-1" }
    assert.equal(200, stream(rt, "critical", nil, { headers = tight }).status)
    local res = stream(rt, "sheddable", nil, { headers = shed })
    assert.equal(429, res.status)
    assert.matches("latency", res.message)
    local loose = { ["x-llm-d-slo-ttft-ms"] = "1e9", ["x-llm-d-slo-tpot-ms"] = "1e9",
      ["x-gateway-inference-objective"] = "-1" }
    assert.equal(200, stream(rt, "loose", nil, { headers = loose }).status)
    for _, req in ipairs(held) do
      req:finish("ok")
    end
  end)
end)
