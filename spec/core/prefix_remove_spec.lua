-- Removing from a keyed prefix index through lupin_shared (lupin.h:
-- lupin_shared_prefix_remove, _purge): what an engine's KV-cache events
-- evicted or cleared, by endpoint name, from a thread that may run no
-- runtime (here the spec's, through FFI), and never heard by the record
-- hook.  With 4 threads the index is in 8 shards, with 1 in one.
local S = require "support"
local native = require "lupin_native"
local N = require "core.native_ffi"

local PRELUDE = [[
local prefix, pool, bit = require "lupin.prefix", require "lupin.runtime.pool", require "bit"
local ID = {}
for _, ep in ipairs(pool.list) do ID[tostring(ep)] = ep.id end
local function named(m)
  local out = {}
  for name, id in pairs(ID) do out[name] = m[id] end
  return out
end
local function hex(h, from, to)
  local out, l = {}, prefix._list(h)
  for i = from or 0, (to or h.n - 1) do out[#out + 1] = bit.tohex(l.h[i], 16) end
  return out
end
]]

local PROMPT = ("the quick brown fox jumps over the lazy dog "):rep(8) -- 88 blocks of 4

for _, threads in ipairs({ 4, 1 }) do
  describe(("removing from a keyed prefix index (%d thread%s)"):format(threads,
    threads > 1 and "s, 8 shards" or ", one shard"), function()
    local shared, s, a, b

    local function run(rt, code)
      return S.eval(rt, PRELUDE .. code)
    end

    before_each(function()
      shared = native.shared(threads)
      s = N.shared(shared)
      a = S.runtime({ shared = shared })
      b = S.runtime({ shared = shared })
      S.endpoints(a, 3)
      S.endpoints(b, 3)
      -- both runtimes hold the index open; ep1 and ep2 hold the whole prompt
      run(b, [[ X = prefix.index(1000, "k") ]])
      run(a, ([[
        X = prefix.index(1000, "k")
        local h = prefix.hashes(%q, "m", "", 4, 256)
        X:record(ID.ep1, h)
        X:record(ID.ep2, h)
      ]]):format(PROMPT))
    end)

    after_each(function()
      a:free()
      b:free()
    end)

    local function match(rt)
      return run(rt, ([[return named(X:match(prefix.hashes(%q, "m", "", 4, 256)))]])
        :format(PROMPT))
    end

    local function block_hashes(from, to)
      return run(a, ([[return hex(prefix.hashes(%q, "m", "", 4, 256), %d, %d)]])
        :format(PROMPT, from, to))
    end

    it("removes the blocks named for that endpoint only, every runtime seeing it", function()
      local arr, n = N.hashes(block_hashes(40, 87)) -- the tail an engine evicted
      assert.equal(1, N.C.lupin_shared_prefix_remove(s, "k", "ep2", arr, n))
      assert.same({ ep1 = 88, ep2 = 40 }, match(b))
      assert.same({ ep1 = 88, ep2 = 40 }, match(a))
      assert.same({ ep1 = 88, ep2 = 40 },
        run(a, [[return { ep1 = X:count(ID.ep1), ep2 = X:count(ID.ep2) }]]))
      -- its first block out too: ep1 still carries the walk past it
      arr, n = N.hashes(block_hashes(0, 0))
      assert.equal(1, N.C.lupin_shared_prefix_remove(s, "k", "ep2", arr, n))
      assert.same({ ep1 = 88, ep2 = 39 }, match(b))
      assert.equal(39, run(a, [[return X:count(ID.ep2)]]))
    end)

    it("skips hashes the endpoint does not hold, and takes none", function()
      local arr, n = N.hashes({ "1", "2", "3" })
      assert.equal(1, N.C.lupin_shared_prefix_remove(s, "k", "ep1", arr, n))
      assert.equal(1, N.C.lupin_shared_prefix_remove(s, "k", "ep1", nil, 0))
      arr, n = N.hashes(block_hashes(0, 10))
      assert.equal(1, N.C.lupin_shared_prefix_remove(s, "k", "ep3", arr, n)) -- holds nothing
      assert.same({ ep1 = 88, ep2 = 88 }, match(b))
    end)

    it("purges everything the endpoint holds in that index, and only there", function()
      run(a, ([[
        Y = prefix.index(1000, "other")
        Y:record(ID.ep1, prefix.hashes(%q, "m", "", 4, 256))
      ]]):format(PROMPT))
      assert.equal(1, N.C.lupin_shared_prefix_purge(s, "k", "ep1"))
      assert.same({ ep2 = 88 }, match(b))
      assert.same({ k = 0, other = 88 }, run(a, [[return { k = X:count(ID.ep1), other = Y:count(ID.ep1) }]]))
      -- the endpoint records again afterwards
      run(a, ([[X:record(ID.ep1, prefix.hashes(%q, "m", "", 4, 256))]]):format(PROMPT))
      assert.same({ ep1 = 88, ep2 = 88 }, match(b))
    end)

    it("ignores an unknown index or endpoint, refuses bad arguments", function()
      local arr, n = N.hashes(block_hashes(0, 3))
      assert.equal(0, N.C.lupin_shared_prefix_remove(s, "no such key", "ep1", arr, n))
      assert.equal(0, N.C.lupin_shared_prefix_remove(s, "k", "nobody", arr, n))
      assert.equal(0, N.C.lupin_shared_prefix_purge(s, "no such key", "ep1"))
      assert.equal(0, N.C.lupin_shared_prefix_purge(s, "k", "nobody"))
      assert.equal(-1, N.C.lupin_shared_prefix_remove(nil, "k", "ep1", arr, n))
      assert.equal(-1, N.C.lupin_shared_prefix_remove(s, nil, "ep1", arr, n))
      assert.equal(-1, N.C.lupin_shared_prefix_remove(s, "k", nil, arr, n))
      assert.equal(-1, N.C.lupin_shared_prefix_remove(s, "k", "ep1", nil, 2))
      assert.equal(-1, N.C.lupin_shared_prefix_purge(nil, "k", "ep1"))
      assert.equal(-1, N.C.lupin_shared_prefix_purge(s, nil, "ep1"))
      assert.equal(-1, N.C.lupin_shared_prefix_purge(s, "k", nil))
      assert.same({ ep1 = 88, ep2 = 88 }, match(b))
    end)

    it("ignores an index every view closed (freed), though it was there before", function()
      run(a, [[ X = nil; collectgarbage(); collectgarbage() ]])
      run(b, [[ X = nil; collectgarbage(); collectgarbage() ]])
      assert.equal(0, N.C.lupin_shared_prefix_purge(s, "k", "ep1"))
    end)

    it("calls no record hook", function()
      shared:watch_records(true)
      local arr, n = N.hashes(block_hashes(0, 3))
      assert.equal(1, N.C.lupin_shared_prefix_remove(s, "k", "ep1", arr, n))
      assert.equal(1, N.C.lupin_shared_prefix_purge(s, "k", "ep2"))
      assert.equal("", shared:heard())
      shared:watch_records(false)
    end)
  end)
end
