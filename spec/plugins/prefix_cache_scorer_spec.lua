local S = require "support"
local P = require "prefix_support"

local function scorer(params)
  return P.config({ { type = "prefix-cache-scorer", parameters = params } })
end

describe("prefix-cache-scorer", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  it("has the EPP's defaults", function()
    assert.same({ maxPrefixBlocksToMatch = 256, lruCapacityPerServer = 31250, autoTune = true,
      matchLengthWeight = 0, matchLengthScaleTokens = 8192 }, P.defaults("prefix-cache-scorer"))
    -- blockSize (and its alias) default to 64: 64 characters make one block
    rt = S.loaded(scorer({ autoTune = false }))
    S.endpoints(rt, 2)
    local x63, x64 = ("x"):rep(63), ("x"):rep(64)
    P.request(rt, x64, { subset = { "ep2" } })
    assert.same({ ep1 = 0, ep2 = 0 }, select(2, P.request(rt, x63)))
    assert.same({ ep1 = 0, ep2 = 1 }, select(2, P.request(rt, x64)))
  end)

  it("refuses the precise mode's parameters and other modes, naming the precise scorer", function()
    for _, k in ipairs({ "kvEventsConfig", "indexerConfig" }) do
      assert.matches(k .. " is not supported here: lupin's prefix%-cache%-scorer is the"
        .. " approximate mode;.*use precise%-prefix%-cache%-scorer",
        P.config_error("prefix-cache-scorer", { [k] = {} }))
    end
    assert.matches('mode "estimate" is not supported here: use mode "approximate"',
      P.config_error("prefix-cache-scorer", { mode = "estimate" }))
  end)

  it("loads llm-d v0.4's mode cache_tracking as precise-prefix-cache-scorer, with a warning",
    function()
      rt = S.runtime()
      local ok, err = rt:load_string(S.json.encode(scorer({ mode = "cache_tracking",
        kvEventsConfig = { zmqEndpoint = "tcp://127.0.0.1:5557" },
        indexerConfig = { tokenizersPoolConfig = {} } })), "spec.json")
      assert(ok, err)
      local renamed, precise = false, false
      for _, l in ipairs(rt:logs()) do
        renamed = renamed or l[2]:find('plugins[1].parameters.mode: mode "cache_tracking" is'
          .. " llm-d's earlier precise mode: loaded as precise-prefix-cache-scorer", 1, true) ~= nil
        -- the precise scorer read the parameters: its own warning names them
        precise = precise or l[2]:find("(precise-prefix-cache-scorer): indexerConfig"
          .. ".tokenizersPoolConfig is not acted on", 1, true) ~= nil
      end
      assert.is_true(renamed)
      assert.is_true(precise)
    end)

  it("refuses parameters out of bounds with config errors", function()
    assert.matches("parameters.blockSize: must be an integer between 1 and 1048576, got 2000000",
      P.config_error("prefix-cache-scorer", { blockSize = 2000000 }))
    assert.matches("parameters.hashBlockSize: must be an integer between 1 and 1048576, got 2.5",
      P.config_error("prefix-cache-scorer", { hashBlockSize = 2.5 }))
    assert.matches("parameters.maxPrefixBlocksToMatch: must be an integer between 1 and",
      P.config_error("prefix-cache-scorer", { maxPrefixBlocksToMatch = 1.5 }))
    assert.matches("parameters.lruCapacityPerServer: must be an integer between 1 and",
      P.config_error("prefix-cache-scorer", { lruCapacityPerServer = 2 ^ 31 }))
    assert.matches('parameters.autoTune: must be a boolean, got "yes"',
      P.config_error("prefix-cache-scorer", { autoTune = "yes" }))
    assert.matches('unknown parameter "blocksize"',
      P.config_error("prefix-cache-scorer", { blocksize = 4 }))
    assert.matches("blockSize %(4%) and hashBlockSize %(8%) are the same parameter; give one",
      P.config_error("prefix-cache-scorer", { blockSize = 4, hashBlockSize = 8 }))
  end)

  -- llm-d-router pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin_test.go,
  -- TestPrefixPluginScoreWithWeights: weight 0.5, scale 100 tokens; 5 of 10 one-token
  -- blocks score 0.5 × 0.05² + 0.5 × 0.5 = 0.25125, 50 of 100 score 0.375.  Here a
  -- block of 4 characters is one token.
  it("weighs the match's length with matchLengthWeight, as TestPrefixPluginScoreWithWeights",
    function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false, matchLengthWeight = 0.5,
      matchLengthScaleTokens = 100 }))
    S.endpoints(rt, 2)
    local function blocks(from, to)
      local out = {}
      for i = from, to do
        out[#out + 1] = ("%04d"):format(i)
      end
      return table.concat(out)
    end
    P.request(rt, blocks(1, 5), { subset = { "ep1" } })
    local _, scores = P.request(rt, blocks(1, 10))
    assert.near(0.25125, scores.ep1, 1e-6)
    assert.equal(0, scores.ep2)
    P.request(rt, blocks(1001, 1050), { subset = { "ep2" } })
    _, scores = P.request(rt, blocks(1001, 1100))
    assert.near(0.375, scores.ep2, 1e-6)
    assert.equal(0, scores.ep1)
  end)

  -- TestPrefixPluginFactoryValidation
  it("validates matchLengthWeight and matchLengthScaleTokens as upstream", function()
    assert.matches("parameters.matchLengthWeight: must be a number between 0 and 1, got %-0.1",
      P.config_error("prefix-cache-scorer", { matchLengthWeight = -0.1, matchLengthScaleTokens = 100 }))
    assert.matches("parameters.matchLengthWeight: must be a number between 0 and 1, got 1.1",
      P.config_error("prefix-cache-scorer", { matchLengthWeight = 1.1, matchLengthScaleTokens = 100 }))
    assert.matches("matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0, got 0",
      P.config_error("prefix-cache-scorer", { matchLengthWeight = 0.5, matchLengthScaleTokens = 0 }))
    for _, ok in ipairs({ { matchLengthWeight = 0.5 }, { matchLengthWeight = 0 },
      { matchLengthWeight = 0.5, matchLengthScaleTokens = 100 } }) do
      rt = S.loaded(scorer(ok))
      rt:free()
    end
    rt = nil
  end)

  it("scores the issue's sequence: 0.5, then 2/3, then 0 for another model", function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
    S.endpoints(rt, 3)
    local pick, scores = P.request(rt, "aaaaaa", { subset = { "ep1" } })
    assert.equal("ep1", pick)
    assert.same({ ep1 = 0 }, scores)
    pick, scores = P.request(rt, "aaaabbbb")
    assert.equal("ep1", pick)
    assert.same({ ep1 = 0.5, ep2 = 0, ep3 = 0 }, scores)
    pick, scores = P.request(rt, "aaaabbbbcccc")
    assert.equal("ep1", pick)
    assert.near(2 / 3, scores.ep1, 1e-8)
    assert.same({ 0, 0 }, { scores.ep2, scores.ep3 })
    assert.same({ ep1 = 0, ep2 = 0, ep3 = 0 }, select(2, P.request(rt, "aaaabbbbcccc",
      { model = "other" })))
  end)

  it("scores 0 everywhere when the prompt has no full block", function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "abc", { subset = { "ep1" } })
    assert.same({ ep1 = 0, ep2 = 0 }, select(2, P.request(rt, "abc")))
  end)

  it("takes the EPP's hashBlockSize as blockSize", function()
    rt = S.loaded(scorer({ hashBlockSize = 4, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "aaaaaa", { subset = { "ep2" } })
    assert.same({ ep1 = 0, ep2 = 0.5 }, select(2, P.request(rt, "aaaabbbb")))
  end)

  it("matches at most maxPrefixBlocksToMatch blocks", function()
    rt = S.loaded(scorer({ blockSize = 4, maxPrefixBlocksToMatch = 2, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "aaaabbbbcccc", { subset = { "ep1" } })
    assert.same({ ep1 = 1, ep2 = 0 }, select(2, P.request(rt, "aaaabbbbdddd")))
  end)

  it("remembers lruCapacityPerServer blocks per endpoint, the start of a prompt longest", function()
    rt = S.loaded(scorer({ blockSize = 4, lruCapacityPerServer = 2, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "aaaabbbbcccc", { subset = { "ep1" } })
    assert.near(2 / 3, select(2, P.request(rt, "aaaabbbbcccc", { subset = { "ep1" } })).ep1, 1e-8)
  end)

  it("with autoTune takes block size and capacity from the endpoints' metrics", function()
    rt = S.loaded(scorer({ blockSize = 64 }))
    S.endpoints(rt, 2, { { cache_block_size = 1, num_blocks = 1 }, { cache_block_size = 1 } })
    -- 1 token per block = 4 characters; ep1 keeps 1 block, ep2 the default 31250
    P.request(rt, "aaaabbbb", { subset = { "ep1" } })
    P.request(rt, "aaaabbbb", { subset = { "ep2" } })
    assert.same({ ep1 = 0.5, ep2 = 1 }, select(2, P.request(rt, "aaaabbbb", { subset = { "ep1", "ep2" } })))
  end)

  it("with autoTune takes the block size of the first endpoint reporting one, else its own", function()
    rt = S.loaded(scorer({ blockSize = 64 }))
    S.endpoints(rt, 2, { { cache_block_size = 0 }, { cache_block_size = 1 } })
    P.request(rt, "aaaabbbb", { subset = { "ep2" } })
    -- ep1 reports no size: ep2's 1 token (4 characters) holds for both
    assert.same({ ep1 = 0, ep2 = 1 }, select(2, P.request(rt, "aaaabbbb", { subset = { "ep1", "ep2" } })))
    rt:free()
    rt = S.loaded(scorer({ blockSize = 4 }))
    S.endpoints(rt, 2, { { cache_block_size = 0 }, { cache_block_size = 0 } })
    P.request(rt, "aaaabbbb", { subset = { "ep1" } })
    assert.same({ ep1 = 1, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb", { subset = { "ep1", "ep2" } })))
  end)

  it("ignores the metrics with autoTune off", function()
    rt = S.loaded(scorer({ blockSize = 64, autoTune = false }))
    S.endpoints(rt, 1, { { cache_block_size = 1, num_blocks = 1 } })
    P.request(rt, "aaaabbbb")
    assert.same({ ep1 = 0 }, select(2, P.request(rt, "aaaabbbb"))) -- 8 characters: no block of 64
  end)

  it("keeps tenants apart with cache_salt", function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "aaaabbbb", { subset = { "ep1" }, salt = "a" })
    assert.same({ ep1 = 1, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb", { salt = "a" })))
    assert.same({ ep1 = 0, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb", { salt = "b" })))
  end)

  it("lets two chats that share their first turns share leading blocks", function()
    rt = S.loaded(scorer({ blockSize = 8, autoTune = false }))
    S.endpoints(rt, 2)
    local first = { { role = "system", content = ("You are terse. "):rep(8) },
      { role = "user", content = "hello" } }
    P.request(rt, nil, { path = "/v1/chat/completions", messages = first, subset = { "ep2" } })
    local second = { first[1], first[2], { role = "assistant", content = "hi" },
      { role = "user", content = "and now?" } }
    local scores = select(2, P.request(rt, nil, { path = "/v1/chat/completions", messages = second }))
    assert.equal(0, scores.ep1)
    assert.is_true(scores.ep2 > 0.5 and scores.ep2 < 1)
  end)

  it("records nothing and leaks nothing when the request fails between score and pre_request",
    function()
      rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
      S.endpoints(rt, 2)
      local pick, _, res = P.request(rt, "aaaabbbb", { headers = { ["x-spec-fail"] = "1" } })
      assert.is_nil(pick)
      assert.equal(500, res.status)
      local calls = {}
      for _, st in ipairs(rt:plugin_stats()) do
        calls[st.plugin .. "/" .. st.point] = st.calls
      end
      assert.equal(1, calls["prefix-cache-scorer/score"])
      assert.is_nil(calls["prefix-cache-scorer/pre_request"])
      assert.same({ ep1 = 0, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb")))
      assert.equal(0, (rt:check_leaks()))
      assert.equal(0, rt:stats().live_requests)
    end)

  it("gives its hashes back once recorded: each next request hashes into them", function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
    S.endpoints(rt, 2)
    local reused = function()
      return S.eval(rt, [[ return require("lupin.prefix").counters.reused ]])
    end
    local before = reused()
    P.request(rt, ("abcd"):rep(20), { subset = { "ep2" } })
    P.request(rt, ("abcd"):rep(18), { subset = { "ep1" } })
    -- the third prompt shares 18 blocks with ep1's and 18 of its 19 with ep2's: no
    -- hash of a list's previous request is counted
    local _, scores = P.request(rt, ("abcd"):rep(18) .. "wxyz")
    assert.near(18 / 19, scores.ep1, 1e-9) -- JSON carries ~10 digits
    assert.near(18 / 19, scores.ep2, 1e-9)
    assert.equal(2, reused() - before)
    -- a request that fails before pre_request keeps its hashes: nothing is given back
    P.request(rt, ("abcd"):rep(20), { headers = { ["x-spec-fail"] = "1" } })
    P.request(rt, ("abcd"):rep(20))
    assert.equal(3, reused() - before)
  end)

  it("forgets an endpoint removed from the pool", function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "aaaabbbb", { subset = { "ep1" } })
    assert.is_true(rt:remove("ep1"))
    S.endpoints(rt, 1) -- the same name again: a new endpoint with an empty cache
    assert.same({ ep1 = 0, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb")))
  end)

  it("keeps its index across a reload with the same parameters, and not with others", function()
    rt = S.loaded(scorer({ blockSize = 4, autoTune = false }))
    S.endpoints(rt, 2)
    P.request(rt, "aaaabbbb", { subset = { "ep1" } })
    assert(rt:load_string(S.json.encode(scorer({ blockSize = 4, autoTune = false })), "v2"))
    assert.same({ ep1 = 1, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb", { subset = { "ep1", "ep2" } })))
    assert(rt:load_string(S.json.encode(scorer({ blockSize = 2, autoTune = false })), "v3"))
    assert.same({ ep1 = 0, ep2 = 0 }, select(2, P.request(rt, "aaaabbbb")))
    assert.equal(0, (rt:check_leaks()))
  end)
end)
