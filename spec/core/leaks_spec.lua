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

-- One request through schedule to its end.
local function ended(rt, id)
  local req = rt:begin({ id = id })
  req:schedule()
  req:finish("ok")
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
      ended(rt, "stash-" .. i)
    end
    local n, report = rt:check_leaks()
    assert.equal(3, n)
    assert.matches('plugin "leaky" (test-observer) holds state of ended request stash-1 at '
      .. "globals.stashed[1]", report, 1, true)
    assert.matches("stash-3 at globals.stashed[3]", report, 1, true)
    assert.not_matches('"careful"', report, 1, true)
  end)

  it("still names leaks and refuses an ended request's ctx once manifests are reused",
    function()
      local c = config(true)
      c.plugins[2].parameters.stashOnly = "keep"
      rt = S.loaded(c)
      S.endpoints(rt, 2)
      ended(rt, "keep-1")
      -- thousands of requests, collected as they go: their manifests are
      -- swept and handed to later requests
      for i = 1, 3000 do
        ended(rt, "r" .. i)
        if i % 500 == 0 then
          S.eval(rt, "collectgarbage() collectgarbage() return 0")
        end
      end
      ended(rt, "keep-2")
      local n, report = rt:check_leaks()
      assert.equal(2, n)
      assert.matches("ended request keep-1 at globals.stashed", report, 1, true)
      assert.matches("ended request keep-2 at globals.stashed", report, 1, true)
      -- the first kept ctx still knows its request ended: it does not find
      -- a later request through a manifest used again
      local used = S.eval(rt, [[
        local rec = require("lupin.runtime").current.by_name.leaky
        local ok, err = pcall(function() return rec.env.stashed_ctx[1].request.id end)
        return { ok = ok, err = tostring(err) }]])
      assert.is_false(used.ok)
      assert.matches("ctx used after its request ended", used.err, 1, true)
    end)

  it("takes no state a compiled trace holds until the flush for a leak", function()
    rt = S.loaded({
      plugins = { { type = "test-trace-constant", name = "tc" }, { type = "test-picker", name = "p" } },
      schedulingProfiles = { { name = "default",
        plugins = { { pluginRef = "tc" }, { pluginRef = "p" } } } },
    })
    S.endpoints(rt, 2)
    for i = 1, 5 do
      ended(rt, "tc-" .. i)
    end
    local held = [[
      collectgarbage() collectgarbage()
      local n = 0
      for _ in pairs(require("lupin.runtime").current.by_name.tc.obj.held) do n = n + 1 end
      return n]]
    -- what the check has to see through: ended requests' state that only a
    -- trace still holds (the first look finds it alive)
    assert.is_true(S.eval(rt, held) > 0)
    local n, report = rt:check_leaks()
    assert.equal("", report)
    assert.equal(0, n)
    assert.equal(0, S.eval(rt, held))
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
