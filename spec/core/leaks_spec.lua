-- Request state that outlives its request is found and its holder named.
local S = require "support"

local function config(stash)
  return {
    plugins = {
      { type = "test-observer", name = "careful" },
      { type = "test-observer", name = "leaky", parameters = { stash = stash } },
      { type = "test-picker", name = "p" },
    },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "p" } } } },
  }
end

describe("leak detection", function()
  local rt
  after_each(function()
    rt:free()
  end)

  it("finds nothing when plugins keep state only in ctx", function()
    rt = S.loaded(config(false))
    S.endpoints(rt, 2)
    for _ = 1, 50 do
      S.lifecycle(rt)
    end
    local n, report = rt:check_leaks()
    assert.equal(0, n)
    assert.equal("", report)
    assert.equal(0, rt:stats().live_request_tables)
  end)

  it("names the plugin that stashes its request state in a global", function()
    rt = S.loaded(config(true))
    S.endpoints(rt, 2)
    for i = 1, 3 do
      local req = rt:begin({ id = "stash-" .. i })
      req:schedule()
      req:finish("ok")
    end
    local n, report = rt:check_leaks()
    assert.equal(3, n)
    assert.matches('plugin "leaky" (test-observer) holds state of ended request stash-1 at '
      .. "globals.stashed[1]", report, 1, true)
    assert.matches("stash-3 at globals.stashed[3]", report, 1, true)
    assert.not_matches('"careful"', report, 1, true)
  end)

  it("counts live request tables while requests are in flight", function()
    rt = S.loaded(config(false))
    S.endpoints(rt, 1)
    local reqs = {}
    for i = 1, 5 do
      reqs[i] = rt:begin({})
      reqs[i]:schedule()
    end
    assert.equal(0, (rt:check_leaks())) -- in flight is not leaked
    assert.equal(5, rt:stats().live_request_tables)
    assert.equal(5, rt:stats().live_requests)
    for i = 1, 5 do
      reqs[i]:finish("cancelled")
    end
    rt:check_leaks()
    assert.equal(0, rt:stats().live_request_tables)
  end)
end)
