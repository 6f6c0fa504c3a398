-- llm-d-router's approx-prefix-cache-producer with prefix-cache-scorer
-- reading it (prefixMatchInfoProducerName), through the real runtime.  The
-- vectors are llm-d-inference-scheduler pkg/plugins/scorer/
-- approximate_mode_test.go's (TestApproximateMode_E2E_ExactScores,
-- _SharedPrefix, _ModelScoped, _PreRequestPDDisaggregation's primary half):
-- blockSizeTokens 1 is 4 characters a block in both.
local S = require "support"

local function runtime(producer)
  local rt = S.loaded({
    plugins = {
      { type = "approx-prefix-cache-producer", name = "approx", parameters = producer or
        { blockSizeTokens = 1, maxPrefixBlocksToMatch = 256, maxPrefixTokensToMatch = 0,
          lruCapacityPerServer = 100, autoTune = false } },
      { type = "prefix-cache-scorer", parameters = { prefixMatchInfoProducerName = "approx" } },
      { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "prefix-cache-scorer" },
      { pluginRef = "max-score-picker" } } } },
  })
  S.endpoints(rt, 2)
  return rt
end

-- One request through the whole lifecycle; the prefix scores it saw and
-- where it went.
local function send(rt, prompt, model)
  local req = assert(rt:begin({ path = "/v1/completions", explain = true,
    body = S.json.encode({ model = model or "test-model", prompt = prompt }) }))
  local res = req:schedule()
  local x = S.json.decode(req:explain())
  req:response_header(200, {})
  req:response_complete()
  req:finish("ok")
  local scores = {}
  for _, s in ipairs(x.profiles[1].scorers[1].scores) do
    scores[s.endpoint] = s.raw
  end
  return scores, res.picks[1].name
end

describe("approx-prefix-cache-producer", function()
  it("TestApproximateMode_E2E_ExactScores: 0 first, then 4/4 where it went", function()
    local rt = runtime()
    local first, went = send(rt, "aaaabbbbccccdddd")
    assert.same({ ep1 = 0, ep2 = 0 }, first)
    local second = send(rt, "aaaabbbbccccdddd")
    local other = went == "ep1" and "ep2" or "ep1"
    assert.equal(1, second[went])
    assert.equal(0, second[other])
    rt:free()
  end)

  it("TestApproximateMode_SharedPrefix: 4 of 8 blocks", function()
    local rt = runtime()
    local _, went = send(rt, "aaaabbbbccccdddd")
    assert.equal(0.5, (send(rt, "aaaabbbbccccddddeeeeffffgggghhhh"))[went])
    rt:free()
  end)

  it("TestApproximateMode_ModelScoped: another model shares nothing", function()
    local rt = runtime()
    local _, went = send(rt, "aaaabbbbccccdddd", "model-a")
    assert.equal(0, (send(rt, "aaaabbbbccccdddd", "model-b"))[went])
    rt:free()
  end)

  it("maps tokens onto characters: 16-token blocks are 64 characters, capped by tokens", function()
    local rt = runtime({ autoTune = false, maxPrefixTokensToMatch = 32 })
    local self = S.eval(rt, [[
      local g = require("lupin.runtime").current
      local o = g.by_name.approx.obj
      return { block = o.block, max_blocks = o.max_blocks, capacity = o.capacity }]])
    assert.same({ block = 64, max_blocks = 2, capacity = 31250 }, self)
    rt:free()
  end)

  it("a scorer without a producer name reads the one producer, whatever the order", function()
    local rt = S.loaded({
      plugins = {
        { type = "prefix-cache-scorer" },
        { type = "approx-prefix-cache-producer", parameters = { blockSizeTokens = 1,
          autoTune = false } },
        { type = "max-score-picker" } },
    })
    S.endpoints(rt, 2)
    local _, went = send(rt, "aaaabbbbccccdddd")
    assert.equal(1, (send(rt, "aaaabbbbccccdddd"))[went])
    assert.equal("approx-prefix-cache-producer", S.eval(rt, [[
      return require("lupin.runtime").current.by_name["prefix-cache-scorer"].obj.producer]]))
    rt:free()
  end)

  it("a scorer naming no producer fails the load at its line", function()
    local rt = S.runtime()
    local ok, err = rt:load_string(S.json.encode({ plugins = {
      { type = "prefix-cache-scorer", parameters = { prefixMatchInfoProducerName = "nope" } } } }),
      "cfg.json")
    rt:free()
    assert.is_nil(ok)
    assert.matches('^cfg.json:1: plugins%[0%]%.parameters%.prefixMatchInfoProducerName: plugin '
      .. '"prefix%-cache%-scorer" %(prefix%-cache%-scorer%): prefixMatchInfoProducerName "nope" '
      .. "names no approx%- or precise%-prefix%-cache%-producer instance$", err)
  end)
end)

describe("prefix-cache-scorer's precise modes", function()
  for _, p in ipairs({ { mode = "precise" }, { kvEventsConfig = { topicFilter = "kv@" } },
    { indexerConfig = {} } }) do
    local k = next(p)
    it("refuses " .. k .. " with why", function()
      local rt = S.runtime()
      local ok, err = rt:load_string(S.json.encode({ plugins = { { type = "prefix-cache-scorer",
        parameters = p } } }), "cfg.json")
      rt:free()
      assert.is_nil(ok)
      assert.matches("is not supported", err, 1, true)
      assert.matches("KV", err, 1, true)
    end)
  end

  it("takes mode: approximate, what it does anyway", function()
    local rt = S.runtime()
    assert(rt:load_string(S.json.encode({ plugins = { { type = "prefix-cache-scorer",
      parameters = { mode = "approximate" } } } }), "cfg.json"))
    rt:free()
  end)
end)
