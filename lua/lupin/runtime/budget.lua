-- Call budgets (docs/plugins.md, "Budgets").  Every call into a plugin runs
-- with a deadline; the watchdog thread of core/budget.c sets a flag once it
-- has passed.  A flag alone would not stop a loop the JIT has compiled (it
-- hoists the load out of the loop, and the instruction hook never fires in
-- a trace), so each plugin file is rewritten at load: every loop body, every
-- `goto` and every function entry polls the flag through an FFI call, which
-- neither the interpreter nor the JIT can skip.  Lines are kept, so errors
-- still name the plugin's own lines.  lupin's own plugins (home/plugins) poll
-- at function entries only: their loops run over the candidates on the hot
-- path, and a poll per round cost them 15-20% at 256 endpoints.
local capi = require "lupin.runtime.capi"

local M = {}

--- The error a cut call throws from the plugin's frame (the engine replaces
--- it with one naming the plugin, the point and the budget).
M.CUT = "lupin: plugin call over its budget"

--- Set by a cut; the caller of the budgeted call reads and clears it.
M.tripped = false

--- What a call on the request path gets once more at its first overrun,
--- counted from the moment it noticed: the engine sets it to GRACE of the
--- call's budget before each call; 0 for none (the lifecycle calls, and a
--- call that has had it).  On a VM that does not report stolen time, a vCPU
--- the host preempted counts as the thread's CPU, so one overrun can be
--- time the plugin never ran.
M.grace = 0

--- The share of its budget a request-path call gets once more: with the
--- watchdog noticing each overrun a little late (0.1-0.3 ms on an idle
--- machine), a cut then lands within twice the budget.
M.GRACE = 0.9

