-- llm-d's context-length-aware scorer and filter, on the vectors of
-- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/contextlengthaware/
-- context_length_aware_test.go and the scores of context_length_aware.go.
-- Lengths are prompt characters × 0.25: lupin has no tokenizer (upstream reads
-- the token-producer's count, 0 without one).
local K = require "plugins.kit"
local S = require "support"

local T = "context-length-aware"
local L = "llm-d.ai/context-length-range"

local function pool(ranges)
  local list = {}
  for i, r in ipairs(ranges) do
    list[i] = { labels = r and { [L] = r } or {} }
  end
  return K.pool(#ranges, list)
end

describe(T, function()
  -- TestContextLengthAwareFilter: an empty prompt is 0 tokens
  it("filters as TestContextLengthAwareFilter expects", function()
    local rt = pool({ "0-100", "100-500", "0-100,500-2000", false })
    local out = K.call(rt, { type = T, params = { enableFiltering = true }, point = "filter",
      prompt = "" })
    assert.same({ "ep1", "ep3", "ep4" }, out.kept)
    -- 2000 characters: 500 tokens, in 100-500 and 500-2000
    out = K.call(rt, { type = T, params = { enableFiltering = true }, point = "filter",
      prompt = ("x"):rep(2000) })
    assert.same({ "ep2", "ep3", "ep4" }, out.kept)
    -- without enableFiltering the filter keeps everything
    out = K.call(rt, { type = T, params = {}, point = "filter", prompt = ("x"):rep(2000) })
    assert.same({ "ep1", "ep2", "ep3", "ep4" }, out.kept)
    rt:free()
  end)

  -- TestContextLengthAwareScore
  it("scores tight ranges over wide ones, 0.5 without the label", function()
    local rt = pool({ "0-20", "0-10000", "500-1000", false, "oops" })
    local s = K.scores(rt, T, {}, { prompt = "" })
    assert.is_true(s.ep1 > s.ep2)
    -- in range: mapped into (0.3, 1], 0.3 + 0.7 × (0.7 × width score + 0.3 × headroom)
    assert.near(0.3 + 0.7 * (0.7 / (1 + 20 / 10000) + 0.3), s.ep1, 1e-12)
    assert.near(0.3 + 0.7 * (0.7 / 2 + 0.3), s.ep2, 1e-12)
    assert.is_true(s.ep2 > 0.3 and s.ep2 > s.ep3)
    -- out of range: 0.3 / (1 + 500 / 1000); the older test's 0 predates the fallback
    assert.near(0.2, s.ep3, 1e-12)
    assert.equal(0.5, s.ep4)
    assert.equal(0, s.ep5) -- a label that does not parse
    rt:free()
  end)

  -- TestCalculateRangeScoreFallback: past every range the largest max wins,
  -- below them the smallest min, and a wide range's match near its top still
  -- beats a miss (14999 tokens: 59996 characters)
  it("falls back as TestCalculateRangeScoreFallback expects", function()
    local function scores(ranges, tokens)
      return K.call(pool(ranges), { type = T, point = "score", prompt = ("x"):rep(tokens * 4) }).list
    end
    local s = scores({ "0-2048", "0-8192" }, 9000)
    assert.is_true(0 < s[1] and s[1] < s[2] and s[2] < 0.3)
    s = scores({ "500-2048", "100-1024" }, 50)
    assert.is_true(0 < s[1] and s[1] < s[2] and s[2] < 0.3)
    s = scores({ "0-15000", "15001-20000" }, 14999)
    assert.is_true(s[1] > 0.3 and s[2] < 0.3)
  end)

  -- TestParseContextRange (one range each); lupin also takes several, comma-separated
  it("parses ranges as TestParseContextRanges expects", function()
    local rt = S.loaded(K.config({ { type = T }, { type = "max-score-picker" } }))
    local function parse(s)
      return K.instance(rt, T, ("return self.parse(%q) or 'error'"):format(s))
    end
    assert.same({ { 0, 100 } }, parse("0-100"))
    assert.same({ { 0, 100 }, { 500, 2000 } }, parse("0-100,500-2000"))
    assert.equal("error", parse(""))
    assert.equal("error", parse("0-100-200"))
    assert.equal("error", parse("100-50"))
    assert.equal("error", parse("abc-100"))
    rt:free()
  end)

  -- TestContextLengthAwareFactory: "empty label should error"
  it("refuses an empty label", function()
    local err = K.load_error({ '{"type": "context-length-aware", "parameters": {"label": ""}}' })
    assert.matches("'label' must be specified", err, 1, true)
  end)
end)
