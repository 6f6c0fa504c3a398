-- prefix-based-pd-decider's decision, called as disagg-profile-handler calls
-- it.  Vectors from llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler_test.go
-- TestHandler_Pick_PD (prompt "hello world hello world hello world", 35
-- characters = 8 tokens, nonCachedTokens 4) and prefix_based_pd_decider.go.
local S = require "support"
local P = require "prefix_support"

-- disaggregate() for a prompt with `cached` tokens matched on the decode
-- endpoint (blocks of 4 characters, one token each), published under
-- `source` (default the prefix-cache-scorer's name); cached = false: no
-- prefix plugin ran.
local function decide(params, prompt, cached, source)
  local rt = S.runtime()
  local v = S.eval(rt, ([[
    local m = require("lupin.generation.loader").load(%q, "prefix-based-pd-decider")
    local p = assert(require("lupin.schema").validate(m.schema, require("cjson").decode(%q)))
    local self = m.new(p, { log = function() end })
    local shared = {}
    if %s then
      shared[%q] = { block_size = 4, matches = { [7] = %d } }
    end
    local ctx = { request = { prompt = %q }, shared = shared }
    return m.disaggregate(setmetatable(self, { __index = m }), ctx, { id = 7 })
  ]]):format(S.ROOT .. "/plugins/prefix-based-pd-decider.lua",
    S.json.encode(params), tostring(cached ~= false), source or "prefix-cache-scorer",
    cached or 0, prompt))
  rt:free()
  return v
end

local HELLO = "hello world hello world hello world"

describe("prefix-based-pd-decider", function()
  it("has upstream's defaults: nonCachedTokens and promptTokens 0, refuses negatives", function()
    assert.same({ nonCachedTokens = 0, promptTokens = 0 }, P.defaults("prefix-based-pd-decider"))
    assert.matches("parameters.nonCachedTokens: must be an integer ≥ 0, got %-1",
      P.config_error("prefix-based-pd-decider", { nonCachedTokens = -1 }))
    assert.matches("parameters.promptTokens: must be an integer ≥ 0, got %-1",
      P.config_error("prefix-based-pd-decider", { nonCachedTokens = 5, promptTokens = -1 }))
  end)

  -- llm-d-router .../profilehandler/disagg/prefix_based_pd_decider_test.go,
  -- TestDisaggregate: a 10-token prompt (40 characters), `cached` of them on the
  -- decode endpoint
  it("decides as TestDisaggregate expects", function()
    local TEN = ("x"):rep(40)
    local function d(non_cached, prompt_tokens, cached)
      return decide({ nonCachedTokens = non_cached, promptTokens = prompt_tokens }, TEN, cached)
    end
    assert.is_false(d(0, 0, 5)) -- threshold zero disables disaggregation
    assert.is_false(d(5, 20, 0)) -- input shorter than promptTokens
    assert.is_false(d(20, 0, 0)) -- input shorter than nonCachedTokens
    assert.is_true(d(5, 10, 5)) -- input equals promptTokens
    assert.is_false(d(5, 0, 8)) -- non-cached suffix below threshold
    assert.is_true(d(5, 0, 5)) -- equals threshold
    assert.is_true(d(3, 0, 2)) -- above threshold
    assert.is_false(d(1, 0, 10)) -- fully cached prompt
    assert.is_true(d(5, 0, 0)) -- no cache hit at all
  end)

  -- TestHandler_Pick_PD "enough uncached tokens → run prefill" (8 - 2 ≥ 4) and
  -- "short uncached suffix → skip prefill" (8 - 5 < 4)
  it("disaggregates when the uncached part reaches nonCachedTokens", function()
    assert.is_true(decide({ nonCachedTokens = 4 }, HELLO, 2))
    assert.is_false(decide({ nonCachedTokens = 4 }, HELLO, 5))
    assert.is_true(decide({ nonCachedTokens = 4 }, HELLO, 4)) -- 8 - 4 = 4: at the bound
  end)

  -- prefix_based_pd_decider.go: "A value of 0 disables disaggregation" and
  -- "Input is shorter than the nonCachedToken"
  it("never disaggregates with 0, nor a prompt shorter than nonCachedTokens", function()
    assert.is_false(decide({ nonCachedTokens = 0 }, HELLO, 0))
    assert.is_false(decide({ nonCachedTokens = 9 }, HELLO, 0)) -- 8 tokens < 9
    assert.is_true(decide({ nonCachedTokens = 8 }, HELLO, 0))
  end)

  -- upstream always has match info (it creates a producer when none is
  -- configured); lupin without a prefix plugin counts nothing as cached
  it("counts nothing cached when no prefix plugin published matches", function()
    assert.is_true(decide({ nonCachedTokens = 4 }, HELLO, false))
  end)

  it("reads the approx-prefix-cache-producer's matches, or the plugin named", function()
    assert.is_false(decide({ nonCachedTokens = 4 }, HELLO, 8, "approx-prefix-cache-producer"))
    assert.is_false(decide({ nonCachedTokens = 4, prefixPluginName = "mine" }, HELLO, 8, "mine"))
    -- named, but that plugin published nothing: nothing cached
    assert.is_true(decide({ nonCachedTokens = 4, prefixPluginName = "other" }, HELLO, 8, "mine"))
  end)
end)
