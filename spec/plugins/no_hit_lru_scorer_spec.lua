local S = require "support"
local P = require "prefix_support"

-- The prefix scorer runs (prepare, pre_request) without being in the profile,
-- so the scores seen are the no-hit scorer's alone.
local function config(params, prefix_name)
  return {
    plugins = {
      { type = "prefix-cache-scorer", name = prefix_name,
        parameters = { blockSize = 4, autoTune = false } },
      { type = "no-hit-lru-scorer", parameters = params },
      { type = "spec-scores-picker" },
    },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "no-hit-lru-scorer" },
      { pluginRef = "spec-scores-picker" } } } },
  }
end

describe("no-hit-lru-scorer", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  local function start(n, params, prefix_name)
    rt = S.loaded(config(params, prefix_name))
    S.endpoints(rt, n)
  end

  local function scores(prompt)
    local pick, sc = P.request(rt, prompt)
    return sc, pick
  end

  it("has llm-d's defaults and refuses bad parameters", function()
    assert.same({ lruSize = 1024, prefixPluginName = "prefix-cache-scorer" },
      P.defaults("no-hit-lru-scorer"))
    assert.matches("parameters.lruSize: must be an integer between 1 and 1048576, got 2000000",
      P.config_error("no-hit-lru-scorer", { lruSize = 2000000 }))
    assert.matches("parameters.prefixPluginName: must be a string, got 1",
      P.config_error("no-hit-lru-scorer", { prefixPluginName = 1 }))
  end)

  it("spreads cold requests: never used first, then least recently used, 1 - rank/(n-1)", function()
    start(3)
    assert.same({ ep1 = 1, ep2 = 0.5, ep3 = 0 }, scores("aaaa"))
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 0.5 }, scores("bbbb"))
    assert.same({ ep1 = 0.5, ep2 = 0, ep3 = 1 }, scores("cccc"))
    assert.same({ ep1 = 1, ep2 = 0.5, ep3 = 0 }, scores("dddd"))
  end)

  it("gives 0.5 to all for a request with a prefix hit, and leaves the LRU alone", function()
    start(3)
    scores("aaaa") -- ep1
    assert.same({ ep1 = 0.5, ep2 = 0.5, ep3 = 0.5 }, scores("aaaabbbb"))
    -- the warm request went to ep1 (first on ties) without moving it: ep2 is next
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 0.5 }, scores("zzzz"))
  end)

  it("gives 1 to a lone endpoint", function()
    start(1)
    assert.same({ ep1 = 1 }, scores("aaaa"))
    assert.same({ ep1 = 1 }, scores("bbbb"))
  end)

  it("forgets endpoints past lruSize: they count as never used", function()
    start(3, { lruSize = 1 })
    scores("aaaa") -- ep1
    scores("bbbb") -- ep2; ep1 falls out
    assert.same({ ep1 = 1, ep2 = 0, ep3 = 0.5 }, scores("cccc"))
  end)

  -- llm-d-router .../scorer/nohitlru/no_hit_lru_test.go, TestNoPrefixCacheStateFound
  -- (a lone endpoint scores 1.0) and TestNoHitLRUFactoryDependencyValidation
  -- ("missing prefix cache plugin - should work as optimization").
  it("reads the prefix scorer named prefixPluginName; without it every request is cold",
    function()
    start(2, { prefixPluginName = "my-prefix" }, "my-prefix")
    assert.same({ ep1 = 1, ep2 = 0 }, scores("aaaa"))
    rt:free()
    start(2, { prefixPluginName = "nope" })
    assert.same({ ep1 = 1, ep2 = 0 }, scores("aaaa"))
    assert.same({ ep1 = 0, ep2 = 1 }, scores("aaaa")) -- cold again: the LRU moved
    for _, st in ipairs(rt:plugin_stats()) do
      assert.equal(0, st.errors, st.plugin)
    end
    rt:free()
    start(1, { prefixPluginName = "nope" })
    assert.same({ ep1 = 1 }, scores("aaaa"))
  end)

  -- llm-d-router's no_hit_lru.go reads the match info of the producer named
  -- prefixMatchInfoProducerName; prefixPluginType is deprecated, never used.
  it("reads the producer named prefixMatchInfoProducerName before prefixPluginName", function()
    local cfg = config({ prefixPluginName = "nope", prefixMatchInfoProducerName = "approx",
      prefixPluginType = "prefix-cache-scorer" })
    table.insert(cfg.plugins, 1, { type = "approx-prefix-cache-producer", name = "approx",
      parameters = { autoTune = false } })
    rt = S.loaded(cfg)
    S.endpoints(rt, 2)
    local long = ("a"):rep(600) -- a few of the producer's 256-character blocks
    assert.same({ ep1 = 1, ep2 = 0 }, scores(long)) -- cold: ep1 takes it
    assert.same({ ep1 = 0.5, ep2 = 0.5 }, scores(long)) -- warm on ep1: no opinion
    assert.same({ ep1 = 0, ep2 = 1 }, scores(("b"):rep(600))) -- cold again: ep2
  end)

  -- TestNoHitLRUPrefillDecodeTracking "P/D scenario - both profiles tracked
  -- separately": a cold request's prefill endpoint moves in the LRU too.
  it("records the prefill profile's endpoint of a cold request as well", function()
    start(4)
    local out = S.eval(rt, ([[
      local m = require("lupin.generation.loader").load(%q, "no-hit-lru-scorer")
      local self = m.new(assert(require("lupin.schema").validate(m.schema, {})), {})
      local eps = require("lupin.runtime.pool").list -- decode: ep1, ep2; prefill: ep3, ep4
      local ctx = { shared = {}, plugin = {} }
      m.score(self, ctx, eps)
      m.pre_request(self, ctx, { primary = "decode", profiles = {
        decode = { endpoints = { eps[1] } }, prefill = { endpoints = { eps[3] } } } })
      local ctx2 = { shared = {}, plugin = {} }
      return { decode = m.score(self, ctx2, { eps[1], eps[2] }),
        prefill = m.score(self, ctx2, { eps[3], eps[4] }) }
    ]]):format(S.ROOT .. "/plugins/no-hit-lru-scorer.lua"))
    assert.same({ 0, 1 }, out.decode)
    assert.same({ 0, 1 }, out.prefill)
  end)

  it("keeps its LRU across a reload", function()
    start(3)
    scores("aaaa") -- ep1
    scores("bbbb") -- ep2
    assert(rt:load_string(S.json.encode(config()), "v2"))
    assert.same({ ep1 = 0.5, ep2 = 0, ep3 = 1 }, scores("cccc"))
  end)
end)
