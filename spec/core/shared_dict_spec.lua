-- Shared dicts (lupin.shared over core/shared_dict.c): one dict per name for
-- every runtime made with one lupin_shared, bounded, atomic increments.  The
-- threads hammering incr are spec/core/prefix_threads.c's.
local S = require "support"
local native = require "lupin_native"

describe("lupin.shared dicts", function()
  local shared, a, b

  before_each(function()
    shared = native.shared()
    a = S.runtime({ shared = shared })
    b = S.runtime({ shared = shared })
  end)

  after_each(function()
    a:free()
    b:free()
  end)

  local function run(rt, code)
    -- pair: a result and its error as one string (JSON has no holes)
    return S.eval(rt, 'local shared = require "lupin.shared"\n'
      .. "local function pair(v, e) return tostring(v) .. ' ' .. tostring(e) end\n" .. code)
  end

  it("get, set, delete and count numbers, strings and booleans", function()
    local got = run(a, [[
      local d = shared.dict("t")
      local out = { d:count(), d:get("absent") == nil }
      assert(d:set("n", 1.5) == true and d:set("s", ("x"):rep(1000)) and d:set("t", true))
      assert(d:set("f", false) and d:set("empty", ""))
      out[#out + 1] = { d:get("n"), #d:get("s"), d:get("t"), d:get("f"), d:get("empty") }
      out[#out + 1] = d:count()
      d:set("n", "now a string") -- a value changes type in place
      out[#out + 1] = d:get("n")
      d:set("t", nil)           -- nil deletes
      d:delete("f")
      d:delete("never there")
      out[#out + 1] = { d:count(), d:get("t") == nil, d:get("f") == nil }
      return out]])
    assert.same({ 0, true, { 1.5, 1000, true, false, "" }, 5, "now a string", { 3, true, true } },
      got)
  end)

  it("reads a string longer than any before it whole", function()
    assert.equal(300000, run(a, [[
      local d = shared.dict("t")
      d:set("big", ("y"):rep(300000))
      return #d:get("big")]]))
  end)

  it("increments atomically from init, and answers not found and not a number", function()
    local got = run(a, [[
      local d = shared.dict("t")
      local out = { d:incr("c", 1, 0), d:incr("c", 2.5), d:incr("c", -1, 100) }
      out[#out + 1] = pair(d:incr("missing", 1))
      d:set("s", "x")
      out[#out + 1] = pair(d:incr("s", 1, 0))
      out[#out + 1] = d:get("missing") == nil
      return out]])
    assert.same({ 1, 3.5, 2.5, "nil not found", "nil not a number", true }, got)
  end)

  it("is one dict for every runtime of the lupin_shared, and another for another name", function()
    run(a, [[shared.dict("t"):set("k", "from a"); shared.dict("t"):incr("c", 1, 0)]])
    assert.equal("from a", run(b, [[return shared.dict("t"):get("k")]]))
    assert.equal(2, run(b, [[return shared.dict("t"):incr("c", 1)]]))
    assert.equal(3, run(a, [[return shared.dict("t"):incr("c", 1)]]))
    assert.equal(0, run(b, [[return shared.dict("other"):count()]]))
    -- a runtime of its own has its own
    local c = S.runtime()
    assert.equal(0, run(c, [[return shared.dict("t"):count()]]))
    c:free()
  end)

  it("refuses a new key past max_entries with nil, full; known keys still change", function()
    local got = run(a, [[
      local d = shared.dict("small", { max_entries = 2 })
      assert(d:set("a", 1) and d:set("b", 2))
      local out = { pair(d:set("c", 3)), pair(d:incr("c", 1, 0)), d:set("a", 10), d:incr("b", 1) }
      d:delete("a")
      out[#out + 1] = d:set("c", 3)
      out[#out + 1] = { d:count(), d:max_entries(), shared.dict("small", { max_entries = 50 }):max_entries() }
      return out]])
    assert.same({ "nil full", "nil full", true, 3, true, { 2, 2, 2 } }, got)
  end)

  it("bounds the process's dicts together: no memory past MAX_BYTES, room back on delete",
    function()
    local got = run(a, [[
      local mb = ("v"):rep(1048576)
      local d = shared.dict("big")
      local n, ok, err = 0, true, nil
      while ok and n < 100 do
        ok, err = d:set("k" .. n, mb)
        n = ok and n + 1 or n
      end
      -- a set that would replace a value with a longer one keeps the old one
      d:set("short", "x")
      local replaced = pair(d:set("short", mb))
      return { n, err, replaced, d:get("short") }]])
    assert.same({ "no memory", "nil no memory", "x" }, { got[2], got[3], got[4] })
    assert.is_true(got[1] >= 60 and got[1] < 64, "1 MB values that fit: " .. got[1])
    -- another runtime, another dict: the same budget
    assert.equal("nil no memory", run(b, [[
      return pair(shared.dict("other"):set("k", ("w"):rep(1048576)))]]))
    local warned = {}
    for _, l in ipairs(b:logs()) do
      warned[#warned + 1] = l[2]
    end
    assert.matches('shared dict "other": a write was refused: the plugins\' dicts hold 64 MB',
      table.concat(warned, "\n"), 1, true)
    -- small keys fill what is left, incr's new keys included, then stop
    assert.equal("nil no memory", run(b, [[
      local d, i, v, e = shared.dict("counters", { max_entries = 1000000 }), 0, 0, nil
      while v do
        i = i + 1
        v, e = d:incr("c" .. i, 1, 0)
      end
      return pair(v, e)]]))
    -- the runtime's own dicts (flow control's counts) are outside the budget
    assert.equal(1, run(b, [[return shared._runtime_dict("lupin.flow"):incr("n:0", 1, 0)]]))
    run(a, [[shared.dict("big"):delete("k0")]])
    assert.equal(true, run(b, [[return shared.dict("other"):set("k", ("w"):rep(1048576))]]))
  end)

  it("makes at most MAX_DICTS dicts for plugins in a process, and says so past it", function()
    local got = run(a, [[
      local made, err = 0, nil
      for i = 1, shared.MAX_DICTS + 1 do
        local ok, e = pcall(shared.dict, "d" .. i)
        if not ok then
          err = e
          break
        end
        made = made + 1
      end
      return { made, err, shared.dict("d1"):set("k", 1),
        shared._runtime_dict("lupin.flow"):incr("n:0", 1, 0) }]])
    assert.equal(1024, got[1])
    assert.matches('shared dict "d1025": cannot be made: the process has 1024 dicts', got[2], 1, true)
    assert.is_true(got[3]) -- the dicts made still serve
    assert.equal(1, got[4]) -- and the runtime still opens its own
  end)

  it("names what is wrong with a bad name, key, value, delta or bound", function()
    local got = run(a, [[
      local d = shared.dict("t")
      local out = {}
      for _, f in ipairs({
        function() shared.dict(42) end,
        function() shared.dict("") end,
        function() shared.dict("x", { max_entries = 0 }) end,
        function() shared.dict("x", { max_entries = 1.5 }) end,
        function() d:get(1) end,
        function() d:set(nil, 1) end,
        function() d:set("", 1) end,
        function() d:set(("k"):rep(65536), 1) end,
        function() d:set("k", {}) end,
        function() d:set("k", ("v"):rep(1048577)) end,
        function() d:incr("k", "1") end,
        function() d:incr("k", 1, "0") end,
        function() d:delete(true) end,
      }) do
        local ok, err = pcall(f)
        out[#out + 1] = ok and "no error" or err
      end
      return out]])
    local want = {
      "shared dict name must be a non-empty string, got number",
      'shared dict name must be a non-empty string, got ""',
      'shared dict "x": max_entries must be an integer from 1 to 2^31, got 0',
      'shared dict "x": max_entries must be an integer from 1 to 2^31, got 1.5',
      "shared dict key must be a string, got number",
      "shared dict key must be a string, got nil",
      "shared dict key must not be empty",
      "shared dict key is 65536 bytes, more than 65535",
      "shared dict value must be a number, string, boolean or nil, got table",
      'shared dict "t": the value is longer than 1048576 bytes',
      "shared dict incr: delta must be a number, got string",
      "shared dict incr: init must be a number or nil, got string",
      "shared dict key must be a string, got boolean",
    }
    assert.equal(#want, #got)
    for i, w in ipairs(want) do
      assert.matches(w, got[i], 1, true)
    end
  end)

  it("counts a plugin's requests per model across two runtimes", function()
    local cfg = S.json.encode({ plugins = {
      { type = "spec-model-counter" }, { type = "test-scorer" }, { type = "max-score-picker" } } })
    assert(a:load_string(cfg, "a.json"))
    assert(b:load_string(cfg, "b.json"))
    S.endpoints(a, 2)
    S.endpoints(b, 2)
    local seen = {}
    for i = 1, 6 do
      local rt = i % 2 == 1 and a or b
      local model = i <= 4 and "m1" or "m2"
      local res = S.lifecycle(rt, S.json.encode({ model = model, prompt = "hi" }))
      seen[i] = res.headers["x-model-requests"]
    end
    assert.same({ "1", "2", "3", "4", "1", "2" }, seen)
    assert.equal(2, run(a, [[return shared.dict("model-requests"):count()]]))
  end)
end)
