--- lupin.shared: dicts every runtime (worker) of the process sees alike, as
--- OpenResty's ngx.shared.DICT (core/shared_dict.c; docs/writing-a-plugin.md).
---
---   local shared = require "lupin.shared"
---   local d = shared.dict("requests")        -- the same dict in every worker
---   d:incr("model:" .. model, 1, 0)          -- atomic, returns the new value
---   d:get("model:" .. model)                 -- number, string, boolean or nil
---
--- Keys are strings; values numbers, strings or booleans (nil deletes).  A
--- dict holds at most max_entries keys: a new key past that is refused with
--- nil, "full".  Dicts live as long as the process's runtimes, across
--- reloads.
local ffi = require "ffi"
local capi = require "lupin.runtime.capi"
local log = require "lupin.log"

---@class lupin.shared
local M = {}

--- The bound on a dict's entries when its first user gives none.
M.DEFAULT_MAX_ENTRIES = 10000
M.MAX_KEY = 65535
M.MAX_VALUE = 1048576
--- What the plugins' dicts of the process hold at most together, and how
--- many there are at most (core/internal.h); the runtime's own are apart.
M.MAX_BYTES = 64 * 1048576
M.MAX_DICTS = 1024

local NIL, NUMBER, STRING, BOOLEAN = 0, 1, 2, 3
local FULL, NOT_FOUND, NOT_NUMBER, TOO_LONG, NO_MEMORY = 1, 2, 3, 4, 5

local value = ffi.new("lupin_dict_value") -- reused: a runtime is single-threaded
local result = ffi.new("double[1]")
local buf_size = 256
local buf = ffi.new("char[?]", buf_size)

---@class lupin.SharedDict
local Dict = {}

-- A handle is an empty table: its C dict and name live here, where Lua code
-- outside this file cannot reach them (a plugin that wrote handle.d = nil
-- made the next call pass NULL to C).  Every plugin of a runtime using a
-- name gets the same handle, so the handle itself is read-only.
local cdict = setmetatable({}, { __mode = "k" }) -- handle -> lupin_dict *
local names = setmetatable({}, { __mode = "k" }) -- handle -> name

local HANDLE = {
  __index = Dict,
  __newindex = function(_, k)
    error(("a shared dict handle is read-only (setting %s)"):format(tostring(k)), 2)
  end,
  __tostring = function(self)
    return ("shared dict %q"):format(names[self] or "?")
  end,
  __metatable = false, -- a plugin cannot change the methods other plugins call
}

-- The C dict of a handle; an error at the caller's caller for anything else
-- (a method called on another table: Dict.get(t, k)).
local function dict_of(self)
  local d = cdict[self]
  if not d then
    error("not a shared dict handle: call the methods on what shared.dict returns (d:get(k))", 3)
  end
  return d
end

local dicts = {} -- name -> handle, for this runtime

local function check_key(key, level)
  if type(key) ~= "string" then
    error(("shared dict key must be a string, got %s"):format(type(key)), level + 1)
  end
  if key == "" then
    error("shared dict key must not be empty", level + 1)
  end
  if #key > M.MAX_KEY then
    error(("shared dict key is %d bytes, more than %d"):format(#key, M.MAX_KEY), level + 1)
  end
end

local function open(name, opts)
  local max = opts and opts.max_entries or M.DEFAULT_MAX_ENTRIES
  if type(max) ~= "number" or max < 1 or max % 1 ~= 0 or max > 2 ^ 31 then
    error(("shared dict %q: max_entries must be an integer from 1 to 2^31, got %s"):format(
      name, tostring(max)), 3)
  end
  local self = dicts[name]
  if self then
    return self
  end
  local d = capi.shared.dict_open(capi.rt, name, max)
  if d == nil then
    error(("shared dict %q: cannot be made: the process has %d dicts, the most it holds"
      .. " (or memory ran out); use fewer names"):format(name, M.MAX_DICTS), 3)
  end
  self = setmetatable({}, HANDLE)
  cdict[self], names[self] = d, name
  dicts[name] = self
  return self
end

--- The dict of that name, made on first use with room for max_entries keys
--- (later callers get the same dict, whatever bound they give).  Names
--- beginning with "lupin." are the runtime's own (flow control's counts
--- are in "lupin.flow"): a plugin writing there could hold every worker's
--- queue.
---@param name string
---@param opts? { max_entries: integer? }
---@return lupin.SharedDict
function M.dict(name, opts)
  if type(name) ~= "string" or name == "" then
    error(("shared dict name must be a non-empty string, got %s"):format(
      name == "" and '""' or type(name)), 2)
  end
  if name:sub(1, 6) == "lupin." then
    error(("shared dict %q: names beginning with \"lupin.\" are reserved for the runtime"):format(
      name), 2)
  end
  return open(name, opts)
end

-- The runtime's own dicts (a leading "_": not in a plugin's copy of the module).
M._runtime_dict = open

