-- Budgets inside built-ins (docs/plugins.md, "Budgets"): a built-in C
-- function that runs long on hostile input is cut inside the call, at the
-- call's budget, and reported like any other cut; recursion through C
-- callbacks ends in a Lua error, never a crash of the process.
--
-- Each hostile call below is followed at once by `self.after = true`, with
-- no loop or call in between: LuaJIT's own built-ins run to their end, the
-- plugin then returns without passing a poll, and the call is not cut at
-- all (the patterns would run for seconds to minutes first).  Ours stop
-- inside the built-in: the line after it never runs.
local S = require "support"
local now = require("lupin_native").now

local function bomb(n) -- backtracks about 2^n times on n letters
  return ("a?"):rep(n) .. ("a"):rep(n) .. "b"
end

local SUBJECT = ("a"):rep(22)
local BOMB = bomb(22) -- a few seconds with LuaJIT's matcher

-- Hostile code by name; `self.big` is what new made (the lifecycle budget
-- is long), `S`/`P` the subject and pattern.
local HOSTILE = {
  find = "local r = S:find(P)",
  match = "local r = S:match(P)",
  gmatch = "for r in S:gmatch(P) do end",
  gmatch_sandbox = "local it = string.gmatch(S, P) local r = it()",
  gsub = "local r = S:gsub(P, 'x')",
  gsub_function = "local r = S:gsub(P, function(x) return x end)",
  rep = "local r = ('x'):rep(3e8)",
  rep_separator = "local r = string.rep('ab', 1e8, '--')",
  concat = "local r = table.concat(self.big)",
  sort = "table.sort(self.numbers)",
  plain_find = "local r = self.huge:find('needle', 1, true)",
  gsub_big_replacement = "local r = ('x'):rep(5000):gsub('x', self.mb)",
}

local function scorer(name, code)
  return ([[
local S, P = %q, %q
return {
  type = "hostile-%s",
  new = function()
    local big, numbers = {}, {}
    if %q == "concat" then
      local s = ("x"):rep(1e7)
      for i = 1, 25 do big[i] = s end
    elseif %q == "sort" then
      for i = 1, 1e6 do numbers[i] = (i * 7919) %% 1000003 end
    end
    local huge = %q == "plain_find" and ("ab"):rep(2.5e8) or ""
    return { big = big, numbers = numbers, huge = huge, mb = ("y"):rep(2 ^ 20), after = false,
      calls = 0 }
  end,
  score = function(self, ctx, endpoints)
    if not ctx.request.dry_run then
      self.calls = self.calls + 1
      %s
      self.after = true
    end
    return { 1, 1 }
  end,
}
]]):format(SUBJECT, BOMB, name, name, name, name, code)
end

local dir
setup(function()
  dir = S.tmpdir()
  for name, code in pairs(HOSTILE) do
    S.write(("%s/hostile-%s.lua"):format(dir, name), scorer(name, code))
  end
end)

local function loaded(plugin, extra)
  -- a memory limit: a crash of the guards must not take the machine's memory
  local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir }, memory_limit = 3e9 })
  local cfg = {
    budgets = { lifecycleMs = 10000 },
    plugins = {
      { type = plugin, name = "hostile" },
      { type = "test-scorer", name = "good", parameters = { byIndex = { 0.25, 0.75 } } },
      { type = "test-picker", name = "p" },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "hostile" }, { pluginRef = "good" }, { pluginRef = "p" } } } },
  }
  for k, v in pairs(extra or {}) do
    cfg.plugins[1][k] = v
  end
  assert(rt:load_string(S.json.encode(cfg)))
  S.endpoints(rt, 2)
  return rt
end

local function stat(rt, point)
  for _, s in ipairs(rt:plugin_stats()) do
    if s.plugin == "hostile" and s.point == point then
      return s
    end
  end
  return { calls = 0, errors = 0, cuts = 0 }
end

