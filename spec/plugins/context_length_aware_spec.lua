-- llm-d's context-length-aware scorer and filter, on the vectors of
-- llm-d-inference-scheduler pkg/plugins/multi/context_length_aware_test.go
-- and the scores of context_length_aware.go.  Lengths are prompt characters
-- × 0.25 (upstream's estimate without a tokenizer).
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
    assert.near(0.7 / (1 + 20 / 10000) + 0.3, s.ep1, 1e-12)
    assert.near(0.7 / 2 + 0.3, s.ep2, 1e-12)
    -- out of range: 0.3 / (1 + 500 / 1000); the older test's 0 predates the fallback
    assert.near(0.2, s.ep3, 1e-12)
    assert.equal(0.5, s.ep4)
    assert.equal(0, s.ep5) -- a label that does not parse
    rt:free()
  end)

  -- TestParseContextRanges
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
    rt:free()
  end)

  -- TestContextLengthAwareFactory: "empty label should error"
  it("refuses an empty label", function()
    local err = K.load_error({ '{"type": "context-length-aware", "parameters": {"label": ""}}' })
    assert.matches("'label' must be specified", err, 1, true)
  end)
end)
