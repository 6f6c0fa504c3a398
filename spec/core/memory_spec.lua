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
    local warm = run(100000)
    local after = run(900000)
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
