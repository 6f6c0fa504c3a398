-- A generation whose plugins have no response or finish hooks: the core
-- makes no call into Lua for those points, and nothing plugins can see
-- changes -- response headers set earlier still reach the client, state
-- held past the end is still found.
local S = require "support"

local QUIET = [[
return {
  type = "spec-quiet",
  schema = { stash = { type = "boolean", default = false } },
  pre_request = function(self, ctx)
    ctx.plugin.seen = true
    ctx:set_response_header("X-Quiet", ctx.request.id)
    if self.params.stash and not ctx.request.dry_run then
      quiet_stash = quiet_stash or {} -- luacheck: ignore (the leak under test)
      quiet_stash[#quiet_stash + 1] = ctx.plugin -- luacheck: ignore
    end
  end,
}
]]

describe("points no plugin implements", function()
  local rt, dir
  before_each(function()
    dir = S.tmpdir()
    S.write(dir .. "/spec-quiet.lua", QUIET)
  end)
  after_each(function()
    rt:free()
    os.execute("rm -rf " .. dir)
  end)

  local function loaded(stash)
    rt = S.loaded({
      plugins = { { type = "spec-quiet", name = "quiet", parameters = { stash = stash } } },
    }, { plugin_dirs = { dir, S.FIXTURES } })
    S.endpoints(rt, 2)
  end

  it("still publishes response headers set before the response", function()
    loaded(false)
    local req = rt:begin({ id = "q-1" })
    assert.equal(200, req:schedule().status)
    local headers = req:response_header(200, { ["content-type"] = "text/plain" })
    assert.equal("q-1", headers["x-quiet"])
    assert.is_true(req:response_chunk("data"))
    assert.is_true(req:response_complete())
    req:finish("ok")
    assert.equal(0, (rt:check_leaks()))
    assert.equal(0, rt:stats().live_request_tables)
  end)

  it("calls into Lua for the head, a chunk or the end only when a plugin has that hook", function()
    -- finish alone (the default config's bounded-load-picker): no call at the
    -- head, the chunks or the end; finish still sees the head (ctx.response)
    local FINISH_ONLY = [[
      return {
        type = "spec-finish-only",
        finish = function(self, ctx)
          self.status = ctx.response and ctx.response.status
          self.type = ctx.response and ctx.response.headers["content-type"]
        end,
      }]]
    S.write(dir .. "/spec-finish-only.lua", FINISH_ONLY)
    S.write(dir .. "/spec-chunks.lua", [[
      return { type = "spec-chunks", response_chunk = function(self) self.n = (self.n or 0) + 1 end }]])
    local function points(plugin)
      rt = S.loaded({ plugins = { { type = plugin, name = "p" } } },
        { plugin_dirs = { dir, S.FIXTURES } })
      S.endpoints(rt, 2)
      S.eval(rt, [[
        local engine = require "lupin.runtime.engine"
        local point = engine.point
        _G.spec_points = {}
        engine.point = function(r, name, ...)
          _G.spec_points[name] = (_G.spec_points[name] or 0) + 1
          return point(r, name, ...)
        end
        return 0]])
      local req = rt:begin({})
      assert.equal(200, req:schedule().status)
      req:response_header(201, { ["Content-Type"] = "text/event-stream" })
      for _ = 1, 3 do
        req:response_chunk("data: x\n\n")
      end
      req:response_complete()
      req:finish("ok")
      local got = S.eval(rt, [[
        local p = require("lupin.runtime").current.by_name.p.obj
        return { points = _G.spec_points, status = p.status or false, n = p.n or 0,
          type = p.type or false }]])
      rt:free()
      return got
    end
    local finish_only = points("spec-finish-only")
    assert.same({}, finish_only.points)
    assert.equal(201, finish_only.status)
    assert.equal("text/event-stream", finish_only.type)
    local chunks = points("spec-chunks")
    assert.same({ response_header = 1, response_chunk = 3 }, chunks.points)
    assert.equal(3, chunks.n)
    rt = S.runtime() -- (after_each frees one)
  end)

  it("gives finish no ctx.response when no response came, and each request its own", function()
    S.write(dir .. "/spec-finish-seen.lua", [[
      return {
        type = "spec-finish-seen",
        new = function() return { seen = {} } end,
        finish = function(self, ctx, outcome)
          local r = ctx.response
          self.seen[#self.seen + 1] = outcome .. " " .. (r and (r.status .. " "
            .. tostring(r.headers["x-n"])) or "none")
        end,
      }]])
    rt = S.loaded({ plugins = { { type = "spec-finish-seen", name = "p" } } },
      { plugin_dirs = { dir, S.FIXTURES } })
    S.endpoints(rt, 2)
    local cancelled = rt:begin({})
    cancelled:schedule()
    local a, b = rt:begin({}), rt:begin({})
    a:schedule()
    b:schedule()
    a:response_header(200, { ["X-N"] = "a" })
    b:response_header(503, { ["x-n"] = "b", ["X-Other"] = "o" })
    a:response_header(201, { ["x-n"] = "a2" }) -- a second head replaces the first
    cancelled:finish("cancelled")
    b:finish("upstream_error")
    a:finish("ok")
    -- (the first: the dry run that checks the generation before it serves)
    assert.same({ "dry_run none", "cancelled none", "upstream_error 503 b", "ok 201 a2" },
      S.eval(rt, [[
      return require("lupin.runtime").current.by_name.p.obj.seen]]))
    assert.equal(0, (rt:check_leaks()))
  end)

  it("still finds state held past the end of its request", function()
    loaded(true)
    for i = 1, 2 do
      S.lifecycle(rt, nil, "ok")
      local req = rt:begin({ id = "quiet-" .. i })
      req:schedule()
      req:finish("cancelled")
    end
    local n, report = rt:check_leaks()
    assert.equal(4, n)
    assert.matches('plugin "quiet" (spec-quiet) holds state of ended request quiet-2 at '
      .. "globals.quiet_stash[4]", report, 1, true)
    assert.equal(0, rt:stats().live_request_tables)
  end)

  it("tells live requests from ended ones", function()
    loaded(false)
    local live = rt:begin({ id = "live" })
    live:schedule()
    S.lifecycle(rt)
    local ids = S.eval(rt, [[
      local out = {}
      require("lupin.runtime.leaks").each_live(function(r) out[#out + 1] = r.id end)
      return out]])
    assert.same({ "live" }, ids)
    live:finish("ok")
  end)
end)
