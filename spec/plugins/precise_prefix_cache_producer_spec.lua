-- precise-prefix-cache-producer with prefix-cache-scorer reading it
-- (prefixMatchInfoProducerName), through the real runtime: llm-d-router's
-- split of the precise scorer.  The engines' events are played as the host
-- applies them: blocks recorded in the keyed index the producer reads.
local S = require "support"

local function runtime(params)
  local rt = S.loaded({
    plugins = {
      { type = "precise-prefix-cache-producer", name = "producer",
        parameters = params or { tokenProcessorConfig = { blockSize = 4 } } },
      { type = "prefix-cache-scorer", parameters = { prefixMatchInfoProducerName = "producer" } },
      { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "prefix-cache-scorer" },
      { pluginRef = "max-score-picker" } } } },
  })
  S.endpoints(rt, 2)
  return rt
end

local function ids(n)
  local t = {}
  for i = 1, n do
    t[i] = 100 + i
  end
  return t
end

-- ep's engine announced the first n ids' blocks (4 ids a block).
local function stored(rt, ep, n)
  S.eval(rt, ([[
    local prefix = require "lupin.prefix"
    local x = require("lupin.runtime").current.by_name.producer.obj
    local id = require("lupin.runtime.pool").list[%d].id
    local h = prefix.token_hashes({%s}, prefix.token_seed("", "", ""), 4, 100)
    x.index:record(id, h)
    prefix.release(h)
    return "ok"]]):format(ep, table.concat(ids(n), ",")))
end

local function scores(rt, prompt)
  local req = assert(rt:begin({ path = "/v1/completions", explain = true,
    body = S.json.encode({ model = "m", prompt = prompt }) }))
  local res = req:schedule()
  local x = S.json.decode(req:explain())
  req:finish("ok")
  local out = {}
  for _, s in ipairs(x.profiles[1].scorers[1].scores) do
    out[s.endpoint] = s.raw
  end
  return out, res.picks[1].name
end

describe("precise-prefix-cache-producer", function()
  it("publishes the precise match; prefix-cache-scorer scores it as a fraction", function()
    local rt = runtime()
    finally(function() rt:free() end)
    stored(rt, 1, 8)  -- 2 of the prompt's 4 blocks
    stored(rt, 2, 16) -- all 4
    local s, went = scores(rt, ids(16))
    assert.equal("ep2", went)
    assert.is_true(s.ep2 > s.ep1 and s.ep1 > 0, S.json.encode(s))
    assert.near(s.ep2 / 2, s.ep1, 0.02) -- characters, rounded down
  end)

  it("runs prepare before the other plugins, as upstream's data producers", function()
    local rt = runtime()
    finally(function() rt:free() end)
    local order = S.eval(rt, [[
      local out = {}
      for i, rec in ipairs(require("lupin.runtime").current.points.prepare) do
        out[i] = rec.type
      end
      return out]])
    assert.equal("precise-prefix-cache-producer", order[1])
  end)

  it("is read without a producer name when it is the only producer", function()
    local rt = S.loaded({
      plugins = { { type = "precise-prefix-cache-producer", name = "p" },
        { type = "prefix-cache-scorer" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "prefix-cache-scorer" }, { pluginRef = "max-score-picker" } } } },
    })
    finally(function() rt:free() end)
    assert.equal("p", S.eval(rt,
      [[return require("lupin.runtime").current.by_name["prefix-cache-scorer"].obj.producer]]))
  end)

  it("wants the engines' events: the host subscribes with its settings", function()
    local rt = runtime({ tokenProcessorConfig = { blockSize = 4 },
      kvEventsConfig = { podDiscoveryConfig = { socketPort = 7000 } } })
    finally(function() rt:free() end)
    local kv = S.eval(rt, [[return require("lupin.runtime").current.data.kv_events]])
    assert.same({ 7000, 4, "precise/4/" }, { kv.port, kv.block_size, kv.index })
  end)
end)
