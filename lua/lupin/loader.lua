-- Finding and loading plugin files.  Each load runs the file afresh in its own
-- environment, so a plugin's globals are its own and a reload gets new code.
local ffi = require "ffi"
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

--- The extension points and lifecycle hooks a plugin may define.
M.POINTS = {
  "admit", "prepare", "pick_profiles", "process_results", "filter", "score", "pick",
  "pre_request", "response_header", "response_chunk", "response_complete", "finish",
  "init", "shutdown", "migrate",
}

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

local SAFE = {
  "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber", "tostring",
  "type", "unpack", "xpcall", "setmetatable", "getmetatable", "rawget", "rawset",
  "rawequal", "require",
}
local LIBS = { "string", "table", "math", "bit", "coroutine" }

local function copy(t)
  local c = {}
  for k, v in pairs(t) do
    c[k] = v
  end
  return c
end

--- A fresh global environment for one plugin file: the safe base functions and
--- private copies of the standard library tables.
function M.environment()
  local env = {}
  for _, k in ipairs(SAFE) do
    env[k] = _G[k]
  end
  for _, k in ipairs(LIBS) do
    env[k] = copy(_G[k])
  end
  env.os = { clock = os.clock, time = os.time, date = os.date, getenv = os.getenv }
  env._G = env
  return env
end

--- Loads one plugin file.  Returns the module and its environment, or nil and
--- an error with the file and line.  Third result: the file's text.
---@param path string
---@param want_type string the type the file name promises
function M.load(path, want_type)
  -- read, then compile: the text is kept for the generation's source digest
  local f, ferr = io.open(path, "rb")
  if not f then
    return nil, ferr
  end
  local text = f:read("*a")
  f:close()
  local chunk, err = loadstring(text, "@" .. path)
  if not chunk then
    return nil, err
  end
  local env = M.environment()
  setfenv(chunk, env)
  local ok, mod = pcall(chunk)
  if not ok then
    return nil, tostring(mod)
  end
  if type(mod) ~= "table" then
    return nil, ("%s: a plugin file must return a table, got %s"):format(path, type(mod))
  end
  if mod.type ~= want_type then
    return nil, ("%s: the plugin declares type %q but its file name says %q"):format(
      path, tostring(mod.type), want_type)
  end
  if mod.schema ~= nil then
    local sok, serr = schema.check(mod.schema)
    if not sok then
      return nil, ("%s: %s"):format(path, serr)
    end
  end
  if mod.new ~= nil and type(mod.new) ~= "function" then
    return nil, ("%s: new must be a function"):format(path)
  end
  return mod, env, text
end

return M