--- The value of key, or nil.
---@param key string
---@return number|string|boolean|nil
function Dict:get(key)
  local d = dict_of(self)
  check_key(key, 2)
  local api = capi.shared
  while true do
    api.dict_get(d, key, #key, value, buf, buf_size)
    local t = value.type
    if t == NUMBER then
      return value.num
    elseif t == BOOLEAN then
      return value.num ~= 0
    elseif t == NIL then
      return nil
    end
    local len = tonumber(value.len)
    if len <= buf_size then
      return ffi.string(buf, len)
    end
    buf_size = len -- a longer string than ever: room for it, and read again
    buf = ffi.new("char[?]", buf_size)
  end
end

local function set_error(self, rc)
  if rc == FULL then
    return nil, "full"
  elseif rc == NO_MEMORY then
    -- a plugin may drop the answer: the operator hears of it (once a second)
    log.limited("shared/no-memory", "warn", "shared dict %q: a write was refused: the plugins'"
      .. " dicts hold %d MB together, the most a process gives them; a plugin keeps keys it"
      .. " never deletes", names[self], M.MAX_BYTES / 1048576)
    return nil, "no memory"
  elseif rc == TOO_LONG then
    error(("shared dict %q: the value is longer than %d bytes"):format(names[self], M.MAX_VALUE), 3)
  end
  error(("shared dict %q: out of memory"):format(names[self]), 3)
end

--- Sets key to v (nil deletes it).  Returns true, or nil, "full" when key is
--- new and the dict holds max_entries keys already, or nil, "no memory" when
--- the process's dicts hold MAX_BYTES together.
---@param key string
---@param v number|string|boolean|nil
---@return true|nil ok
---@return string? err
function Dict:set(key, v)
  local d = dict_of(self)
  check_key(key, 2)
  local t, rc = type(v), nil
  local api = capi.shared
  if t == "number" then
    rc = api.dict_set(d, key, #key, NUMBER, v, nil, 0)
  elseif t == "string" then
    rc = api.dict_set(d, key, #key, STRING, 0, v, #v)
  elseif t == "boolean" then
    rc = api.dict_set(d, key, #key, BOOLEAN, v and 1 or 0, nil, 0)
  elseif t == "nil" then
    rc = api.dict_set(d, key, #key, NIL, 0, nil, 0)
  else
    error(("shared dict value must be a number, string, boolean or nil, got %s"):format(t), 2)
  end
  if rc == 0 then
    return true
  end
  return set_error(self, rc)
end

--- Adds delta to key's number, atomically across runtimes, and returns the
--- new value.  A missing key starts at init (nil, "not found" without one);
--- a key holding no number gives nil, "not a number"; a new key in a full
--- dict nil, "full"; past the process's MAX_BYTES nil, "no memory".
---@param key string
---@param delta number
---@param init number?
---@return number|nil value
---@return string? err
function Dict:incr(key, delta, init)
  local d = dict_of(self)
  check_key(key, 2)
  if type(delta) ~= "number" then
    error(("shared dict incr: delta must be a number, got %s"):format(type(delta)), 2)
  end
  if init ~= nil and type(init) ~= "number" then
    error(("shared dict incr: init must be a number or nil, got %s"):format(type(init)), 2)
  end
  local rc = capi.shared.dict_incr(d, key, #key, delta, init or 0, init and 1 or 0, result)
  if rc == 0 then
    return result[0]
  elseif rc == NOT_FOUND then
    return nil, "not found"
  elseif rc == NOT_NUMBER then
    return nil, "not a number"
  end
  return set_error(self, rc)
end

--- Deletes key (no error when absent).
---@param key string
function Dict:delete(key)
  local d = dict_of(self)
  check_key(key, 2)
  capi.shared.dict_set(d, key, #key, NIL, 0, nil, 0)
end

--- The number of keys held now.
---@return integer
function Dict:count()
  return tonumber(capi.shared.dict_count(dict_of(self)))
end

--- The bound on keys it was made with.
---@return integer
function Dict:max_entries()
  return tonumber(capi.shared.dict_max(dict_of(self)))
end

return M
