-- Built-ins bounded for plugins (docs/plugins.md, "Budgets").  The budget's
-- polls sit in plugin code (budget.lua), so a built-in C function that runs
-- long on hostile input (a backtracking pattern over client text, a huge
-- string.rep) would hold the event loop for as long as it runs; and a
-- callback from C that calls back into the same built-in (gsub, sort,
-- coroutine.resume, format's __tostring) nests C frames until the thread's
-- stack overflows, which no Lua error catches.
--
-- install() replaces these in the global library tables, before any plugin
-- is loaded: plugins reach them through their sandbox's copies of those
-- tables (made at each load) and through the string metatable, and cannot
-- reach the global tables to undo it.  While a plugin call's deadline is set
-- the replacements run core/guard.c and core/pattern.c, which look at the
-- budget as they go and check the C stack before each callback; otherwise
-- (the runtime's own code between calls) they run the originals, at the
-- originals' speed.
-- luacheck: ignore 122 (it sets fields of the global library tables: its purpose)
local ffi = require "ffi"
local budget = require "lupin.runtime.budget"
local capi = require "lupin.runtime.capi"

local M = {}

M.STACK_ERROR = "C stack overflow: callbacks from built-ins (gsub, sort, coroutines, "
  .. "__tostring) nested too deeply"

--- Sorts longer than this in a plugin call compare by polling the budget.
M.SORT_POLLED = 512
--- Nested coroutine resumes a plugin call may hold.
M.MAX_NESTED = 200
--- The most slots table.new preallocates for a plugin (a hint: a table
--- grows past it as it fills, in plugin code that polls).
M.TABLE_NEW_MAX = 65536
--- The most lua-cjson may nest when encoding or decoding (its default).
M.MAX_JSON_DEPTH = 1000

local installed = false

--- Replaces the built-ins in the global tables (once per Lua state).
function M.install()
  if installed then
    return
  end
  installed = true
  local native = require "lupin.guard.native"
  native.bind(budget.trip)
  local B = capi.budget
  local G = native.guard
  local room = ffi.cast("size_t (*)(void *)", native.room_fn)
  local err = error

  -- In plugin calls only: the runtime's own code keeps the originals.
  local function bounded(original, guarded)
    return function(...)
      if B.deadline ~= 0 then
        return guarded(...)
      end
      return original(...)
    end
  end
  -- A C function that calls back into Lua: refused once the C stack is low.
  local function deep(original)
    return function(...)
      if B.deadline ~= 0 and room(G) == 0 then
        err(M.STACK_ERROR, 2)
      end
      return original(...)
    end
  end

  for _, name in ipairs({ "find", "match", "gmatch", "gsub", "rep" }) do
    string[name] = bounded(string[name], native[name])
  end
  table.concat = bounded(table.concat, native.concat)
  string.format = deep(string.format) -- "%s" calls __tostring

  -- table.sort's own comparison is C: a plugin's table of millions (built in
  -- `new`, whose budget is long) would be sorted past any call budget.  A
  -- long one is sorted by a comparison that polls, as plugin code does.
  local sort, trip, poll = table.sort, budget.trip, capi.budget_poll
  local cell = ffi.cast("volatile int32_t *", B)
  local function less(a, b)
    if poll(cell) ~= 0 then
      trip()
    end
    return a < b
  end
  table.sort = function(t, cmp)
    if B.deadline ~= 0 then
      if room(G) == 0 then
        err(M.STACK_ERROR, 2)
      end
      if cmp == nil and type(t) == "table" and #t > M.SORT_POLLED then
        cmp = less
      end
    end
    return sort(t, cmp)
  end

  -- Coroutines nest C frames at each resume, about 100 bytes: the stack
  -- would allow 80,000 levels, and each level's error passing back through
  -- coroutine.wrap gains a position prefix (gigabytes of messages).  As Lua
  -- 5.2 does, at most MAX_NESTED resumes are nested.
  local resume, wrap, nested = coroutine.resume, coroutine.wrap, 0
  local function enter()
    if nested >= M.MAX_NESTED or room(G) == 0 then
      err(M.STACK_ERROR, 3)
    end
    nested = nested + 1
  end
  local function left(...)
    nested = nested - 1
    return ...
  end
  local function left_wrap(ok, ...)
    nested = nested - 1
    if not ok then
      err((...), 0)
    end
    return ...
  end
  coroutine.resume = function(co, ...)
    if B.deadline == 0 or type(co) ~= "thread" then -- the original's error for a bad co
      return resume(co, ...)
    end
    enter()
    return left(resume(co, ...)) -- never throws past a thread check
  end
  coroutine.wrap = function(f)
    local w = wrap(f)
    return function(...)
      if B.deadline == 0 then
        return w(...)
      end
      enter()
      return left_wrap(pcall(w, ...))
    end
  end

  -- lua-cjson's decoder and encoder recurse in C once per level: a plugin
  -- raising its depth limit (cjson.decode_max_depth(1e7)) and decoding
  -- "[[[[..." would overflow the C stack.  Both limits are held to their
  -- default, 1000, in the shared module and in every instance cjson.new makes.
  -- 1000 levels take well under 128 KB of C stack: the reserve covers them
  -- (builtins_budget_spec decodes them at the end of a recursion).
  local function clamped(mod)
    for _, k in ipairs({ "decode_max_depth", "encode_max_depth" }) do
      local set = mod[k]
      if set then
        mod[k] = function(depth, ...)
          if type(depth) == "number" and depth > M.MAX_JSON_DEPTH then
            depth = M.MAX_JSON_DEPTH
          end
          return set(depth, ...)
        end
      end
    end
    local new = mod.new
    if new then
      mod.new = function(...)
        return clamped(new(...))
      end
    end
    return mod
  end
  clamped(require "cjson")
  clamped(require "cjson.safe")

  -- table.new clears what it allocates: table.new(6e7, 0) is 200 ms in one
  -- C call.  Its sizes are only a hint, so a plugin's are held to a bound.
  -- The runtime's own modules required it before this and keep the original.
  local tnew = require "table.new"
  package.loaded["table.new"] = function(narr, nhash)
    if B.deadline ~= 0 then
      local max = M.TABLE_NEW_MAX
      narr = type(narr) == "number" and narr > max and max or narr
      nhash = type(nhash) == "number" and nhash > max and max or nhash
    end
    return tnew(narr, nhash)
  end
end

return M
