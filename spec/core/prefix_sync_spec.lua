-- Prefix records across processes (core/prefix_sync.c, lupin.h "prefix
-- records across processes"): a host hears what its keyed indexes record,
-- by endpoint name, and applies other processes' records to its own.  Two
-- lupin_shared here stand for two processes.
local S = require "support"
local native = require "lupin_native"

local PRELUDE = [[
local prefix, pool = require "lupin.prefix", require "lupin.runtime.pool"
local ID = {}
for _, ep in ipairs(pool.list) do ID[tostring(ep)] = ep.id end
local function named(m)
  local out = {}
  for name, id in pairs(ID) do out[name] = m[id] end
  return out
end
]]

local PROMPT = ("the quick brown fox jumps over the lazy dog "):rep(8)

local function run(rt, code)
  return S.eval(rt, PRELUDE .. code)
end

-- "key\tendpoint\th1,h2\n" lines as { {key, endpoint, {hashes}} }
local function parse(text)
  local out = {}
  for key, ep, hs in text:gmatch("([^\t\n]*)\t([^\t\n]*)\t([^\n]*)\n") do
    local list = {}
    for h in hs:gmatch("[^,]+") do list[#list + 1] = h end
    out[#out + 1] = { key = key, endpoint = ep, hashes = list }
  end
  return out
end

describe("prefix records across processes", function()
  local sa, sb, a, b

  before_each(function()
    sa, sb = native.shared(), native.shared()
    a = S.runtime({ shared = sa })
    b = S.runtime({ shared = sb })
    S.endpoints(a, 3)
    -- another order in B: other ids, the same names
    S.endpoints(b, 3)
  end)

  after_each(function()
    a:free()
    b:free()
  end)

  it("hear a keyed index's record with the endpoint's name and its hashes", function()
    sa:watch_records(true)
    run(a, ([[prefix.index(1000, "k"):record(ID.ep2, prefix.hashes(%q, "m", "", 4, 256))]])
      :format(PROMPT))
    local heard = parse(sa:heard())
    assert.equal(1, #heard)
    assert.equal("k", heard[1].key)
    assert.equal("ep2", heard[1].endpoint)
    assert.equal(88, #heard[1].hashes)
    assert.equal("", sa:heard())
  end)

  it("hear nothing from an unkeyed index, an endpoint out of the pool, or with no hook", function()
    sa:watch_records(true)
    run(a, ([[
      local h = prefix.hashes(%q, "m", "", 4, 256)
      prefix.index(1000):record(ID.ep1, h)       -- unkeyed: this runtime's own
      prefix.index(1000, "k"):record(99999, h)   -- no such endpoint: not recorded
    ]]):format(PROMPT))
    assert.equal("", sa:heard())
    sa:watch_records(false)
    run(a, ([[prefix.index(1000, "k"):record(ID.ep1, prefix.hashes(%q, "m", "", 4, 256))]])
      :format(PROMPT))
    assert.equal("", sa:heard())
  end)

  it("apply a record on another lupin_shared by name: it matches there", function()
    sa:watch_records(true)
    sb:watch_records(true)
    run(b, [[ X = prefix.index(1000, "k") ]]) -- B's plugin has the index open
    run(a, ([[prefix.index(1000, "k"):record(ID.ep3, prefix.hashes(%q, "m", "", 4, 256))]])
      :format(PROMPT))
    local r = parse(sa:heard())[1]
    assert.equal(1, sb:prefix_apply(r.key, r.endpoint, r.hashes))
    local got = run(b, ([[return named(X:match(prefix.hashes(%q, "m", "", 4, 256)))]])
      :format(PROMPT))
    assert.same({ ep3 = 88 }, got)
    assert.equal("", sb:heard(), "an applied record must not reach the hook (no echo)")
  end)

  it("ignore a record for an unknown endpoint or index, refuse bad arguments", function()
    run(b, [[ X = prefix.index(1000, "k") ]])
    assert.equal(0, sb:prefix_apply("k", "nobody", { "1", "2" }))
    assert.equal(0, sb:prefix_apply("no such key", "ep1", { "1", "2" }))
    assert.equal(-1, sb:prefix_apply(nil, "ep1", { "1" }))
    assert.equal(-1, sb:prefix_apply("k", nil, { "1" }))
    assert.same({}, run(b, [[
      local h = prefix.hashes("abcdefgh", "m", "", 4, 8)
      local l = prefix._list(h)
      l.h[0], l.h[1] = 1, 2
      return named(X:match(h))
    ]]))
  end)
end)
