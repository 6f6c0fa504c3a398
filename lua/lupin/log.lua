--- lupin.log: logging for plugins and the runtime, through the host's sink.
---@class lupin.log
local M = {}

local capi = require "lupin.runtime.capi"

local LEVELS = { error = 0, warn = 1, info = 2, debug = 3 }

--- The most verbose level that is emitted ("error", "warn", "info", "debug").
M.level = LEVELS.info

local function format(fmt, ...)
  if select("#", ...) == 0 then
    return tostring(fmt)
  end
  local ok, msg = pcall(string.format, fmt, ...)
  return ok and msg or tostring(fmt)
end

--- Logs a message at a level; fmt and its arguments as in string.format.
---@param level "error"|"warn"|"info"|"debug"
---@param fmt any
function M.log(level, fmt, ...)
  local n = LEVELS[level] or LEVELS.info
  if n > M.level then
    return
  end
  capi.api.log(capi.rt, n, format(fmt, ...))
end

function M.error(...) M.log("error", ...) end
function M.warn(...) M.log("warn", ...) end
function M.info(...) M.log("info", ...) end
function M.debug(...) M.log("debug", ...) end

local windows = {} -- key -> { until_, suppressed }

--- Logs at most one message per key and second; the next one logged says how
--- many were suppressed in between.  For errors that can repeat per request.
---@param key string
---@param level "error"|"warn"|"info"|"debug"
function M.limited(key, level, fmt, ...)
  local now = capi.now()
  local w = windows[key]
  if w and now < w.until_ then
    w.suppressed = w.suppressed + 1
    return
  end
  local msg = format(fmt, ...)
  if w and w.suppressed > 0 then
    msg = msg .. (" (%d similar suppressed)"):format(w.suppressed)
  end
  windows[key] = { until_ = now + 1, suppressed = 0 }
  M.log(level, "%s", msg)
end

return M
