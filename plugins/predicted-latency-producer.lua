-- The llm-d router's predicted-latency-producer, with the predictor inside
-- the runtime (lupin.latency, lupin.predictor) where upstream calls XGBoost
-- training and prediction sidecars.  Before the profiles it predicts every
-- candidate's TTFT and TPOT for the request and publishes them with the
-- headroom under the request's objectives (x-llm-d-slo-ttft-ms,
-- x-llm-d-slo-tpot-ms; lupin.slo) in ctx.shared["predicted-latency"], which
-- latency-scorer, slo-headroom-tier-filter, latency-slo-admitter and
-- prefix-cache-affinity-filter (ttftSource: latencyPredictor) read.  After
-- the response it trains the models on what the request took.  A bad
-- objective header is refused with a 400 (admit).
local latency = require "lupin.latency"
local prefix = require "lupin.prefix"
local slo = require "lupin.slo"

local NO_EFFECT = "has no effect in lupin: %s"
-- Plugins whose prepare publishes {block_size, total, matches} under their name.
local SOURCE_TYPES = { ["approx-prefix-cache-producer"] = true,
  ["precise-prefix-cache-producer"] = true, ["prefix-cache-scorer"] = true }
local DEFAULT_SOURCES = { "approx-prefix-cache-producer", "precise-prefix-cache-producer",
  "prefix-cache-scorer" }

---@type lupin.Plugin
return {
  type = "predicted-latency-producer",
  data_producer = true,
  times_response = true, -- TTFT and TPOT from ctx.timing
  schema = {
    sloBufferFactor = { type = "number", default = 1, min = 0.001, max = 1000,
      description = "the TPOT objective is multiplied by it before the headroom is taken" },
    streamingMode = { type = "boolean", default = false,
      description = "train TTFT on the first streamed byte and TPOT on the events (true), or"
        .. " TTFT on the whole response and no TPOT (false, upstream's default)" },
    endpointRoleLabel = { type = "string", default = "",
      description = "the label of prefill/decode roles: TPOT is neutral on prefill endpoints,"
        .. " and the role groups models unless groupLabel is set" },
    predictInProduce = { type = "boolean", default = true,
      description = "predict before scheduling (false: train only)" },
    prefixMatchInfoProducerName = { type = "string",
      description = "the approx- or precise-prefix-cache-producer whose matches give the cached"
        .. " tokens (default: one of those names, or a prefix-cache-scorer listed before it,"
        .. " else an index of its own)" },
    groupLabel = { type = "string", default = "",
      description = "lupin: endpoints sharing this label's value share a model (hardware class)" },
    perEndpoint = { type = "boolean", default = true,
      description = "lupin: each endpoint also has its own model, used once it has minSamples" },
    minSamples = { type = "integer", default = 16, min = 1, max = 1000000,
      description = "lupin: samples a model needs before its predictions are used" },
    halfLifeSeconds = { type = "number", default = 120, min = 0, max = 86400,
      description = "lupin: a sample weighs half as much this long after (0: never forget)" },
    quantile = { type = "number", default = 0, min = 0, max = 0.999,
      description = "lupin: predict this quantile (0.9: p90) instead of the mean (0)" },
    samplingMean = { type = "number",
      description = "upstream's TPOT sampling, deprecated there: no effect" },
    maxDecodeTokenSamplesForPrediction = { type = "integer",
      description = "upstream's TPOT sampling, deprecated there: no effect" },
    contextTTL = { type = "string",
      description = "upstream's per-request cache: no effect (a request's state ends with it)" },
    inFlightLoadProducerName = { type = "string",
      description = "no effect: the core counts the in-flight load" },
    useEncoderCacheFeatures = { type = "boolean", default = false,
      description = "multimodal encoder-cache features: not supported, refused when true" },
    encoderCacheMatchInfoProducerName = { type = "string",
      description = "no effect (encoder-cache features are not supported)" },
  },

  new = function(p, env)
    if p.useEncoderCacheFeatures then
      error("useEncoderCacheFeatures is not supported: lupin has no multimodal encoder-cache"
        .. " producer; remove it", 0)
    end
    for field, why in pairs({ samplingMean = "mid-stream TPOT sampling was removed upstream",
      maxDecodeTokenSamplesForPrediction = "mid-stream TPOT sampling was removed upstream",
      contextTTL = "a request's prediction state ends with the request",
      inFlightLoadProducerName = "the core counts the in-flight load",
      encoderCacheMatchInfoProducerName = "encoder-cache features are not supported" }) do
      if p[field] ~= nil then
        env.warn(field, NO_EFFECT, why)
      end
    end
    return latency.new(p, env)
  end,

  -- The prefix source: the named prefix producer, else one of the default
  -- names, else an index of this instance's own.
  init = function(self)
    local want = self.p.prefixMatchInfoProducerName
    for _, name in ipairs(want and { want } or DEFAULT_SOURCES) do
      local _, type_ = self.env.plugin(name)
      if SOURCE_TYPES[type_] then
        self.source = name
        return
      end
    end
    self.own = latency.own_prefix(self.name)
  end,

  prepare = function(self, ctx, endpoints)
    local st, req = ctx.plugin, ctx.request
    local ttft_slo, tpot_slo, bad = slo.parse(req.headers)
    if bad then
      st.bad = bad
      return
    end
    local matches = self.source and ctx.shared[self.source]
    if self.own then
      local body = req.body
      local salt = body and type(body.cache_salt) == "string" and body.cache_salt or ""
      st.hashes = prefix.hashes(req.prompt, req.model, salt, self.own.block, 4096)
      matches = { block_size = self.own.block, total = st.hashes.n,
        matches = self.own.index:match(st.hashes) }
    end
    local cached, frac = latency.cached(matches)
    local out = { slo = { ttft = ttft_slo, tpot = tpot_slo }, streaming = self.p.streamingMode,
      prefix = frac, endpoints = {} }
    ctx.shared[slo.KEY] = out
    ctx.shared[self.name] = out -- explain shows what a producer publishes under its name
    local rows
    rows, st.rows = latency.predict(self, endpoints, latency.input_tokens(req), cached)
    if self.p.predictInProduce then
      latency.publish(self, ctx, out, rows)
    end
  end,

  admit = function(_, ctx)
    local bad = ctx.plugin.bad
    if bad then
      return false, 400, bad
    end
  end,

  pre_request = function(self, ctx, result)
    local st = ctx.plugin
    local ep = result.endpoints[1]
    local row = ep and st.rows and st.rows[ep.id]
    if not row then
      return
    end
    st.row, st.sent_at = row, self.env.now()
    st.rows = nil
    local uncached = latency.uncached_tokens(row)
    ctx:set_in_flight_tokens(ep, uncached + latency.output_tokens(ctx.request))
    ctx:set_prefill_tokens(ep, uncached) -- until its first byte: the queue TTFT waits on
    if st.hashes then
      prefix.record_result(self.own.index, result, st.hashes, false)
    end
  end,

  finish = function(self, ctx, outcome)
    local st = ctx.plugin
    if st.hashes then
      prefix.release(st.hashes)
      st.hashes = nil
    end
    if outcome == "ok" and st.row then
      latency.learn(self, ctx, st)
    end
  end,
}
