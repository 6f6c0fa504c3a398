-- Generations: a reload builds the next one off to the side, checks it with a
-- dry scheduling cycle, and swaps it in only if everything passed; requests
-- stay on the generation they began on.
local S = require "support"

local function config(observer)
  return S.json.encode({
    plugins = {
      { type = "test-observer", name = "obs", parameters = observer },
      { type = "prefix-cache-scorer", parameters = { blockSize = 4, autoTune = false } },
      { type = "active-request-scorer" },
      { type = "max-score-picker" },
    },
  })
end

describe("reload", function()
  local rt
  before_each(function()
    rt = S.runtime()
    assert(rt:load_string(config(), "v1.json"))
    S.endpoints(rt, 3)
  end)
  after_each(function()
    rt:free()
  end)

  it("keeps the current generation when a plugin fails only in the dry cycle", function()
    local ok, err = rt:load_string(config({ fail = { "prepare" }, failDry = true }), "v2.json")
    assert.is_nil(ok)
    assert.matches('v2.json:1: plugins[0]: plugin "obs" (test-observer) failed in prepare during'
      .. " the dry scheduling cycle", err, 1, true)
    assert.matches("boom in prepare", err, 1, true)
    assert.equal(1, rt:stats().generation)
    assert.equal(1, rt:stats().generations_alive)
    assert.equal(200, S.lifecycle(rt).status)
  end)

  it("records and counts nothing in the dry cycle", function()
    local function state()
      return S.eval(rt, [[
        local g = require("lupin.runtime").current
        local counts = 0
        for _, c in pairs(g.by_name["active-request-scorer"].obj.counts or {}) do
          counts = counts + c
        end
        local index, indexed = g.by_name["prefix-cache-scorer"].obj.index, 0
        for _, ep in ipairs(require("lupin.runtime.pool").list) do indexed = indexed + index:count(ep.id) end
        return { active = counts, indexed = indexed }]])
    end
    S.lifecycle(rt, '{"model":"m","prompt":"aaaabbbbcccc"}')
    local before = state()
    assert.equal(3, before.indexed) -- the prompt's three blocks, on one endpoint
    assert(rt:load_string(config(), "v2.json"))
    assert.same(before, state())
    assert.equal(0, before.active)
  end)

  it("keeps a request on the generation it began on, and shuts the old one down after it",
    function()
      local req = rt:begin({ id = "pinned", body = '{"model":"m","prompt":"aaaabbbb"}' })
      assert(rt:load_string(config({ status = 499 }), "v2.json"))
      assert.equal(2, rt:stats().generations_alive)
      assert.equal(200, req:schedule().status)
      -- the pinned request ran generation 1's observer
      local gen_of = S.eval(rt, [[
        local out
        require("lupin.runtime.leaks").each_live(function(r) out = r.gen.number end)
        return out]])
      assert.equal(1, gen_of)
      req:finish("ok")
      assert.equal(1, rt:stats().generations_alive)
      assert.equal(2, rt:stats().generation)
      assert.equal(0, (rt:check_leaks()))
    end)

  it("leaves Lua memory flat over 1,000 reloads", function()
    local function reloads(n)
      for i = 1, n do
        assert(rt:load_string(config(), "v" .. i .. ".json"))
        S.lifecycle(rt)
      end
      rt:check_leaks()
      return rt:stats().lua_memory
    end
    local warm = reloads(100)
    local after = reloads(1000)
    assert.equal(1, rt:stats().generations_alive)
    assert.is_true(math.abs(after - warm) < 128 * 1024,
      ("lua memory went from %d to %d bytes"):format(warm, after))
  end)

  it("lists the live generations with their source, digest and pinned requests", function()
    local gens = rt:generations()
    assert.equal(1, #gens)
    local g1 = gens[1]
    assert.equal(1, g1.number)
    assert.is_true(g1.current)
    assert.equal("v1.json", g1.source)
    assert.matches("^%x+$", g1.digest)
    assert.equal(16, #g1.digest)
    assert.equal(0, g1.pinned)
    assert.truthy(g1.load_seconds > 0)
    assert.truthy(g1.loaded_unix > 1.7e9)

    local req = rt:begin({ id = "pinned", body = '{"model":"m","prompt":"aaaabbbb"}' })
    -- the same sources under another name: the same digest
    assert(rt:load_string(config(), "v2.json"))
    gens = rt:generations()
    assert.equal(2, #gens)
    assert.same({ 2, true, "v2.json", 0 }, { gens[1].number, gens[1].current, gens[1].source,
      gens[1].pinned })
    assert.same({ 1, false, 1 }, { gens[2].number, gens[2].current, gens[2].pinned })
    assert.equal(g1.digest, gens[1].digest)
    assert.truthy(gens[1].loaded_at >= g1.loaded_at)
    req:finish("ok")
    assert.equal(1, #rt:generations())

    -- other config text: another digest
    assert(rt:load_string(config({ status = 499 }), "v3.json"))
    assert.are_not.equal(g1.digest, rt:generations()[1].digest)
  end)
end)
