-- A long run leaves Lua memory flat and no request table behind.
local S = require "support"

describe("memory", function()
  it("stays flat over 1,000,000 request lifecycles", function()
    local rt = S.runtime()
    assert(rt:load_string(S.json.encode({
      plugins = {
        { type = "test-observer", name = "obs", parameters = { record = false } },
        { type = "test-scorer", name = "s", parameters = { record = false } },
        { type = "test-picker", name = "p" },
      },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "s" }, { pluginRef = "p" } } } },
    })))
    S.endpoints(rt, 4)
    local body = '{"model":"m","prompt":"hello"}'
    local function run(n)
      for _ = 1, n do
        local req = rt:begin({ body = body })
        req:schedule()
        req:response_header(200, {})
        req:response_complete()
        req:finish("ok")
      end
      rt:check_leaks() -- full GC
      return rt:stats().lua_memory
    end
    -- The heap after a full collection moves by up to ~200 KiB from one
    -- measure to the next with no trend (the string table's size, the
    -- collector's timing): the least of three measures, early and late,
    -- compared; a leak of a third of a byte a request still shows.
    local function least(n)
      return math.min(run(n), run(n), run(n))
    end
    run(100000)
    local warm = least(50000)
    run(600000)
    local after = least(50000)
    local s = rt:stats()
    assert.equal(1000000, s.requests_ended)
    assert.equal(0, s.live_request_tables)
    assert.equal(0, s.live_requests)
    -- flat: within 256 KiB of the warmed-up heap
    assert.is_true(math.abs(after - warm) < 256 * 1024,
      ("lua memory went from %d to %d bytes"):format(warm, after))
    rt:free()
  end)
end)

describe("big blocks", function()
  -- Long prompts: LuaJIT maps each block of 128 KB or more afresh; the
  -- allocator rounds big sizes up and keeps a few freed blocks for the next
  -- (core/alloc.c).  Whatever it keeps, its books must count exactly what
  -- LuaJIT's own count says Lua holds.
  it("are reused for long prompts and leave the accounting exact", function()
    local rt = S.runtime()
    assert(rt:load_string(S.json.encode({
      plugins = { { type = "test-scorer", name = "s", parameters = { record = false } },
        { type = "test-picker", name = "p" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "s" }, { pluginRef = "p" } } } },
    })))
    S.endpoints(rt, 4)
    local function books()
      rt:check_leaks() -- full GC
      local lua_count = S.eval(rt, "return collectgarbage('count') * 1024")
      return rt:stats().lua_memory, lua_count
    end
    local function run(n, size)
      for i = 1, n do
        local prompt = string.rep(string.char(97 + i % 26), size)
        local req = rt:begin({ body = '{"model":"m","prompt":"' .. prompt .. '"}' })
        assert.truthy(req:schedule())
        req:finish("ok")
      end
      return books()
    end
    local warm = run(30, 256 * 1024)
    -- sizes on both sides of powers of two: blocks of several rounded sizes
    -- kept, handed out again, grown and shrunk
    for _, size in ipairs({ 200 * 1024, 300 * 1024, 129 * 1024, 1024 * 1024, 256 * 1024, 100 }) do
      local used, lua_count = run(30, size)
      assert.is_true(math.abs(used - lua_count) < 4096,
        ("after %d-byte prompts the books say %d bytes, LuaJIT %d"):format(size, used, lua_count))
      assert.is_true(math.abs(used - warm) < 256 * 1024,
        ("lua memory %d after %d-byte prompts, %d warm"):format(used, size, warm))
    end
    -- a big string Lua still holds is counted; growing it in place too
    S.eval(rt, "big_held = string.rep('x', 3 * 1024 * 1024) .. string.rep('y', 300 * 1024)")
    local used, lua_count = books()
    assert.is_true(math.abs(used - lua_count) < 4096)
    assert.is_true(used - warm > 3 * 1024 * 1024, ("holding 3.3 MiB: %d over"):format(used - warm))
    rt:free()
  end)
end)
