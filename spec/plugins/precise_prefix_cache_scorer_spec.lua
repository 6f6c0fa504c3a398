-- precise-prefix-cache-scorer (and lupin.precise, which the producer shares)
-- through the real runtime.  What the host does — hear the engines' events
-- and tokenize — is played here through the same calls: blocks recorded in
-- the keyed index the plugin reads (lupin_shared_prefix_apply's index),
-- token ids put in the token cache (lupin_shared_tokens_put's).
local S = require "support"

local BLOCK = 16

local function config(params, extra)
  local plugins = { { type = "precise-prefix-cache-scorer", name = "precise",
    parameters = params or { tokenProcessorConfig = { blockSize = BLOCK } } },
    { type = "max-score-picker" } }
  for _, p in ipairs(extra or {}) do
    plugins[#plugins + 1] = p
  end
  return { plugins = plugins, schedulingProfiles = { { name = "default", plugins = {
    { pluginRef = "precise" }, { pluginRef = "max-score-picker" } } } } }
end

local function runtime(params)
  local rt = S.loaded(config(params))
  S.endpoints(rt, 3)
  return rt
end

-- What an engine's BlockStored events make the host record: the token
-- blocks of ids (from the chain's start) on endpoint name.
local function stored(rt, name, ids, seed, lora)
  S.eval(rt, ([[
    local prefix = require "lupin.prefix"
    local pool = require "lupin.runtime.pool"
    local x = require("lupin.runtime").current.by_name.precise.obj
    local id
    for _, ep in ipairs(pool.list) do if ep.name == %q then id = ep.id end end
    local h = prefix.token_hashes(%s, prefix.token_seed(%q, %q, ""), %d, 4096)
    x.index:record(id, h)
    prefix.release(h)
    return "ok"]]):format(name, S.json.encode(ids):gsub("%[", "{"):gsub("%]", "}"),
    seed or "", lora or "", BLOCK))
end

-- What the host's tokenize answer puts in the token cache: the ids of the
-- prompt's first `chars` characters, under that prefix's key.
local function tokenized(rt, prompt, chars, ids, model)
  S.eval(rt, ([[
    local prefix = require "lupin.prefix"
    local tokens = require "lupin.tokens"
    local h = prefix.hashes(%q, %q, "", 64, 4096)
    tokens.put(prefix.key(h, %d - 1), %s)
    prefix.release(h)
    return "ok"]]):format(prompt, model or "m", chars / 64,
    S.json.encode(ids):gsub("%[", "{"):gsub("%]", "}")))
end

local function ids(n, from)
  local t = {}
  for i = 1, n do
    t[i] = (from or 1000) + i
  end
  return t
end

-- One request through the lifecycle: the scores, where it went, the
-- producer's note in the explain record.
local function send(rt, body)
  local req = assert(rt:begin({ path = "/v1/completions", explain = true,
    body = S.json.encode(body) }))
  local res = req:schedule()
  local x = S.json.decode(req:explain())
  req:response_header(200, {})
  req:response_complete()
  req:finish("ok")
  local scores = {}
  for _, s in ipairs(x.profiles[1].scorers[1].scores) do
    scores[s.endpoint] = s.raw
  end
  local note
  for _, step in ipairs(x.steps) do
    if step.point == "prepare" and step.plugin == "precise" then
      note = step.published
    end
  end
  return scores, res.picks[1].name, note
end

describe("precise-prefix-cache-scorer", function()
  it("scores a token-id prompt by the blocks each engine announced, no tokenizer", function()
    local rt = runtime()
    finally(function() rt:free() end)
    local prompt = ids(64) -- 4 blocks
    stored(rt, "ep2", ids(64))
    stored(rt, "ep3", ids(32))
    local scores, went, note = send(rt, { model = "m", prompt = prompt })
    assert.equal("ep2", went)
    assert.is_true(scores.ep2 > scores.ep3 and scores.ep3 > 0, S.json.encode(scores))
    assert.equal(0, scores.ep1)
    assert.same({ how = "precise", blocks = 4, of = 4 },
      { how = note.ep2.how, blocks = note.ep2.blocks, of = note.ep2.of })
    assert.equal(2, note.ep3.blocks)
  end)

  it("an evicted block ends the match there: what the engine holds, not what was sent",
    function()
      local rt = runtime()
      finally(function() rt:free() end)
      stored(rt, "ep1", ids(64))
      stored(rt, "ep2", ids(64))
      S.eval(rt, [[
        local prefix = require "lupin.prefix"
        local pool = require "lupin.runtime.pool"
        local x = require("lupin.runtime").current.by_name.precise.obj
        local h = prefix.token_hashes({]] .. table.concat(ids(64), ",") .. [[},
          prefix.token_seed("", "", ""), 16, 4096)
        -- ep1's engine evicted the second block (BlockRemoved)
        x.index:remove(pool.list[1].id, h, 1)
        prefix.release(h)
        return "ok"]])
      local _, went, note = send(rt, { model = "m", prompt = ids(64) })
      assert.equal("ep2", went)
      assert.equal(1, note.ep1.blocks)
    end)

  it("a LoRA adapter's blocks, keyed with its name as vLLM does, match its requests", function()
    local rt = runtime()
    finally(function() rt:free() end)
    stored(rt, "ep1", ids(64), "", "adapter-a") -- the adapter's blocks
    stored(rt, "ep2", ids(64))                  -- the base model's
    local _, went, note = send(rt, { model = "adapter-a", prompt = ids(64) })
    assert.equal("ep1", went)
    assert.equal(4, note.ep1.blocks)
    local _, base = send(rt, { model = "m", prompt = ids(64) })
    assert.equal("ep2", base)
  end)

  it("another hashSeed keys other blocks: nothing matches", function()
    local rt = runtime({ tokenProcessorConfig = { blockSize = BLOCK, hashSeed = "42" } })
    finally(function() rt:free() end)
    stored(rt, "ep1", ids(64), "") -- keyed with the wrong seed
    local scores = send(rt, { model = "m", prompt = ids(64) })
    assert.same({ ep1 = 0, ep2 = 0, ep3 = 0 }, scores)
    stored(rt, "ep1", ids(64), "42")
    assert.equal(1, (send(rt, { model = "m", prompt = ids(64) })).ep1)
  end)

  it("a text prompt: approximate first, asks for the shared prefix's tokens, then precise",
    function()
      local rt = runtime()
      finally(function() rt:free() end)
      local context = ("the tenant's long context. "):rep(20):sub(1, 512)
      local _, first = send(rt, { model = "m", prompt = context .. "question one?" })
      -- the second request shares 8 blocks of 64 characters with the first
      local _, _, note = send(rt, { model = "m", prompt = context .. "question two?" })
      assert.equal("approximate", note[first].how)
      assert.equal("tokens asked for", note[first].why)
      -- the host answers: 128 ids for the 512 characters, and an engine other
      -- than the approximate pick reports holding them
      tokenized(rt, context, 512, ids(128))
      local other = first == "ep3" and "ep2" or "ep3"
      stored(rt, other, ids(128))
      local scores, went, note3 = send(rt, { model = "m", prompt = context .. "question three?" })
      assert.equal(other, went)
      assert.equal("precise", note3[other].how)
      assert.equal(8, note3[other].blocks)
      -- 512 of the prompt's characters
      assert.near(512 / #(context .. "question three?"), scores[other], 1e-9)
    end)

  it("while one engine holds a part, an endpoint that only was sent it scores nothing", function()
    local rt = runtime()
    finally(function() rt:free() end)
    stored(rt, "ep1", ids(16, 5000)) -- ep1 and ep2 publish, ep3 does not
    stored(rt, "ep2", ids(16))
    local _, first = send(rt, { model = "m", prompt = ids(64) })
    assert.equal("ep2", first)
    -- ep2's engine holds the first block: ep1, sent nothing, scores 0 precisely
    local scores, _, note = send(rt, { model = "m", prompt = ids(64) })
    assert.same({ "precise", "precise" }, { note.ep1.how, note.ep2.how })
    assert.equal(0, scores.ep1)
  end)

  it("an endpoint without events is scored from the approximate index", function()
    local rt = runtime()
    finally(function() rt:free() end)
    stored(rt, "ep1", ids(64))
    local _, _, note = send(rt, { model = "m", prompt = ids(64) })
    assert.equal("approximate", note.ep2.how)
    assert.equal("no events from it yet", note.ep2.why)
  end)

  it("speculativeIndexing: the pick holds the request's blocks until speculativeTTL",
    function()
      local rt = runtime({ tokenProcessorConfig = { blockSize = BLOCK },
        speculativeIndexing = true, speculativeTTL = "50ms" })
      finally(function() rt:free() end)
      stored(rt, "ep1", ids(16, 5000)) -- every endpoint has events
      stored(rt, "ep2", ids(16, 6000))
      stored(rt, "ep3", ids(16, 7000))
      local _, went = send(rt, { model = "m", prompt = ids(64) })
      local _, again, note = send(rt, { model = "m", prompt = ids(64) })
      assert.equal(went, again)
      assert.equal("speculative", note[went].how)
      local t0 = os.clock()
      repeat until os.clock() - t0 > 0.08
      -- past the TTL no engine holds it: where it was sent decides again
      local _, back, late = send(rt, { model = "m", prompt = ids(64) })
      assert.same({ how = "approximate", why = "no engine holds it" },
        { how = late[went].how, why = late[went].why })
      assert.equal(went, back)
    end)

  it("kvEventsConfig and tokenProcessorConfig become the host's subscription", function()
    local rt = runtime({ tokenProcessorConfig = { blockSize = 32, hashSeed = "7" },
      kvEventsConfig = { podDiscoveryConfig = { socketPort = 6000 }, replayPort = 6100 },
      maxPendingBatches = 50, unsureSeconds = 3 })
    finally(function() rt:free() end)
    local kv = S.eval(rt, [[return require("lupin.runtime").current.data.kv_events]])
    assert.same({ index = "precise/32/7", hash_seed = "7", topic = "", bind = "", port = 6000,
      replay_port = 6100, block_size = 32, max_blocks = 1000000, max_pending = 50,
      unsure_seconds = 3 }, kv)
  end)

  it("a bound zmqEndpoint filters llm-d's topics; discoverPods false subscribes to it alone",
    function()
      local rt = runtime({ kvEventsConfig = { zmqEndpoint = "tcp://127.0.0.1:5999",
        discoverPods = false } })
      finally(function() rt:free() end)
      local kv = S.eval(rt, [[return require("lupin.runtime").current.data.kv_events]])
      assert.same({ "tcp://127.0.0.1:5999", "kv@", 0 }, { kv.bind, kv.topic, kv.port })
    end)

  it("the older indexerConfig.tokenProcessorConfig is read too", function()
    local rt = runtime({ indexerConfig = { tokenProcessorConfig = { blockSize = 8 } } })
    finally(function() rt:free() end)
    assert.equal(8, S.eval(rt,
      [[return require("lupin.runtime").current.data.kv_events.block_size]]))
  end)

  local refused = {
    { { kvEventsConfig = { engineType = "sglang" } }, "engineType \"sglang\" is not supported" },
    { { kvEventsConfig = { zmqEndpoint = "localhost:5557" } }, "zmqEndpoint must be tcp://" },
    { { kvEventsConfig = { discoverPods = false } }, "no engine's events would be heard" },
    { { kvEventsConfig = { discoverPods = "yes" } }, "discoverPods must be a boolean" },
    { { tokenProcessorConfig = { blockSize = 0 } },
      "tokenProcessorConfig.blockSize must be an integer between 1 and 4096" },
    { { tokenProcessorConfig = { hashSeed = 42 } }, "tokenProcessorConfig.hashSeed must be a"
      .. " string" },
    { { indexerConfig = { kvBlockIndexConfig = { redisConfig = {} } } },
      "redisConfig is not supported" },
    { { speculativeTTL = "soon" }, "speculativeTTL must be a duration" },
    { { kvEventsConfig = "tcp://x:1" }, "kvEventsConfig: must be an object" },
    { { kvEventsConfig = { podDiscoveryConfig = { socketPort = 70000 } } },
      "socketPort must be an integer between 1 and 65535" },
  }
  for _, case in ipairs(refused) do
    it("refuses " .. S.json.encode(case[1]) .. " at load, naming the parameter", function()
      local rt = S.runtime()
      finally(function() rt:free() end)
      local ok, err = rt:load_string(S.json.encode(config(case[1])), "precise.json")
      assert.is_nil(ok)
      assert.matches(case[2], err, 1, true)
      assert.matches("^precise%.json:%d+: plugins%[0%]", err)
    end)
  end

  it("warns at their lines about the parameters it reads and does not act on", function()
    -- the warning path is the config's: checked through a load's output
    local path = S.tmpdir() .. "/precise.json"
    S.write(path, S.json.encode(config({ kvEventsConfig = { concurrency = 8 },
      indexerConfig = { tokenizersPoolConfig = { modelName = "x" } } })))
    local out = S.program("lupin", "check --config " .. path)
    assert.matches("kvEventsConfig.concurrency is not acted on: one subscriber thread", out, 1,
      true)
    assert.matches("indexerConfig.tokenizersPoolConfig is not acted on: lupin tokenizes", out, 1,
      true)
    assert.matches("rc=0", out, 1, true)
  end)

  it("two precise plugins must subscribe alike", function()
    local rt = S.runtime()
    finally(function() rt:free() end)
    local cfg = config(nil, { { type = "precise-prefix-cache-producer", name = "other",
      parameters = { tokenProcessorConfig = { blockSize = 32 } } } })
    local ok, err = rt:load_string(S.json.encode(cfg), "two.json")
    assert.is_nil(ok)
    assert.matches("a gateway subscribes once", err, 1, true)
  end)
end)
