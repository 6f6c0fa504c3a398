local S = require "support"
local P = require "prefix_support"

local function config(params)
  return {
    plugins = {
      { type = "prefix-cache-scorer", parameters = { blockSize = 4, autoTune = false } },
      { type = "prefix-cache-affinity-filter", parameters = params },
      { type = "spec-scores-picker" },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "prefix-cache-affinity-filter" }, { pluginRef = "spec-scores-picker" } } } },
  }
end

describe("prefix-cache-affinity-filter", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  -- ep1 holds aaaa, ep2 holds aaaabbbb; returns the endpoints kept for `prompt`.
  local function kept(params, prompt)
    rt = S.loaded(config(params))
    S.endpoints(rt, 3)
    P.request(rt, "aaaa", { subset = { "ep1" } })
    P.request(rt, "aaaabbbb", { subset = { "ep2" } })
    local names = {}
    for name in pairs(select(2, P.request(rt, prompt))) do
      names[#names + 1] = name
    end
    table.sort(names)
    rt:free()
    rt = nil
    return table.concat(names, ",")
  end

  -- llm-d-router .../filter/prefixcacheaffinity/plugin.go, DefaultConfig:
  -- AffinityThreshold 0.80, ExplorationProbability 0.
  it("has llm-d's defaults and refuses bad parameters", function()
    assert.same({ affinityThreshold = 0.8, explorationProbability = 0,
      prefixPluginName = "prefix-cache-scorer", maxTTFTPenaltyMs = 18000,
      ttftSource = "prefillThroughput", peakPrefillThroughput = 15928 },
      P.defaults("prefix-cache-affinity-filter"))
    assert.matches("parameters.ttftSource: must be one of",
      P.config_error("prefix-cache-affinity-filter", { ttftSource = "sidecar" }))
    assert.matches("parameters.maxTTFTPenaltyMs: must be a number",
      P.config_error("prefix-cache-affinity-filter", { maxTTFTPenaltyMs = -1 }))
    assert.matches("parameters.peakPrefillThroughput: must be a number",
      P.config_error("prefix-cache-affinity-filter", { peakPrefillThroughput = -1 }))
    assert.matches("parameters.affinityThreshold: must be a number between 0 and 1, got 1.5",
      P.config_error("prefix-cache-affinity-filter", { affinityThreshold = 1.5 }))
    assert.matches("parameters.explorationProbability: must be a number between 0 and 1, got %-0.1",
      P.config_error("prefix-cache-affinity-filter", { explorationProbability = -0.1 }))
  end)

  -- plugin_test.go TestFactory_ThroughputModeRequiresPeakPrefillThroughput,
  -- TestFactory_ZeroPeakPrefillThroughputAllowedWhenUnused and
  -- TestFactory_DefaultsToPrefillThroughput: 0 only while nothing divides by it
  it("takes peakPrefillThroughput 0 only when the throughput source is unused", function()
    local msg = "peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput"
    assert.matches(msg, P.config_error("prefix-cache-affinity-filter",
      { peakPrefillThroughput = 0 }), 1, true)
    assert.matches(msg, P.config_error("prefix-cache-affinity-filter",
      { ttftSource = "prefillThroughput", peakPrefillThroughput = 0 }), 1, true)
    for _, ok in ipairs({ { maxTTFTPenaltyMs = 0, peakPrefillThroughput = 0 },
      { ttftSource = "latencyPredictor", peakPrefillThroughput = 0 } }) do
      rt = S.loaded(config(ok))
      rt:free()
    end
    rt = nil
  end)

  -- plugin.go Config.InFlightLoadProducerName: the load gate's in-flight
  -- tokens come from that inflight-load-producer, which sets ep.in_flight_tokens
  it("takes inFlightLoadProducerName naming an inflight-load-producer, refuses another", function()
    local cfg = config({ inFlightLoadProducerName = "load" })
    table.insert(cfg.plugins, 1, { type = "inflight-load-producer", name = "load" })
    rt = S.loaded(cfg)
    rt:free()
    rt = nil
    assert.matches('plugins%[1%]%.parameters%.inFlightLoadProducerName: plugin'
      .. ' "prefix%-cache%-affinity%-filter" %(prefix%-cache%-affinity%-filter%):'
      .. ' inFlightLoadProducerName "nope" names no inflight%-load%-producer instance',
      P.config_error("prefix-cache-affinity-filter", { inFlightLoadProducerName = "nope" }))
  end)

  it("keeps the endpoints at or above the threshold", function()
    -- aaaabbbbcccc: ep1 1/3, ep2 2/3, ep3 0
    assert.equal("ep2", kept({ affinityThreshold = 0.5, explorationProbability = 0 }, "aaaabbbbcccc"))
    assert.equal("ep1,ep2", kept({ affinityThreshold = 1 / 3, explorationProbability = 0 },
      "aaaabbbbcccc"))
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0, explorationProbability = 0 },
      "aaaabbbbcccc"))
  end)

  it("keeps all when none passes, or the prompt has no block", function()
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0.9, explorationProbability = 0 },
      "aaaabbbbcccc"))
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0.1, explorationProbability = 0 }, "aa"))
  end)

  it("keeps all when it explores", function()
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0.5, explorationProbability = 1 },
      "aaaabbbbcccc"))
  end)

  it("is skipped, with an error naming the missing prefix scorer, without one", function()
    rt = S.loaded(config({ prefixPluginName = "nope", explorationProbability = 0 }))
    S.endpoints(rt, 2)
    local _, sc, res = P.request(rt, "aaaa")
    assert.equal(200, res.status)
    assert.same({ ep1 = 0, ep2 = 0 }, sc)
    local logged = false
    for _, l in ipairs(rt:logs()) do
      logged = logged or l[2]:find('no prefix matches from "nope"', 1, true) ~= nil
    end
    assert.is_true(logged)
  end)

  -- The TTFT load gate: ep1 holds aaaa (sticky for "aaaa"); a request held in
  -- flight on ep1 loads it with tokens (token-load-scorer's estimate).
  local function gated(params, source_plugins, opts)
    local plugins = { { type = "prefix-cache-scorer", parameters = { blockSize = 4,
      autoTune = false } }, { type = "token-load-scorer" },
      { type = "prefix-cache-affinity-filter", parameters = params },
      { type = "spec-scores-picker" } }
    for _, p in ipairs(source_plugins or {}) do
      table.insert(plugins, 1, p)
    end
    rt = S.loaded({ plugins = plugins, schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "prefix-cache-affinity-filter" }, { pluginRef = "token-load-scorer" },
      { pluginRef = "spec-scores-picker" } } } } }, opts)
    S.endpoints(rt, 3)
    P.request(rt, "aaaa", { subset = { "ep1" } })
    local held = assert(rt:begin({ path = "/v1/completions", subset = { "ep1" },
      body = '{"model":"m","prompt":"' .. ("z"):rep(4000) .. '","max_tokens":10}' }))
    assert.equal(200, held:schedule().status)
    local _, scores = P.request(rt, "aaaa")
    held:finish("ok")
    local names = {}
    for name in pairs(scores) do
      names[#names + 1] = name
    end
    table.sort(names)
    return table.concat(names, ",")
  end

  it("keeps all when the sticky endpoint's TTFT from its tokens in flight costs too much", function()
    -- 1010 tokens at 1,000 tokens/s: 1,010 ms against 0 ms elsewhere
    local p = { explorationProbability = 0, peakPrefillThroughput = 1000 }
    p.maxTTFTPenaltyMs = 500
    assert.equal("ep1,ep2,ep3", gated(p))
    p.maxTTFTPenaltyMs = 2000
    assert.equal("ep1", gated(p))
    p.maxTTFTPenaltyMs = 0 -- always stick
    assert.equal("ep1", gated(p))
  end)

  it("takes the TTFT from predicted-latency-producer's predictions (latencyPredictor)", function()
    local dir = S.tmpdir()
    S.write(dir .. "/spec-fake-predictions.lua", [[
      return {
        type = "spec-fake-predictions",
        schema = { ttft = { type = "any" } },
        prepare = function(self, ctx, endpoints)
          local eps = {}
          for _, ep in ipairs(endpoints) do
            local t = self.params.ttft[ep.name]
            eps[ep.id] = t and { ttft = t } or nil
          end
          ctx.shared["predicted-latency"] = { slo = {}, prefix = {}, endpoints = eps }
        end,
      }]])
    local opts = { plugin_dirs = { S.FIXTURES, dir } }
    local p = { explorationProbability = 0, ttftSource = "latencyPredictor", maxTTFTPenaltyMs = 100 }
    local fake = function(t) return { { type = "spec-fake-predictions", parameters = { ttft = t } } } end
    assert.equal("ep1,ep2,ep3", gated(p, fake({ ep1 = 900, ep2 = 50, ep3 = 700 }), opts))
    assert.equal("ep1", gated(p, fake({ ep1 = 120, ep2 = 50, ep3 = 700 }), opts))
    -- the sticky endpoint without a prediction: no comparison, it sticks
    assert.equal("ep1", gated(p, fake({ ep2 = 50 }), opts))
  end)

  it("reads predicted-latency-producer's matches when no prefix scorer of its name ran", function()
    rt = S.loaded({ plugins = { { type = "predicted-latency-producer" },
      { type = "prefix-cache-affinity-filter", parameters = { explorationProbability = 0,
        affinityThreshold = 0.99 } }, { type = "spec-scores-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "prefix-cache-affinity-filter" }, { pluginRef = "spec-scores-picker" } } } } })
    S.endpoints(rt, 3)
    local prompt = ("abcd"):rep(64)
    P.request(rt, prompt, { subset = { "ep3" } })
    local _, scores = P.request(rt, prompt)
    assert.same({ ep3 = 0 }, scores)
  end)
end)
