-- Keyed prefix indexes (core/prefix_shared.c through lupin.prefix): one index
-- per key for every runtime made with one lupin_shared, striped by block hash;
-- a runtime of its own keeps one private, unsharded store.  Both runtimes run
-- on this thread: the threads are spec/core/prefix_threads.c's.
local S = require "support"
local native = require "lupin_native"

local PRELUDE = [[
local ffi, prefix, pool = require "ffi", require "lupin.prefix", require "lupin.runtime.pool"
local ID = {}
for _, ep in ipairs(pool.list) do ID[tostring(ep)] = ep.id end
local function named(m)
  local out = {}
  for name, id in pairs(ID) do out[name] = m[id] end
  return out
end
]]

local function run(rt, code)
  return S.eval(rt, PRELUDE .. code)
end

local SCORER = {
  plugins = {
    { type = "prefix-cache-scorer", parameters = { blockSize = 4, autoTune = false } },
    { type = "max-score-picker" },
  },
}

-- A long prompt: many blocks, so they fall in every shard.
local PROMPT = ("the quick brown fox jumps over the lazy dog "):rep(8)

describe("keyed prefix indexes", function()
  local shared, a, b

  before_each(function()
    shared = native.shared()
    a = S.runtime({ shared = shared })
    b = S.runtime({ shared = shared })
    S.endpoints(a, 3) -- the same order: the same ids in both
    S.endpoints(b, 3)
  end)

  after_each(function()
    a:free()
    b:free()
  end)

  it("match on runtime B what runtime A recorded under the same key", function()
    run(a, ([[
      prefix.index(1000, "k"):record(ID.ep2, prefix.hashes(%q, "m", "", 4, 256))
    ]]):format(PROMPT))
    local got = run(b, ([[
      local h = prefix.hashes(%q, "m", "", 4, 256)
      return { n = h.n, m = named(prefix.index(1000, "k"):match(h)),
               other = named(prefix.index(1000, "other key"):match(h)) }
    ]]):format(PROMPT))
    assert.equal(88, got.n)
    assert.same({ ep2 = 88 }, got.m)
    assert.same({}, got.other)
  end)

  it("stop the walk at the first block nobody holds, whichever shard holds the rest", function()
    local got = run(a, ([[
      local x = prefix.index(1000, "k")
      local h = prefix.hashes(%q, "m", "", 4, 256)
      x:record(ID.ep1, h)
      local half = prefix.hashes(%q, "m", "", 4, 40)
      x:record(ID.ep3, half)
      local full = named(x:match(h))
      prefix._list(h).h[30] = 12345 -- a block nobody holds: the 57 after it no longer count
      return { full = full, cut = named(x:match(h)) }
    ]]):format(PROMPT, PROMPT))
    assert.same({ ep1 = 88, ep3 = 40 }, got.full)
    assert.same({ ep1 = 30, ep3 = 30 }, got.cut)
  end)

  it("answer as one unsharded index does, over random prompts sharing prefixes", function()
    -- the same records into a keyed index (8 shards) and a runtime-private
    -- one (prefix_index.c alone): every lookup must agree
    local got = run(a, [[
      local x, y = prefix.index(100000, "k"), prefix.index(100000)
      local seed = 7
      local function rand(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
      local stems = { ("s"):rep(40), ("t"):rep(40), ("u"):rep(40) }
      local function prompt()
        local p = stems[rand(3) + 1]
        for _ = 1, rand(30) do p = p .. string.char(97 + rand(3)) .. "xyz" end
        return p
      end
      local ids = { ID.ep1, ID.ep2, ID.ep3 }
      for _ = 1, 300 do
        local h = prefix.hashes(prompt(), "m", "", 4, 256)
        local id = ids[rand(3) + 1]
        x:record(id, h)
        y:record(id, h)
      end
      local differ, matched = 0, 0
      for _ = 1, 300 do
        local h = prefix.hashes(prompt(), "m", "", 4, 256)
        local mx, my = x:match(h), y:match(h)
        for _, id in ipairs(ids) do
          if mx[id] ~= my[id] then differ = differ + 1 end
          matched = matched + (my[id] or 0)
        end
      end
      return { differ = differ, matched = matched }
    ]])
    assert.equal(0, got.differ)
    assert.truthy(got.matched > 1000, got.matched)
  end)

  it("count a match over many endpoints as one unsharded index does", function()
    -- a few endpoints are counted by a scan, more through a map that grows:
    -- 40 endpoints, endpoint i holding the first 2i blocks of one prompt
    S.endpoints(a, 40)
    local got = run(a, ([[
      local x, y = prefix.index(100000, "k"), prefix.index(100000)
      local p = %q
      for i, ep in ipairs(pool.list) do
        local h = prefix.hashes(p:sub(1, 8 * i), "m", "", 4, 256)
        x:record(ep.id, h)
        y:record(ep.id, h)
      end
      local h = prefix.hashes(p, "m", "", 4, 256)
      local mx, my, out = x:match(h), y:match(h), { n = 0, differ = 0, sum = 0 }
      for _, ep in ipairs(pool.list) do
        if mx[ep.id] ~= my[ep.id] then out.differ = out.differ + 1 end
        if mx[ep.id] then out.n, out.sum = out.n + 1, out.sum + mx[ep.id] end
      end
      return out
    ]]):format(PROMPT))
    print(require("cjson").encode(got)) assert.same({ n = 40, differ = 0, sum = 40 * 41 }, got)
  end)

  it("purge an endpoint removed from a runtime, for every runtime", function()
    local record = ([[
      local x = prefix.index(1000, "k")
      x:record(ID.ep1, prefix.hashes(%q, "m", "", 4, 256))
      return x:count(ID.ep1)
    ]]):format(PROMPT)
    assert.equal(88, run(a, record))
    assert(a:remove("ep1"))
    assert.equal(0, run(b, [[return prefix.index(1000, "k"):count(ID.ep1)]]))
    -- and a runtime without it in its pool no longer records it
    assert.equal(0, run(a, [[
      local x = prefix.index(1000, "k")
      x:record(2^31, prefix.hashes("aaaabbbb", "m", "", 4, 256))
      return x:count(2^31)]]))
  end)

  it("keep each endpoint within its capacity, shards together", function()
    local got = run(a, [[
      local x = prefix.index(100, "k")
      for i = 1, 200 do
        x:record(ID.ep1, prefix.hashes(("%05d"):format(i):rep(20), "m", "", 4, 256))
      end
      local before = x:count(ID.ep1)
      x:set_capacity(ID.ep1, 10)
      local after = x:count(ID.ep1)
      x:record(ID.ep2, prefix.hashes(("p"):rep(4000), "m", "", 4, 1000), 30) -- autoTune's way
      return { before, after, x:count(ID.ep2) }
    ]])
    assert.truthy(got[1] <= 100 and got[1] > 50, got[1])
    assert.truthy(got[2] <= 10 and got[2] > 0, got[2])
    assert.truthy(got[3] <= 30 and got[3] > 0, got[3])
  end)

  it("give the prefix-cache-scorer of every runtime one index", function()
    assert(a:load_string(S.json.encode(SCORER), "a.json"))
    assert(b:load_string(S.json.encode(SCORER), "b.json"))
    local body = S.json.encode({ model = "m", prompt = PROMPT })
    local picked = S.lifecycle(a, body).picks[1].name
    local count = ([[
      local x = require("lupin.runtime").current.by_name["prefix-cache-scorer"].obj.index
      return x:count(ID.%s)]]):format(picked)
    assert.equal(88, run(b, count))
    -- B's scheduling of the same prompt follows it there
    for _ = 1, 5 do
      assert.equal(picked, S.lifecycle(b, body).picks[1].name)
    end
  end)

  it("refuse a key that is not a non-empty string", function()
    local got = run(a, [[
      local _, e1 = pcall(prefix.index, 10, 42)
      local _, e2 = pcall(prefix.index, 10, "")
      return { e1, e2 }]])
    assert.matches("prefix index key must be a non-empty string, got number", got[1], 1, true)
    assert.matches('prefix index key must be a non-empty string, got ""', got[2], 1, true)
  end)
end)

describe("a runtime without a lupin_shared", function()
  local a, b
  before_each(function()
    a, b = S.runtime(), S.runtime()
    S.endpoints(a, 3)
    S.endpoints(b, 3)
  end)
  after_each(function()
    a:free()
    b:free()
  end)

  it("keeps its keyed indexes to itself", function()
    local record = ([[
      local x = prefix.index(1000, "k")
      x:record(ID.ep1, prefix.hashes(%q, "m", "", 4, 256))
      return x:count(ID.ep1)]]):format(PROMPT)
    assert.equal(88, run(a, record))
    assert.equal(0, run(b, [[return prefix.index(1000, "k"):count(ID.ep1)]]))
  end)

  it("keeps the scorer's index across a reload with the same key, not with another", function()
    local cfg = S.json.encode(SCORER)
    assert(a:load_string(cfg, "v1.json"))
    local picked = S.lifecycle(a, S.json.encode({ model = "m", prompt = PROMPT })).picks[1].name
    local count = ([[
      local x = require("lupin.runtime").current.by_name["prefix-cache-scorer"].obj.index
      return x:count(ID.%s)]]):format(picked)
    assert.equal(88, run(a, count))
    assert(a:load_string(cfg, "v2.json"))
    a:collect() -- v1's instance is gone: the index lives on by its key
    assert.equal(88, run(a, count))
    local other = S.json.decode(cfg)
    other.plugins[1].parameters.blockSize = 8
    assert(a:load_string(S.json.encode(other), "v3.json"))
    assert.equal(0, run(a, count))
  end)
end)
