-- Plugin files: found in plugins/ and configured directories, each run in its
-- own global environment.
local S = require "support"

describe("plugin loading", function()
  it("gives each plugin file its own globals", function()
    local rt = S.loaded({
      plugins = { { type = "test-globals", name = "g" }, { type = "test-globals-other", name = "o" } },
    })
    S.endpoints(rt, 1)
    S.lifecycle(rt)
    S.lifecycle(rt)
    local g = S.eval(rt, [[return require("lupin.runtime").current.by_name.g.obj.report()]])
    local o = S.eval(rt, [[return require("lupin.runtime").current.by_name.o.obj.report()]])
    assert.same({ counter = 2, shout = true }, g) -- its own global; cannot see other_marker
    assert.same({ shout = false }, o) -- cannot see counter, nor g's string.shout
    -- and the runtime's own globals are untouched
    assert.same({ false, false }, S.eval(rt, [[return { counter ~= nil, string.shout ~= nil }]]))
    rt:free()
  end)

  it("loads plugins from a configured directory, which can override a built-in", function()
    local dir = S.tmpdir()
    S.write(dir .. "/max-score-picker.lua", [[
      return { type = "max-score-picker", schema = {},
        pick = function(_, _, scored) return { scored.endpoints[#scored.endpoints] } end }]])
    local rt = S.runtime({ plugin_dirs = { dir } })
    assert(rt:load("examples/configs/minimal.json") == nil) -- the override has no maxNumOfEndpoints
    assert(rt:load_string('{"plugins": [{"type": "max-score-picker"}]}'))
    S.endpoints(rt, 3)
    assert.equal("ep3", S.lifecycle(rt).picks[1].name)
    rt:free()
    os.execute("rm -rf " .. dir)
  end)

  it("refuses a file whose declared type differs from its name", function()
    local dir = S.tmpdir()
    S.write(dir .. "/mislabeled.lua", 'return { type = "something-else" }')
    local rt = S.runtime({ plugin_dirs = { dir } })
    local ok, err = rt:load_string('{"plugins": [{"type": "mislabeled"}]}', "c.json")
    assert.is_nil(ok)
    assert.matches('declares type "something-else" but its file name says "mislabeled"', err, 1,
      true)
    S.write(dir .. "/mislabeled.lua", 'return 42')
    ok, err = rt:load_string('{"plugins": [{"type": "mislabeled"}]}', "c.json")
    assert.is_nil(ok)
    assert.matches("must return a table, got number", err, 1, true)
    S.write(dir .. "/mislabeled.lua", 'return { type = "mislabeled", schema = { x = { type = "float" } } }')
    ok, err = rt:load_string('{"plugins": [{"type": "mislabeled"}]}', "c.json")
    assert.is_nil(ok)
    assert.matches('schema field "x" needs a type', err, 1, true)
    S.write(dir .. "/mislabeled.lua", 'error("top-level failure")')
    ok, err = rt:load_string('{"plugins": [{"type": "mislabeled"}]}', "c.json")
    assert.is_nil(ok)
    assert.matches("mislabeled.lua:1: top-level failure", err, 1, true)
    rt:free()
    os.execute("rm -rf " .. dir)
  end)

  it("runs init and shutdown once per generation, and migrate(old) on a reload", function()
    local dir = S.tmpdir()
    S.write(dir .. "/lifecycle-probe.lua", [[
      local events = {}
      return { type = "lifecycle-probe",
        new = function() return { gen = #events } end,
        init = function(self) events[#events + 1] = "init" end,
        migrate = function(self, old) events[#events + 1] = "migrate"; self.carried = old end,
        shutdown = function() events[#events + 1] = "shutdown" end,
        score = function(_, _, eps) local s = {} for i = 1, #eps do s[i] = 1 end return s end,
        events = function() return events end }]])
    local rt = S.runtime({ plugin_dirs = { dir } })
    local cfg = '{"plugins": [{"type": "lifecycle-probe", "name": "lp"}]}'
    assert(rt:load_string(cfg))
    assert(rt:load_string(cfg))
    -- each load runs the file afresh, so each generation has its own `events`
    local events = S.eval(rt, [[
      local g = require("lupin.runtime").current.by_name.lp
      return { g.obj.events(), g.obj.carried ~= nil }]])
    assert.same({ { "init", "migrate" }, true }, events)
    rt:free()
    os.execute("rm -rf " .. dir)
  end)
end)
