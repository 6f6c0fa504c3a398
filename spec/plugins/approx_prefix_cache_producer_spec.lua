-- llm-d-router's approx-prefix-cache-producer with prefix-cache-scorer
-- reading it (prefixMatchInfoProducerName), through the real runtime.  The
-- vectors are llm-d-inference-scheduler pkg/plugins/scorer/
-- approximate_mode_test.go's (TestApproximateMode_E2E_ExactScores,
-- _SharedPrefix, _ModelScoped, _PreRequestPDDisaggregation's primary half),
-- and llm-d-router .../dataproducer/approximateprefix/plugin_test.go's.  A
-- block is at least 64 tokens now (upstream's minBlockSizeTokens, which its
-- tests lower; lupin's cannot be), 256 characters: B("a") is one block.
local S = require "support"

local function B(c)
  return c:rep(256)
end

local function runtime(producer)
  local rt = S.loaded({
    plugins = {
      { type = "approx-prefix-cache-producer", name = "approx", parameters = producer or
        { blockSizeTokens = 64, maxPrefixBlocksToMatch = 256, maxPrefixTokensToMatch = 0,
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
    local first, went = send(rt, B("a") .. B("b") .. B("c") .. B("d"))
    assert.same({ ep1 = 0, ep2 = 0 }, first)
    local second = send(rt, B("a") .. B("b") .. B("c") .. B("d"))
    local other = went == "ep1" and "ep2" or "ep1"
    assert.equal(1, second[went])
    assert.equal(0, second[other])
    rt:free()
  end)

  it("TestApproximateMode_SharedPrefix: 4 of 8 blocks", function()
    local rt = runtime()
    local _, went = send(rt, B("a") .. B("b") .. B("c") .. B("d"))
    assert.equal(0.5, (send(rt, B("a") .. B("b") .. B("c") .. B("d") .. B("e") .. B("f") .. B("g") .. B("h")))[went])
    rt:free()
  end)

  it("TestApproximateMode_ModelScoped: another model shares nothing", function()
    local rt = runtime()
    local _, went = send(rt, B("a") .. B("b") .. B("c") .. B("d"), "model-a")
    assert.equal(0, (send(rt, B("a") .. B("b") .. B("c") .. B("d"), "model-b"))[went])
    rt:free()
  end)

  -- What the producer publishes for a 4-block prompt: block characters and
  -- blocks hashed.
  local function produced(params, metrics)
    local rt = runtime(params)
    if metrics then
      rt:set_metrics("ep1", metrics)
    end
    local out = S.eval(rt, ([[
      local o = require("lupin.runtime").current.by_name.approx.obj
      local ctx = { plugin = {}, shared = {}, request = { prompt = %q, model = "m", body = {} } }
      o:prepare(ctx, require("lupin.runtime.pool").list)
      local st = ctx.shared.approx
      return { st.block_size, st.total }]]):format(B("a") .. B("b") .. B("c") .. B("d")))
    rt:free()
    return out
  end

  -- plugin_test.go TestGetBlockSize_* (configured, default and reported sizes
  -- under 64 tokens clamped, 128 kept) and TestFactory_DeprecatedBlockSizeMapped
  -- (blockSize is blockSizeTokens' old name)
  it("uses blocks of at least 64 tokens (256 characters), however set", function()
    assert.equal(256, produced({ autoTune = false, blockSizeTokens = 32 })[1])
    assert.equal(256, produced({ autoTune = false })[1]) -- the default 16
    assert.equal(512, produced({ autoTune = false, blockSizeTokens = 128 })[1])
    assert.equal(512, produced({ autoTune = false, blockSize = 128 })[1])
    assert.equal(256, produced({ autoTune = true }, { cache_block_size = 16 })[1])
    assert.equal(512, produced({ autoTune = true }, { cache_block_size = 128 })[1])
  end)

  -- TestMaxPrefixTokensToMatch, TestMaxPrefixBothCapsZeroMatchesEverything: the
  -- token cap counts blocks at the block size in use; both caps 0: no cap
  it("caps the blocks hashed by tokens, else by blocks, else not at all", function()
    assert.equal(2, produced({ autoTune = false, maxPrefixTokensToMatch = 128 })[2])
    assert.equal(3, produced({ autoTune = false, maxPrefixTokensToMatch = 0,
      maxPrefixBlocksToMatch = 3 })[2])
    assert.equal(4, produced({ autoTune = false, maxPrefixTokensToMatch = 0,
      maxPrefixBlocksToMatch = 0 })[2])
    assert.equal(0, produced({ autoTune = false, maxPrefixTokensToMatch = 32 })[2]) -- < 1 block
  end)

  it("logs a configured block size under the minimum", function()
    local rt = runtime({ autoTune = false, blockSizeTokens = 16 })
    local logged
    for _, l in ipairs(rt:logs()) do
      logged = logged or l[2]:find("blockSizeTokens 16 is below the minimum: blocks of 64"
        .. " tokens are used", 1, true)
    end
    rt:free()
    assert.truthy(logged)
  end)

  it("a scorer without a producer name reads the one producer, whatever the order", function()
    local rt = S.loaded({
      plugins = {
        { type = "prefix-cache-scorer" },
        { type = "approx-prefix-cache-producer", parameters = { blockSizeTokens = 64,
          autoTune = false } },
        { type = "max-score-picker" } },
    })
    S.endpoints(rt, 2)
    local _, went = send(rt, B("a") .. B("b") .. B("c") .. B("d"))
    assert.equal(1, (send(rt, B("a") .. B("b") .. B("c") .. B("d")))[went])
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
