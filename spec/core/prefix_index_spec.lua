-- The prefix index (core/prefix_index.c through lupin.prefix), driven inside
-- a runtime with rt:eval: per-endpoint LRUs, the reverse map, lookups, purges.
local S = require "support"

-- Code run before each snippet: the index module, endpoint ids by name and a
-- constructor for hand-made hash lists.
local PRELUDE = [[
local ffi, prefix, pool = require "ffi", require "lupin.prefix", require "lupin.runtime.pool"
local ID = {}
for _, ep in ipairs(pool.list) do ID[tostring(ep)] = ep.id end
local function H(...)
  return prefix._from({ ... })
end
local function named(m)
  local out = {}
  for name, id in pairs(ID) do out[name] = m[id] end
  return out
end
]]

describe("prefix index", function()
  local rt
  before_each(function()
    rt = S.runtime()
    S.endpoints(rt, 3)
  end)
  after_each(function()
    rt:free()
  end)

  local function run(code)
    return S.eval(rt, PRELUDE .. code)
  end

  it("scores the issue's sequence: 0.5, then 2/3, then 0 for another model", function()
    local got = run [[
      local x = prefix.index(100)
      x:record(ID.ep1, prefix.hashes("aaaaaa", "m", "", 4, 256))       -- one block
      local a = prefix.hashes("aaaabbbb", "m", "", 4, 256)
      local r1 = (x:match(a)[ID.ep1] or 0) / a.n
      x:record(ID.ep1, a)
      local b = prefix.hashes("aaaabbbbcccc", "m", "", 4, 256)
      local r2 = (x:match(b)[ID.ep1] or 0) / b.n
      local c = prefix.hashes("aaaabbbbcccc", "other", "", 4, 256)
      local r3 = (x:match(c)[ID.ep1] or 0) / c.n
      return { r1, r2, r3 }
    ]]
    assert.equal(0.5, got[1])
    assert.near(2 / 3, got[2], 1e-12) -- JSON carries 14 digits
    assert.equal(0, got[3])
  end)

  it("holds two of three hashes with capacity 2: the first two, as the end is evicted first", function()
    local got = run [[
      local x = prefix.index(2)
      local h = H(11, 22, 33)
      x:record(ID.ep1, h)
      return { x:count(ID.ep1), x:holds(ID.ep1, h, 0), x:holds(ID.ep1, h, 1), x:holds(ID.ep1, h, 2) }
    ]]
    assert.same({ 2, true, true, false }, got)
  end)

  it("evicts the least recently recorded hash, and a repeat refreshes it", function()
    local got = run [[
      local x = prefix.index(2)
      x:record(ID.ep1, H(1)); x:record(ID.ep1, H(2))
      x:record(ID.ep1, H(1))          -- 1 is now the most recent
      x:record(ID.ep1, H(3))          -- evicts 2
      local h = H(1, 2, 3)
      return { x:count(ID.ep1), x:holds(ID.ep1, h, 0), x:holds(ID.ep1, h, 1), x:holds(ID.ep1, h, 2) }
    ]]
    assert.same({ 2, true, false, true }, got)
  end)

  it("counts per endpoint and stops at the first hash nobody holds", function()
    local got = run [[
      local x = prefix.index(100)
      x:record(ID.ep1, H(1, 2, 4))    -- holds 1, 2 and 4 but not 3
      x:record(ID.ep2, H(1))
      x:record(ID.ep3, H(4))
      return { all = named(x:match(H(1, 2, 3, 4))), none = named(x:match(H(9, 1))),
        empty = named(x:match(H())) }
    ]]
    assert.same({ all = { ep1 = 2, ep2 = 1 }, none = {}, empty = {} }, got)
  end)

  it("keeps the reverse map exact when an entry is evicted", function()
    local got = run [[
      local x = prefix.index(1)
      x:record(ID.ep1, H(7)); x:record(ID.ep2, H(7))
      x:record(ID.ep1, H(8))          -- ep1 evicts 7, ep2 still holds it
      local a = named(x:match(H(7)))
      x:record(ID.ep2, H(9))          -- now nobody holds 7
      return { a, named(x:match(H(7))), named(x:match(H(8))) }
    ]]
    assert.same({ { ep2 = 1 }, {}, { ep1 = 1 } }, got)
  end)

  it("lowers a capacity by evicting the least recent entries", function()
    local got = run [[
      local x = prefix.index(10)
      for i = 1, 5 do x:record(ID.ep1, H(i)) end  -- 5 is the most recent
      x:set_capacity(ID.ep1, 2)
      local h = H(4, 5, 3)
      local r = { x:count(ID.ep1), x:holds(ID.ep1, h, 0), x:holds(ID.ep1, h, 1),
        x:holds(ID.ep1, h, 2) }
      x:set_capacity(ID.ep2, 0)                   -- holds nothing at all
      x:record(ID.ep2, H(1))
      r[5] = x:count(ID.ep2)
      return r
    ]]
    assert.same({ 2, true, true, false, 0 }, got)
  end)

  it("purges an endpoint, and removing it from the pool purges it everywhere", function()
    local got = run [[
      local x, y = prefix.index(10), prefix.index(10)
      x:record(ID.ep1, H(1, 2)); y:record(ID.ep1, H(1)); x:record(ID.ep2, H(1))
      x:purge(ID.ep2)
      local r = { named(x:match(H(1, 2))) }
      _G.spec_x, _G.spec_y, _G.spec_id = x, y, ID.ep1
      return r
    ]]
    assert.same({ { ep1 = 2 } }, got)
    assert.is_true(rt:remove("ep1"))
    assert.same({ 0, 0, {} }, S.eval(rt, [[
      local x, y, id = _G.spec_x, _G.spec_y, _G.spec_id
      _G.spec_x, _G.spec_y = nil, nil
      return { x:count(id), y:count(id), x:match(require("lupin.prefix")._from({ 1 })) }
    ]]))
  end)

  it("ignores records for an endpoint no longer in the pool", function()
    local id = S.eval(rt, [[ return require("lupin.runtime.pool").list[1].id ]])
    rt:remove("ep1")
    assert.equal(0, S.eval(rt, PRELUDE .. ([[
      local x = prefix.index(10)
      x:set_capacity(%d, 5)
      x:record(%d, H(1, 2))
      return x:count(%d) + tonumber(require("lupin.runtime.capi").api.prefix_endpoints(x.x))
    ]]):format(id, id, id)))
  end)

  it("bounds its memory by the capacities and reports it", function()
    local got = run [[
      local x = prefix.index(100)
      local empty = x:memory()
      local n = 0
      for round = 1, 100 do
        local v = {}
        for i = 1, 100 do n = n + 1; v[i] = n end
        x:record(ID.ep1, H(unpack(v)))
        if round == 2 then _G.spec_m2 = x:memory() end
      end
      local m2 = _G.spec_m2
      _G.spec_m2 = nil
      return { x:count(ID.ep1), empty > 0, m2 > empty, x:memory() == m2,
        prefix.memory() >= x:memory() }
    ]]
    assert.same({ 100, true, true, true, true }, got)
  end)

  -- Small: few slots, many evictions.  Large: tables that grow, long probe
  -- runs (hashes spread over 52 bits), many holders per hash.
  for _, v in ipairs({ { cap = 8, universe = 30, len = 5, ops = 4000 },
    { cap = 300, universe = 3000, len = 40, ops = 1500 } }) do
    it(("agrees with a plain Lua model over random operations (capacity %d)"):format(v.cap),
      function()
        local got = run(("local CAP, U, LEN, OPS = %d, %d, %d, %d\n"):format(v.cap, v.universe,
          v.len, v.ops) .. [==[
          math.randomseed(42)
          local eps = { ID.ep1, ID.ep2, ID.ep3 }
          local x = prefix.index(CAP)
          local model = { {}, {}, {} } -- per endpoint: hashes, most recent last
          local function m_record(e, v)
            local l = model[e]
            for i = #v, 1, -1 do
              for j = #l, 1, -1 do if l[j] == v[i] then table.remove(l, j) end end
              l[#l + 1] = v[i]
              if #l > CAP then table.remove(l, 1) end
            end
          end
          local function m_holds(e, h)
            for _, y in ipairs(model[e]) do if y == h then return true end end
          end
          local function m_match(v)
            local out = {}
            for _, h in ipairs(v) do
              local any = false
              for e = 1, 3 do
                if m_holds(e, h) then out[eps[e]] = (out[eps[e]] or 0) + 1; any = true end
              end
              if not any then break end
            end
            return out
          end
          local bad = 0
          for _ = 1, OPS do
            local v = {}
            for i = 1, math.random(0, LEN) do v[i] = math.random(1, U) * 2654435761 % 2^52 end
            local op, e = math.random(10), math.random(3)
            if op <= 5 then
              x:record(eps[e], H(unpack(v))); m_record(e, v)
            elseif op == 6 then
              x:purge(eps[e]); model[e] = {}
            else
              local a, b = x:match(H(unpack(v))), m_match(v)
              for _, id in ipairs(eps) do
                if a[id] ~= b[id] then bad = bad + 1 end
              end
              for e2 = 1, 3 do
                if x:count(eps[e2]) ~= #model[e2] then bad = bad + 1 end
              end
            end
          end
          return bad
        ]==])
        assert.equal(0, got)
      end)
  end

  it("returns errors for bad arguments instead of crashing", function()
    local got = run [[
      local api = require("lupin.runtime.capi").api
      local x = prefix.index(4)
      local ids, counts = ffi.new("uint32_t[4]"), ffi.new("uint32_t[4]")
      return {
        api.prefix_record(x.x, ID.ep1, nil, 3),
        tonumber(api.prefix_match(x.x, nil, 3, ids, counts, 4)),
        tonumber(api.prefix_match(x.x, ffi.new("uint64_t[1]"), 1, nil, nil, 4)),
        tonumber(api.prefix_match(nil, ffi.new("uint64_t[1]"), 1, ids, counts, 4)),
        api.prefix_record(nil, ID.ep1, ffi.new("uint64_t[1]"), 1),
        tonumber(api.prefix_count(nil, 1)),
        tonumber(api.prefix_memory(nil)),
      }
    ]]
    assert.same({ -1, -1, -1, -1, -1, 0, 0 }, got)
  end)
end)
