-- Finding and loading plugin files.  Each load runs the file afresh in its own
-- environment, so a plugin's globals are its own and a reload gets new code.
local ffi = require "ffi"
local budget = require "lupin.runtime.budget"
local readonly = require "lupin.runtime.readonly"
local schema = require "lupin.schema"

local M = {}

ffi.cdef [[
typedef struct lupin_dir lupin_dir;
struct lupin_dirent {
  uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type;
  char d_name[256];
};
lupin_dir *opendir(const char *name);
struct lupin_dirent *readdir(lupin_dir *dir);
int closedir(lupin_dir *dir);
]]


local function list_lua_files(dir)
  local d = ffi.C.opendir(dir)
  if d == nil then
    return {}
  end
  local names = {}
  while true do
    local e = ffi.C.readdir(d)
    if e == nil then
      break
    end
    local name = ffi.string(e.d_name)
    local base = name:match("^(.+)%.lua$")
    if base then
      names[#names + 1] = base
    end
  end
  ffi.C.closedir(d)
  return names
end

--- Maps each plugin type to its file: `<dir>/<type>.lua`.  Later directories
--- win, so an operator's directory can override a built-in plugin.
---@param dirs string[]
---@return table<string, string> files, string[] types
function M.catalog(dirs)
  local files = {}
  for _, dir in ipairs(dirs) do
    for _, base in ipairs(list_lua_files(dir)) do
      files[base] = dir .. "/" .. base
    end
  end
  local types = {}
  for t in pairs(files) do
    types[#types + 1] = t
  end
  table.sort(types)
  for t, f in pairs(files) do
    files[t] = f .. ".lua"
  end
  return files, types
end

-- The sandbox (docs/plugins.md, "What a plugin can reach"): an allow-list.
local SAFE = {
  "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber", "tostring",
  "type", "unpack", "xpcall", "setmetatable", "rawget", "rawset", "rawequal",
}
local LIBS = { "string", "table", "math", "bit", "coroutine" }
-- What a plugin may require: the SDK, which is every module directly in
-- lua/lupin/ (the runtime's own live in its subfolders, lupin.testing is the
-- author's test kit and sdk.lua holds types only), and the libraries the
-- built-ins use.  The folder is the list: a module moved in or out of it is
-- reachable or not without a second place to edit.
local SDK_DIR = assert(debug.getinfo(1, "S").source:match("^@(.*/)generation/[^/]*$"),
  "lupin.generation.loader: not loaded from lua/lupin/generation/, the SDK folder is unknown")
local NOT_SDK = { testing = true, sdk = true }
M.REQUIRE = { cjson = true, ["cjson.safe"] = true, ["table.new"] = true, ["table.clear"] = true }
for _, base in ipairs(list_lua_files(SDK_DIR)) do
  if not NOT_SDK[base] then
    M.REQUIRE["lupin." .. base] = true
  end
end
-- Names a plugin reaches for in vain, answered with why instead of nil.
local DENIED = { "ffi", "io", "debug", "package", "jit", "load", "loadstring", "loadfile",
  "dofile", "setfenv", "getfenv", "collectgarbage", "module", "newproxy", "print", "gcinfo" }

-- Bytecode and the means to run it stay out of the runtime's whole state:
-- strings share one metatable, so ("").dump would reach it from a plugin.
string.dump = nil -- luacheck: ignore 122

local function copy(t)
  local c = {}
  for k, v in pairs(t) do
    c[k] = v
  end
  return c
end

local function denier(what, names)
  local set = {}
  for _, k in ipairs(names) do
    set[k] = true
  end
  return {
    __index = function(_, k)
      if set[k] then
        error(("%s%s is not available to plugins (sandbox; see docs/plugins.md)"):format(
          what, tostring(k)), 2)
      end
    end,
    __metatable = false,
  }
end

-- A table whose metatable is locked (__metatable) is the runtime's: shared
-- by plugins (a dict handle, a prefix index), it takes no raw writes either.
local raw_getmetatable, raw_rawset = debug.getmetatable, rawset
local function locked(t)
  return type(t) == "table" and getmetatable(t) ~= raw_getmetatable(t)
end

local function sandbox_rawset(t, k, v)
  if locked(t) then
    error("rawset: the table is the runtime's and read-only to plugins", 2)
  end
  return raw_rawset(t, k, v)
end

-- The table functions that write without metamethods, refusing the same.
local function guarded(f, name)
  return function(t, ...)
    if locked(t) then
      error(name .. ": the table is the runtime's and read-only to plugins", 2)
    end
    return f(t, ...)
  end
end
local TABLE_WRITES = { "insert", "remove", "sort" }

-- A copy of an SDK module for one plugin, its plain tables (schemas,
-- presets, counters) copied too: what one plugin changes in it, no other
-- plugin, runtime code or later generation sees.  Tables with a metatable
-- are objects whose metatables lock them; functions are shared.
local function module_copy(t, seen)
  local c = {}
  seen[t] = c
  for k, v in pairs(t) do
    if type(v) == "table" and getmetatable(v) == nil then
      v = seen[v] or module_copy(v, seen)
    end
    c[k] = v
  end
  return c
end

-- Libraries whose settings are process-wide (cjson's number precision and
-- depth limits) come as an instance of the plugin's own.
local INSTANCE = {
  cjson = function() return require("cjson").new() end,
  ["cjson.safe"] = function() return require("cjson.safe").new() end,
}
local guarded_clear = guarded(require "table.clear", "table.clear")
INSTANCE["table.clear"] = function() return guarded_clear end

local function sandbox_require(name)
  if INSTANCE[name] then
    return INSTANCE[name]()
  end
  if not M.REQUIRE[name] then
    local allowed = {}
    for k in pairs(M.REQUIRE) do
      allowed[#allowed + 1] = k
    end
    table.sort(allowed)
    error(("require %q is not allowed in a plugin (sandbox); allowed: %s"):format(
      tostring(name), table.concat(allowed, ", ")), 2)
  end
  local mod = require(name)
  if type(mod) ~= "table" then
    return mod
  end
  -- a copy: a plugin cannot change what another plugin or the runtime sees;
  -- an SDK module's fields named with a leading "_" are the runtime's alone
  local c = module_copy(mod, {})
  if name:sub(1, 6) == "lupin." then
    for k in pairs(mod) do
      if type(k) == "string" and k:sub(1, 1) == "_" then
        c[k] = nil
      end
    end
  end
  return c
end

-- Only tables' metatables: strings' and cdata's belong to the runtime.
local function sandbox_getmetatable(v)
  if type(v) ~= "table" then
    return nil
  end
  return getmetatable(v)
end

-- Iteration and length see through read-only views (lupin.readonly).
local unwrap = readonly.unwrap
local raw_next, raw_ipairs, raw_unpack = next, ipairs, unpack
local function sandbox_pairs(t)
  return raw_next, unwrap(t), nil
end
local function sandbox_next(t, k)
  return raw_next(unwrap(t), k)
end
local function sandbox_ipairs(t)
  return raw_ipairs(unwrap(t))
end
local function sandbox_unpack(t, i, j)
  return raw_unpack(unwrap(t), i, j)
end
local function sandbox_rawlen(v)
  return #unwrap(v)
end

local function no_randomseed()
  error("math.randomseed is not available to plugins: the random stream is every plugin's"
    .. " (seed a generator of your own)", 2)
end

--- A fresh global environment for one plugin file: the allow-list and
--- private copies of the standard library tables.
function M.environment()
  local env = {}
  for _, k in ipairs(SAFE) do
    env[k] = _G[k]
  end
  for _, k in ipairs(LIBS) do
    env[k] = copy(_G[k])
  end
  env.rawlen = sandbox_rawlen -- 5.2-only in LuaJIT
  env.pairs, env.next, env.ipairs, env.unpack = sandbox_pairs, sandbox_next, sandbox_ipairs,
    sandbox_unpack
  for _, name in ipairs(TABLE_WRITES) do -- the table library as installed (lupin.guard)
    env.table[name] = guarded(env.table[name], "table." .. name)
  end
  env.require = sandbox_require
  env.getmetatable = sandbox_getmetatable
  env.rawset = sandbox_rawset
  env.math.randomseed = no_randomseed
  env.os = setmetatable({ clock = os.clock, time = os.time },
    denier("os.", { "execute", "exit", "getenv", "remove", "rename", "tmpname", "date",
      "setlocale", "difftime" }))
  env._G = env
  return setmetatable(env, denier("", DENIED))
end

-- Checks what a plugin file returned.  Its tables may carry metamethods
-- (plugin code): this runs under the load's budget.
local function inspect(path, want_type, mod)
  if type(mod) ~= "table" then
    return ("%s: a plugin file must return a table, got %s"):format(path, type(mod))
  end
  if mod.type ~= want_type then
    return ("%s: the plugin declares type %q but its file name says %q"):format(
      path, tostring(mod.type), want_type)
  end
  if mod.schema ~= nil then
    local sok, serr = schema.check(mod.schema)
    if not sok then
      return ("%s: %s"):format(path, serr)
    end
  end
  if mod.new ~= nil and type(mod.new) ~= "function" then
    return ("%s: new must be a function"):format(path)
  end
end

--- Loads one plugin file.  Returns the module and its environment, or nil and
--- an error with the file and line.  Third result: the file's text.
---@param path string
---@param want_type string the type the file name promises
---@param load_ms number? the budget for running the file (budgets.lifecycleMs)
---@param builtin boolean? the file is one of lupin's own plugins
function M.load(path, want_type, load_ms, builtin)
  -- read, then compile: the text is kept for the generation's source digest
  local f, ferr = io.open(path, "rb")
  if not f then
    return nil, ferr
  end
  local text = f:read("*a")
  f:close()
  local chunk, err = budget.compile(text, "@" .. path, builtin)
  if not chunk then
    return nil, err
  end
  local env = M.environment()
  setfenv(chunk, env)
  local seconds = (load_ms or budget.DEFAULT_LIFECYCLE_MS) / 1000
  local ok, mod, cut = budget.pcall(seconds, chunk)
  if cut then
    return nil, ("%s: loading the file exceeded its budget of %g ms"):format(path, seconds * 1000)
  elseif not ok then
    return nil, budget.describe(mod)
  end
  local iok, ierr, icut = budget.pcall(seconds, inspect, path, want_type, mod)
  if icut or not iok or ierr then
    return nil, icut and ("%s: checking the plugin's table exceeded its budget of %g ms"):format(
      path, seconds * 1000) or budget.describe(ierr)
  end
  return mod, env, text
end

return M