--- Defaults (the config's "budgets" section overrides them): calls on the
--- request path, and file load, new, init, migrate and shutdown.
M.DEFAULT_CALL_MS = 5
M.DEFAULT_LIFECYCLE_MS = 1000

local POLL = " if __lupin_p(__lupin_c)~=0 then __lupin_t() end "
local HEAD = "local __lupin_p, __lupin_c, __lupin_t = ...; return function(...) "
local TAIL = "\nend"

local function long_bracket(src, i)
  local eq = src:match("^%[(=*)%[", i)
  if not eq then
    return nil
  end
  local _, e = src:find("]" .. eq .. "]", i, true)
  return e or #src
end

local function quoted(src, i, q)
  local j = i + 1
  while true do
    local k = src:find("[\\" .. q .. "\n]", j)
    if not k or src:sub(k, k) ~= "\\" then
      return k or #src
    end
    j = k + 2
  end
end

-- Calls fn(kind, text, start, stop) for each token of Lua source that
-- matters here: names/keywords ("name") and punctuation ("op").
local function tokens(src, fn)
  local i, n = 1, #src
  while i <= n do
    local c = src:sub(i, i)
    local s, e
    if c:match("%s") then
      e = src:find("[^%s]", i) or n + 1
      e = e - 1
    elseif src:sub(i, i + 1) == "--" then
      e = long_bracket(src, i + 2) or (src:find("\n", i, true) or n)
    elseif c == "[" and src:match("^%[=*%[", i) then
      e = long_bracket(src, i)
    elseif c == '"' or c == "'" then
      e = quoted(src, i, c)
    elseif c:match("[%a_]") then
      s, e = src:find("^[%w_]+", i)
      fn("name", src:sub(s, e), s, e)
    elseif c:match("%d") or (c == "." and src:match("^%.%d", i)) then
      e = i
      while true do
        local _, x = src:find("^[eEpP][+-]", e + 1)
        x = x or select(2, src:find("^[%w%.]", e + 1))
        if not x then
          break
        end
        e = x
      end
    else
      e = i
      fn("op", c, i, i)
    end
    i = e + 1
  end
end

--- Rewrites plugin source so every loop body, `goto` and function entry
--- polls the budget flag.  Returns the text to compile (it expects the poll
--- function, the flag and the trip function as its chunk arguments and
--- returns the plugin's main function), or nil and an error.
---@param src string
---@return string? text, string? err
---@param loops boolean? false: function entries only (the built-in plugins,
--- whose loops are bounded by their input and hot: see docs/plugins.md)
function M.instrument(src, loops)
  local at, bad = {}, nil
  local want_paren, in_params = false, false
  tokens(src, function(kind, text, s, e)
    if kind == "name" then
      if text:sub(1, 7) == "__lupin" and not bad then
        bad = ("the name %s is reserved for lupin"):format(text)
      elseif (text == "do" or text == "repeat") and loops ~= false then
        at[#at + 1] = e
      elseif text == "goto" and loops ~= false then
        at[#at + 1] = s - 1
      elseif text == "function" then
        want_paren = true
      end
    elseif want_paren and text == "(" then
      want_paren, in_params = false, true
    elseif in_params and text == ")" then
      in_params = false
      at[#at + 1] = e
    end
  end)
  if bad then
    return nil, bad
  end
  local out, last = { HEAD }, 0
  for _, pos in ipairs(at) do
    out[#out + 1] = src:sub(last + 1, pos)
    out[#out + 1] = POLL
    last = pos
  end
  out[#out + 1] = src:sub(last + 1)
  out[#out + 1] = TAIL
  return table.concat(out)
end

local B -- the runtime's lupin_budget (core/budget.c), once bound
local cell, poll
local now = capi.now

-- Thrown into the plugin's frame while its call is over budget: a plugin
-- that catches it with pcall meets it again at its next loop, goto or call.
-- The first overrun of a request-path call only moves its deadline.  `at`:
-- when a built-in's work would end (core/guard.c), checked as if it were now.
local function trip(at)
  local d = B.deadline
  local t = at or now()
  if d > 0 and t >= d then
    local grace = M.grace
    if grace > 0 then
      M.grace = 0
      B.deadline, B.cut = t + grace, 0
      return
    end
    M.tripped = true
    error(M.CUT, 0)
  end
  B.cut = 0 -- a late flag from a call that has since ended
end

--- The same, for the built-ins that check the budget as they go
--- (lua/lupin/runtime/guard.lua).
M.trip = trip

function M.bind()
  local ffi = require "ffi"
  B, now = capi.budget, capi.now
  cell = ffi.cast("volatile int32_t *", B)
  poll = capi.budget_poll
  return B
end

--- Compiles a plugin file's text, instrumented.  Returns the plugin's main
--- function or nil and an error with the file and line.
---@param text string
---@param chunkname string
---@param builtin boolean? a file of lupin's own plugins/ directory
function M.compile(text, chunkname, builtin)
  -- the text as written first: syntax errors name the plugin's own tokens
  local f, err = loadstring(text, chunkname)
  if not f then
    return nil, err
  end
  local src
  src, err = M.instrument(text, not builtin)
  if not src then
    return nil, ("%s: %s"):format(chunkname:sub(2), err)
  end
  f, err = loadstring(src, chunkname)
  if not f then
    return nil, err
  end
  return f(poll, cell, trip)
end

--- Calls f(...) with a budget of `seconds` (not nested in another).
--- Returns ok and f's first result like pcall, and true when the call was
--- cut (then ok is false).
---@param seconds number
---@param f function
function M.pcall(seconds, f, ...)
  M.grace = 0
  B.deadline = now() + seconds
  local ok, res = pcall(f, ...)
  B.deadline = 0
  B.cut = 0
  if M.tripped then
    M.tripped = false
    return false, M.CUT, true
  end
  return ok, res, false
end

local MAX_MESSAGE = 2048

--- A plugin's error as a string safe to log, whatever it threw.  A table's
--- __tostring is plugin code: it runs under a budget of its own, and only a
--- string it returns is used.
---@param err any
---@return string
function M.describe(err)
  local t = type(err)
  local s
  if t == "string" then
    s = err
  elseif t == "number" or t == "boolean" or t == "nil" then
    s = tostring(err)
  elseif t == "table" then
    local ok, v, cut = M.pcall(M.DEFAULT_CALL_MS / 1000, tostring, err)
    if ok and type(v) == "string" then
      s = v
    else
      s = ("(a table error object whose __tostring %s)"):format(cut and "ran over budget"
        or ok and "returned a " .. type(v) or "failed")
    end
  else
    s = ("(a %s error object)"):format(t)
  end
  if #s > MAX_MESSAGE then
    s = s:sub(1, MAX_MESSAGE) .. "..."
  end
  return s
end

return M
