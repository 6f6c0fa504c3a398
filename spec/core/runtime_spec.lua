-- Creating a runtime, its stats and its logs.
local S = require "support"
local native = require "lupin_native"

describe("runtime", function()
  it("reports a home without the Lua side clearly", function()
    local rt, err = native.new({ home = "/nonexistent/lupin" })
    assert.is_nil(rt)
    assert.matches("module 'lupin.runtime' not found", err, 1, true)
    assert.matches("/nonexistent/lupin/lua/lupin/runtime/init.lua", err, 1, true)
  end)

  it("accounts Lua memory and counts requests", function()
    local rt = S.runtime()
    local s = rt:stats()
    assert.is_true(s.lua_memory > 10000) -- the SDK modules are loaded
    assert.is_true(s.lua_memory_peak >= s.lua_memory)
    assert.same({ 0, 0, 0, 0 }, { s.requests_begun, s.generation, s.generations_alive, s.endpoints })
    assert(rt:load("examples/configs/minimal.json"))
    S.endpoints(rt, 2)
    S.lifecycle(rt)
    s = rt:stats()
    assert.same({ 1, 1, 0, 1, 1, 2 }, { s.requests_begun, s.requests_ended, s.live_requests,
      s.generation, s.generations_alive, s.endpoints })
    rt:free()
  end)

  it("passes log lines to the host's sink, at or above its level", function()
    local rt = S.runtime({ log_level = 0 }) -- errors only
    assert(rt:load_string(S.json.encode({
      plugins = { { type = "test-scorer", name = "bad", parameters = { fail = true } },
        { type = "test-picker", name = "p" } },
    })))
    S.endpoints(rt, 1)
    S.lifecycle(rt)
    rt:eval([[require("lupin.log").info("not shown") return 1]])
    local logs = rt:logs()
    assert.equal(1, #logs)
    assert.equal(0, logs[1][1])
    assert.matches("failed in score", logs[1][2], 1, true)
    rt:free()
  end)

  it("refuses calls on a freed runtime", function()
    local rt = S.runtime()
    rt:free()
    assert.has_error(function() rt:stats() end, "runtime already freed")
  end)
end)
