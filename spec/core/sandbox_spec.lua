-- The plugin sandbox (docs/plugins.md): each escape a plugin file might try
-- at load is refused with an error that says why, and nothing runs.
local S = require "support"

local dir, marker
setup(function()
  dir = S.tmpdir()
  marker = dir .. "/marker"
end)

-- Loads a plugin whose file's top level runs `code`; returns the error.
local function load_error(name, code)
  S.write(("%s/escape-%s.lua"):format(dir, name), ([[
%s
return { type = "escape-%s", score = function() return { 1 } end }
]]):format(code, name))
  local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
  local ok, err = rt:load_string(S.json.encode({ plugins = { { type = "escape-" .. name } } }))
  rt:free()
  assert.is_nil(ok, name .. " loaded")
  return err
end

describe("the plugin sandbox", function()
  local TOUCH = "'touch %s'"
  for name, case in pairs({
    os_execute = { "os.execute(" .. TOUCH .. ")", "os.execute is not available to plugins" },
    os_exit = { "os.exit(3)", "os.exit is not available to plugins" },
    os_getenv = { "local _ = os.getenv('HOME')", "os.getenv is not available to plugins" },
    io_open = { "io.open('%s', 'w')", "io is not available to plugins" },
    io_popen = { "io.popen(" .. TOUCH .. ")", "io is not available to plugins" },
    require_ffi = { "require('ffi')", 'require "ffi" is not allowed in a plugin' },
    require_io = { "require('io')", 'require "io" is not allowed in a plugin' },
    require_os = { "require('os').execute(" .. TOUCH .. ")", 'require "os" is not allowed' },
    require_capi = { "require('lupin.runtime.capi')", 'require "lupin.runtime.capi" is not allowed' },
    require_runtime = { "require('lupin.runtime')", 'require "lupin.runtime" is not allowed' },
    debug = { "debug.getregistry()", "debug is not available to plugins" },
    package_loadlib = { "package.loadlib('libc.so.6', 'system')",
      "package is not available to plugins" },
    package_loaded = { "local _ = package.loaded.ffi", "package is not available to plugins" },
    load = { "load([[os.execute(" .. TOUCH .. ")]])()", "load is not available to plugins" },
    loadstring = { "loadstring('return 1')()", "loadstring is not available to plugins" },
    dofile = { "dofile('/etc/passwd')", "dofile is not available to plugins" },
    loadfile = { "loadfile('/etc/passwd')", "loadfile is not available to plugins" },
    setfenv = { "setfenv(1, {})", "setfenv is not available to plugins" },
    getfenv = { "getfenv(0).os.execute(" .. TOUCH .. ")", "getfenv is not available to plugins" },
    collectgarbage = { "collectgarbage('stop')", "collectgarbage is not available to plugins" },
    jit = { "jit.off()", "jit is not available to plugins" },
    newproxy = { "newproxy(true)", "newproxy is not available to plugins" },
    string_dump = { "string.dump(function() end)", "attempt to call field 'dump'" },
    string_method_dump = { "('').dump(function() end)", "attempt to call field 'dump'" },
    string_metatable = { "getmetatable('').__index.x = 1", "attempt to index a nil value" },
    sdk_ffi = { "local _ = require('lupin.prefix').ffi.C", "attempt to index field 'ffi'" },
    reserved_name = { "local __lupin_c = 1", "the name __lupin_c is reserved for lupin" },
    print = { "print('hi')", "print is not available to plugins" },
    runtime_dict = { "require('lupin.shared').dict('lupin.flow'):set('n:5', 1e9)",
      'shared dict "lupin.flow": names beginning with "lupin." are reserved for the runtime' },
    runtime_dict_opener = { "require('lupin.shared')._runtime_dict('lupin.flow')",
      "attempt to call field '_runtime_dict'" },
  }) do
    it("refuse " .. name, function()
      local code = case[1]:format(marker, marker)
      local err = load_error(name, code)
      assert.matches(case[2], err, 1, true)
      assert.is_nil(io.open(marker), "the marker file was created")
    end)
  end

  it("keep the allow-list: libraries, the SDK, cjson, table.new, a clock", function()
    S.write(dir .. "/allowed.lua", [[
local cjson = require "cjson"
local new_table = require "table.new"
local clear = require "table.clear"
local schema = require "lupin.schema"
local prefix = require "lupin.prefix"
local shared = require "lupin.shared"
local t = new_table(4, 0)
t[1] = cjson.encode({ a = bit.band(7, 3), b = math.floor(2.5), c = string.upper("x") })
clear(t)
assert(type(os.clock()) == "number" and type(os.time()) == "number")
assert(type(schema.check) == "function" and type(prefix.hashes) == "function")
assert(shared.dict("sandbox"):incr("loads", 1, 0) >= 1)
local co = coroutine.wrap(function() coroutine.yield(1) end)
assert(co() == 1 and select("#", 1, 2) == 2 and rawlen({ 1, 2 }) == 2)
assert(getmetatable(setmetatable({}, { __index = {} })) ~= nil)
return { type = "allowed", score = function() return { 1 } end }
]])
    local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
    assert(rt:load_string(S.json.encode({ plugins = { { type = "allowed" } } })))
    rt:free()
  end)

  it("give each plugin its own copy of an SDK module", function()
    S.write(dir .. "/tamper.lua", [[
require("lupin.prefix").hashes = nil
string.rep = nil
return { type = "tamper", score = function() return { 1 } end }
]])
    local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
    assert(rt:load_string(S.json.encode({ plugins = {
      { type = "tamper" }, { type = "prefix-cache-scorer" } } })))
    S.endpoints(rt, 2)
    assert.equal(200, S.lifecycle(rt, '{"model":"m","prompt":"' .. ("x"):rep(400) .. '"}').status)
    rt:free()
  end)
end)
