-- Call budgets (docs/plugins.md): a plugin call that never returns is cut,
-- whatever the shape of its loop and whether the JIT compiled it; the
-- point's error policy applies and finish still runs once.
local S = require "support"

-- Loops that never end, one per shape.
local SHAPES = {
  ["while"] = "while true do end",
  numeric_for = "for i = 1, math.huge do end",
  generic_for = "local function it() return 1 end for _ in it do end",
  ["repeat"] = "repeat until false",
  ["goto"] = "::top:: goto top",
  tail_recursion = "local function f(n) return f(n + 1) end return f(1)",
  recursion = "local function f(n) return 1 + f(n + 1) end return f(1)",
  string_work = "while true do local s = string.rep('ab', 4096):gsub('a', 'c'):upper() end",
  gsub_callback = "string.rep('a', 100000):gsub('.', function() while true do end end)",
  coroutine = "coroutine.wrap(function() while true do end end)()",
  coroutine_yields = [[local co = coroutine.wrap(function() while true do coroutine.yield() end end)
    while true do co() end]],
  swallowed = "while true do pcall(function() while true do end end) end",
  swallowed_then_returns = "pcall(function() while true do end end) return { 1, 1 }",
  xpcall_handler = "xpcall(error, function() while true do end end) while true do end",
  sort_comparator = [[local t = {} for i = 1, 100 do t[i] = i end
    table.sort(t, function(a, b) while true do end end)]],
  metamethod = "local t = setmetatable({}, { __index = function() while true do end end })"
    .. " return t.x",
}

local function scorer(shape, code)
  return ([[
return {
  type = "loop-%s",
  new = function(params) return { finished = 0, scored = 0 } end,
  score = function(self, ctx, endpoints)
    self.scored = self.scored + 1
    if not ctx.request.dry_run then -- the dry cycle of the load would refuse it
      %s
    end
    return { 1, 1 }
  end,
  finish = function(self) self.finished = self.finished + 1 end,
}
]]):format(shape, code)
end

local dir
setup(function()
  dir = S.tmpdir()
  for shape, code in pairs(SHAPES) do
    S.write(("%s/loop-%s.lua"):format(dir, shape), scorer(shape, code))
  end
end)

local function config(looper, extra)
  local cfg = {
    plugins = {
      { type = looper, name = "loop" },
      { type = "test-scorer", name = "good", parameters = { byIndex = { 0.25, 0.75 } } },
      { type = "test-picker", name = "p" },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "loop" }, { pluginRef = "good" }, { pluginRef = "p" } } } },
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local function runtime()
  return S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
end

local function field(rt, expr)
  return S.eval(rt, "return require('lupin.runtime').current.by_name." .. expr)
end

local function stat(rt, plugin, point)
  for _, s in ipairs(rt:plugin_stats()) do
    if s.plugin == plugin and s.point == point then
      return s
    end
  end
end