local function logs(rt)
  local out = {}
  for _, l in ipairs(rt:logs()) do
    out[#out + 1] = l[2]
  end
  return table.concat(out, "\n")
end

local function field(rt, expr)
  return S.eval(rt, "return require('lupin.runtime').current.by_name.hostile.obj." .. expr)
end

describe("a built-in running long in a plugin call", function()
  for name in pairs(HOSTILE) do
    it("is cut inside the built-in: " .. name, function()
      local rt = loaded("hostile-" .. name)
      local t0 = now()
      local res = S.lifecycle(rt)
      local took = now() - t0
      assert.equal(200, res.status) -- a cut scorer contributes 0
      assert.equal("10.0.0.2", res.picks[1].address)
      assert.equal(1, field(rt, "calls"))
      assert.is_false(field(rt, "after"), "the line after the built-in ran: it was not cut inside")
      local st = stat(rt, "score")
      assert.equal(1, st.cuts)
      assert.matches('plugin "hostile" %(hostile%-[%w_]+%) exceeded its budget of 5 ms in score',
        logs(rt))
      -- generous: uncut, these take seconds or minutes
      assert.is_true(took < 1, ("the lifecycle took %.3f s"):format(took))
      -- the runtime's own code still runs the originals between calls
      assert.equal(200, S.lifecycle(rt).status)
      rt:free()
    end)
  end

  it("is cut at the budget the plugin was given (maxCallMs)", function()
    local rt = loaded("hostile-find", { maxCallMs = 50 })
    local t0 = now()
    S.lifecycle(rt)
    local took = now() - t0
    assert.equal(1, stat(rt, "score").cuts)
    assert.matches("exceeded its budget of 50 ms in score", logs(rt))
    assert.is_true(took >= 0.05, "cut before its budget")
    rt:free()
  end)
end)

-- Code a plugin's score runs; each must end in a Lua error, not a crash.
local DEEP = {
  gsub_function = "local function f() return (('x'):gsub('x', f)) end f()",
  gsub_table = [[local t
    local function f() return (('x'):gsub('x', t)) end
    t = setmetatable({}, { __index = function() return f() end })
    f()]],
  resume = "local function f() coroutine.resume(coroutine.create(f)) error('unwound') end f()",
  resume_checked = [[local function f()
      local ok, err = coroutine.resume(coroutine.create(f))
      if not ok then error(err, 0) end
    end
    f()]],
  wrap = "local function f() coroutine.wrap(f)() end f()",
  format_tostring = [[local t
    t = setmetatable({}, { __tostring = function(s) return string.format('%s', s) end })
    tostring(t)]],
  sort_comparator = [[local function f() table.sort({ 3, 2, 1 }, function(a, b) f() return a < b end) end
    f()]],
  index_chain = "local t t = setmetatable({}, { __index = function(s, k) return s[k] end }) return t.x",
  pcall_nest = "local function f() return pcall(f) end f() error('unwound')",
  xpcall_nest = "local function f() return xpcall(f, f) end f() error('unwound')",
  tostring_nest = [[local t
    t = setmetatable({}, { __tostring = function(s) return 'x' .. tostring(s) end })
    tostring(t)]],
  bad_comparator = "local t = {} for i = 1, 100 do t[i] = i end table.sort(t, function() return true end)",
  format_width = "string.format('%99999d', 1)",
  unpack_range = "unpack({}, 1, 1e8)",
  cjson_deep = [[local cjson = require "cjson"
    cjson.decode(('['):rep(100000))]],
  cjson_decode_depth_raised = [[local cjson = require "cjson"
    cjson.decode_max_depth(1e7)
    cjson.decode(('['):rep(1e6))]],
  cjson_encode_depth_raised = [[local cjson = require "cjson.safe"
    cjson.encode_max_depth(1e7)
    local t = {} local u = t for i = 1, 1e6 do u[1] = {} u = u[1] end
    local ok, err = cjson.encode(t) error(err)]],
  cjson_deep_in_recursion = [[local cjson = require "cjson"
    local deep = ("["):rep(999) .. ("]"):rep(999)
    local function f() cjson.decode(deep) return (("x"):gsub("x", f)) end
    f()]],
  cjson_instance_depth_raised = [[local cjson = require("cjson").new()
    cjson.decode_max_depth(1e7)
    cjson.decode(('['):rep(1e6))]],
}

describe("table.new in a plugin", function()
  it("takes its sizes as a hint: a huge one costs no time", function()
    S.write(dir .. "/huge-new.lua", [[
local tnew = require "table.new"
return {
  type = "huge-new",
  new = function() return { after = false } end,
  score = function(self, ctx, endpoints)
    if not ctx.request.dry_run then
      for i = 1, 5 do -- LuaJIT's own clears 10^7 slots each time: 100 ms
        local t = tnew(1e7, 1e7)
        t[1], t.x = 1, 2
      end
      self.after = true
    end
    return { 1, 1 }
  end,
}]])
    local rt = loaded("huge-new", { maxCallMs = 20 })
    assert.equal(200, S.lifecycle(rt).status)
    assert.is_true(field(rt, "after"))
    assert.equal(0, stat(rt, "score").cuts)
    rt:free()
  end)
end)

describe("recursion through C callbacks in a plugin", function()
  for name, code in pairs(DEEP) do
    it("ends in a Lua error: " .. name, function()
      S.write(("%s/deep-%s.lua"):format(dir, name), ([[
return {
  type = "deep-%s",
  score = function(self, ctx, endpoints)
    if not ctx.request.dry_run then
      %s
    end
    return { 1, 1 }
  end,
}]]):format(name, code))
      local rt = loaded("deep-" .. name, { maxCallMs = 2000 })
      local res = S.lifecycle(rt)
      assert.equal(200, res.status)
      assert.equal("10.0.0.2", res.picks[1].address)
      assert.equal(1, stat(rt, "score").errors)
      assert.matches("plugin hostile %(deep%-[%w_]+%) failed in score", logs(rt))
      assert.equal(200, S.lifecycle(rt).status) -- and the runtime goes on
      rt:free()
    end)
  end
end)
