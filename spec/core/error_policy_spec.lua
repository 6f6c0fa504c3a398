-- The error policy holds whatever a plugin throws or returns: tables,
-- cdata, nil, objects whose __tostring throws, loops or returns a non-string,
-- errors from finish, from an error handler, from a coroutine.
local S = require "support"

-- What a scorer throws, by name.
local THROWS = {
  table = "error({ code = 1 })",
  ["nil"] = "error(nil)",
  cdata = "error(ctx.request and endpoints[1])",
  tostring_throws = "error(setmetatable({}, { __tostring = function() error('again') end }))",
  tostring_loops = "error(setmetatable({}, { __tostring = function() while true do end end }))",
  tostring_not_string = "error(setmetatable({}, { __tostring = function() return {} end }))",
  in_handler = "xpcall(error, function() error({}) end) error('after handler')",
  coroutine = "coroutine.wrap(function() error(setmetatable({}, { __tostring = error })) end)()",
  scores_index_loops = "return setmetatable({}, { __index = function() while true do end end })",
  scores_index_throws = "return setmetatable({}, { __index = function() error({}) end })",
}

local dir
setup(function()
  dir = S.tmpdir()
  for name, code in pairs(THROWS) do
    S.write(("%s/throw-%s.lua"):format(dir, name), ([[
return {
  type = "throw-%s",
  new = function() return { finished = 0 } end,
  score = function(self, ctx, endpoints)
    if ctx.request.dry_run then return { 1, 1 } end
    %s
  end,
  finish = function(self) self.finished = self.finished + 1 end,
}
]]):format(name, code))
  end
  -- a finish that throws an object whose __tostring throws
  S.write(dir .. "/bad-finish.lua", [[
return {
  type = "bad-finish",
  finish = function(self, ctx, outcome)
    if outcome ~= "dry_run" then
      error(setmetatable({}, { __tostring = function() error({}) end }))
    end
  end,
}
]])
end)

local function field(rt, expr)
  return S.eval(rt, "return require('lupin.runtime').current.by_name." .. expr)
end

describe("the error policy, closed", function()
  for name in pairs(THROWS) do
    it("keep a scorer's error at 0 when it " .. name .. "; finish runs", function()
      local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
      assert(rt:load_string(S.json.encode({
        plugins = {
          { type = "bad-finish", name = "bf" },
          { type = "throw-" .. name, name = "bad" },
          { type = "test-scorer", name = "good", parameters = { byIndex = { 0.25, 0.75 } } },
          { type = "test-observer", name = "obs" },
          { type = "test-picker", name = "p" },
        },
        schedulingProfiles = { { name = "default", plugins = {
          { pluginRef = "bad" }, { pluginRef = "good" }, { pluginRef = "p" } } } },
      })))
      S.endpoints(rt, 2)
      local res = S.lifecycle(rt)
      assert.equal(200, res.status)
      assert.equal("10.0.0.2", res.picks[1].address)
      assert.equal(1, field(rt, "bad.obj.finished"))
      -- the observer after the throwing finish still finished the request
      assert.equal(1, S.eval(rt, [[local n = 0
        for id in pairs(require('lupin.runtime').current.by_name.obs.obj.finished or {}) do
          if id ~= "dry-run" then n = n + 1 end end return n]]))
      for _, l in ipairs(rt:logs()) do
        assert.equal("string", type(l[2]))
      end
      rt:free()
    end)
  end
end)