local function logs(rt)
  local out = {}
  for _, l in ipairs(rt:logs()) do
    out[#out + 1] = l[2]
  end
  return table.concat(out, "\n")
end

describe("call budgets", function()
  for shape in pairs(SHAPES) do
    it("cut a scorer looping by " .. shape .. "; it contributes 0, finish runs once", function()
      local rt = runtime()
      assert(rt:load_string(S.json.encode(config("loop-" .. shape,
        { budgets = { disableAfterCuts = 0 } }))))
      S.endpoints(rt, 2)
      for _ = 1, 2 do -- the second time, the loop is compiled from the start
        local res = S.lifecycle(rt)
        assert.equal(200, res.status)
        assert.equal("10.0.0.2", res.picks[1].address) -- the good scorer decided
      end
      assert.equal(2, field(rt, "loop.obj.finished"))
      local st = stat(rt, "loop", "score")
      assert.equal(2, st.errors)
      if shape ~= "recursion" then -- plain recursion overflows the stack first
        assert.equal(2, st.cuts)
        assert.matches('plugin "loop" %(loop%-[%w_]+%) exceeded its budget of 5 ms in score',
          logs(rt))
      end
      rt:free()
    end)
  end
end)

-- A picker whose call runs out of time where the spec says: as each of
-- `stall`'s calls is entered, a call hook (stall_at) moves the deadline into
-- the past and raises the cut flag, as a host preempting the VM's vCPU does
-- (on a VM that reports no stolen time, the wait counts as the thread's CPU).
local STALLS_PICKER = [[
-- line 1 is the instrumented file's own function: stall is at line 2
local function stall() end
return {
  type = "stalls-picker",
  pick = function(self, ctx, res)
    stall()
    stall()
    return { res.endpoints[1] }
  end,
}]]

-- The next `times` entries into a function of the stalls-picker defined at
-- line `line` (2: stall, 5: pick) find their time run out.
local function stall_at(rt, line, times)
  S.eval(rt, ([[
    local capi = require "lupin.runtime.capi"
    local B, now, left = capi.budget, capi.now, %d
    debug.sethook(function()
      local f = debug.getinfo(2, "S")
      if left > 0 and f.linedefined == %d and f.short_src:find("stalls-picker", 1, true) then
        left = left - 1
        B.deadline, B.cut = now() - 0.001, 1
      end
    end, "c")
    return 0]]):format(times, line))
end

describe("a call's first overrun", function()
  local rt
  setup(function()
    S.write(dir .. "/stalls-picker.lua", STALLS_PICKER)
  end)
  before_each(function()
    rt = runtime()
    assert(rt:load_string(S.json.encode({
      plugins = { { type = "stalls-picker", name = "p" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "p" } } } },
    })))
    S.endpoints(rt, 2)
  end)
  after_each(function()
    S.eval(rt, "debug.sethook() return 0")
    rt:free()
  end)

  for what, line in pairs({ ["in its code"] = 2, ["before its first line"] = 5 }) do
    it(what .. " gives it its budget once more: not cut", function()
      stall_at(rt, line, 1)
      local res = S.lifecycle(rt)
      assert.equal(200, res.status, res.message)
      local st = stat(rt, "p", "pick")
      assert.equal(0, st.cuts)
      assert.equal(0, st.errors)
      assert.not_matches("exceeded its budget", logs(rt), 1, true)
    end)
  end

  it("is cut, once, when it overruns again in the same call", function()
    stall_at(rt, 2, 2)
    local res = S.lifecycle(rt)
    assert.equal(500, res.status)
    assert.matches('picker "p" failed in profile "default": .*exceeded its budget of 5 ms',
      res.message)
    assert.equal(1, stat(rt, "p", "pick").cuts)
    assert.equal(200, S.lifecycle(rt).status) -- the hook is spent: the next one goes
  end)

  it("is not forgiven in a lifecycle call: a new that overruns once refuses the load",
    function()
      S.write(dir .. "/stalls-picker-in-new.lua", [[
-- as the stalls-picker: stall at line 2
local function stall() end
return {
  type = "stalls-picker-in-new",
  new = function() stall() return {} end,
  pick = function(self, ctx, res) return { res.endpoints[1] } end,
}]])
      stall_at(rt, 2, 1)
      local ok, err = rt:load_string(S.json.encode({
        plugins = { { type = "stalls-picker-in-new", name = "q" } },
        schedulingProfiles = { { name = "default", plugins = { { pluginRef = "q" } } } },
      }), "stall.json")
      assert.is_nil(ok)
      assert.matches("new exceeded its budget of 1000 ms", err, 1, true)
      assert.equal(1, rt:stats().generation)
    end)

  it("is forgiven in each call anew", function()
    for _ = 1, 3 do -- one overrun in each request's pick
      stall_at(rt, 2, 1)
      assert.equal(200, S.lifecycle(rt).status)
    end
    assert.equal(0, stat(rt, "p", "pick").cuts)
  end)
end)

-- A plugin whose hook `where` loops: "load" (the file's top level), "new",
-- "init", "migrate", "shutdown", "dry" (score, in the dry cycle too).
local function lifecycle_plugin(where)
  local loop = "while true do end"
  return ([[
%s
return {
  type = "loop-at-%s",
  new = function(params) %s return {} end,
  init = function(self) %s end,
  migrate = function(self, old) %s end,
  shutdown = function(self) %s end,
  score = function(self, ctx, endpoints) %s return { 1, 1 } end,
}
]]):format(where == "load" and loop or "", where, where == "new" and loop or "",
    where == "init" and loop or "", where == "migrate" and loop or "",
    where == "shutdown" and loop or "", where == "dry" and loop or "")
end

describe("lifecycle budgets", function()
  local ldir
  setup(function()
    ldir = S.tmpdir()
    for _, w in ipairs({ "load", "new", "init", "migrate", "shutdown", "dry" }) do
      S.write(("%s/loop-at-%s.lua"):format(ldir, w), lifecycle_plugin(w))
    end
  end)

  local function cfg(where, budgets)
    return S.json.encode({
      plugins = { { type = "loop-at-" .. where, name = "l" }, { type = "test-picker", name = "p" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "l" },
        { pluginRef = "p" } } } },
      budgets = budgets or { lifecycleMs = 50 },
    })
  end

  local function rt_with_endpoints()
    local rt = S.runtime({ plugin_dirs = { S.FIXTURES, ldir } })
    S.endpoints(rt, 2)
    return rt
  end

  for where, want in pairs({
    load = "loading the file exceeded its budget of 50 ms",
    new = "failed to start: new exceeded its budget of 50 ms",
    init = "failed to start: init exceeded its budget of 50 ms",
    dry = 'plugin "l" %(loop%-at%-dry%) failed in score during the dry scheduling cycle: plugin'
      .. ' "l" %(loop%-at%-dry%) exceeded its budget of 5 ms in score',
  }) do
    it("refuse a load whose plugin loops in " .. where .. "; the old generation serves", function()
      local rt = rt_with_endpoints()
      assert(rt:load_string(S.json.encode({ plugins = { { type = "test-picker", name = "p" } } })))
      local ok, err = rt:load_string(cfg(where), "loop.json")
      assert.is_nil(ok)
      assert.matches(want, err)
      assert.equal(1, rt:stats().generation)
      assert.equal(200, S.lifecycle(rt).status)
      rt:free()
    end)
  end

  it("load a plugin whose first call only is cut: the dry cycle runs once more", function()
    -- slow once, as a cold first call or a preempted machine can make any
    -- plugin: the second dry cycle decides, and the plugin then serves
    S.write(ldir .. "/slow-once.lua", [[
local calls = 0
return {
  type = "slow-once",
  new = function() return {} end,
  score = function(self, ctx, endpoints)
    calls = calls + 1
    if calls == 1 then while true do end end
    return { 1, 1 }
  end,
}]])
    local rt = rt_with_endpoints()
    assert(rt:load_string(S.json.encode({
      plugins = { { type = "slow-once", name = "s" }, { type = "test-picker", name = "p" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "s" },
        { pluginRef = "p" } } } },
    }), "slow.json"))
    assert.equal(1, rt:stats().generation)
    assert.equal(200, S.lifecycle(rt).status)
    rt:free()
  end)

  it("refuse a reload whose plugin loops in migrate", function()
    local rt = rt_with_endpoints()
    assert(rt:load_string(cfg("migrate")))
    local ok, err = rt:load_string(cfg("migrate"))
    assert.is_nil(ok)
    assert.matches("failed to start: migrate exceeded its budget of 50 ms", err)
    assert.equal(1, rt:stats().generation)
    rt:free()
  end)

  it("log a shutdown cut and go on", function()
    local rt = rt_with_endpoints()
    assert(rt:load_string(cfg("shutdown")))
    assert(rt:load_string(S.json.encode({ plugins = { { type = "test-picker", name = "p" } } })))
    assert.equal(1, rt:stats().generations_alive)
    assert.matches("shutdown failed: shutdown exceeded its budget of 50 ms", logs(rt))
    rt:free()
  end)

  it("take a plugin's own maxLifecycleMs over the config's", function()
    local rt = rt_with_endpoints()
    local c = S.json.decode(cfg("init"))
    c.plugins[1].maxLifecycleMs = 20
    local ok, err = rt:load_string(S.json.encode(c))
    assert.is_nil(ok)
    assert.matches("init exceeded its budget of 20 ms", err)
    rt:free()
  end)
end)

describe("the cut policy", function()
  it("disable an instance after disableAfterCuts cuts, counted in stats", function()
    local rt = runtime()
    local c = config("loop-while", { budgets = { disableAfterCuts = 2 } })
    c.plugins[1].maxCallMs = 3
    assert(rt:load_string(S.json.encode(c)))
    S.endpoints(rt, 2)
    for _ = 1, 4 do
      assert.equal(200, S.lifecycle(rt).status)
    end
    assert.equal(2, field(rt, "loop.obj.scored")) -- not called once disabled
    local st = stat(rt, "loop", "score")
    assert.equal(2, st.cuts)
    assert.equal(4, st.errors)
    assert.is_true(st.disabled)
    assert.matches('plugin "loop" %(loop%-while%) is disabled: cut 2 times by its budget of 3 ms',
      logs(rt))
    -- a disabled plugin is not called again, finish included: the request
    -- whose cut disabled it is not finished by it
    assert.equal(1, field(rt, "loop.obj.finished"))
    rt:free()
  end)

  it("refuse bad budget settings with the field named", function()
    local rt = runtime()
    for _, case in ipairs({
      { { budgets = { callMs = 0 } }, "budgets.callMs: callMs must be a number from 0.01" },
      { { budgets = { disableAfterCuts = 1.5 } }, "disableAfterCuts must be an integer" },
      { { budgets = { cpuMs = 1 } }, 'unknown field "cpuMs" in the budgets section' },
    }) do
      local ok, err = rt:load_string(S.json.encode(config("test-scorer", case[1])))
      assert.is_nil(ok)
      assert.matches(case[2], err, 1, true)
    end
    local c = config("test-scorer")
    c.plugins[1].maxCallMs = "5"
    local ok, err = rt:load_string(S.json.encode(c))
    assert.is_nil(ok)
    assert.matches("plugins[0].maxCallMs: maxCallMs must be a number of milliseconds", err, 1, true)
    rt:free()
  end)
end)

describe("budgets over what a plugin returns", function()
  local SPIN = "setmetatable({}, { __index = function() while true do end end })"
  for what, case in pairs({
    module = { "return " .. SPIN, "checking the plugin's table exceeded its budget of 50 ms" },
    instance = { ('return { type = "spin-instance", new = function() return %s end }'):format(SPIN),
      "reading its extension points exceeded its budget of 50 ms" },
  }) do
    it("cut a looping __index on the " .. what .. " table", function()
      local d = S.tmpdir()
      S.write(("%s/spin-%s.lua"):format(d, what), case[1])
      local rt = S.runtime({ plugin_dirs = { S.FIXTURES, d } })
      local ok, err = rt:load_string(S.json.encode({ plugins = { { type = "spin-" .. what } },
        budgets = { lifecycleMs = 50 } }))
      assert.is_nil(ok)
      assert.matches(case[2], err, 1, true)
      rt:free()
    end)
  end
end)
