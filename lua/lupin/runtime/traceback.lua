-- Plugin tracebacks: where a plugin error came from, as the chain of the
-- plugin's own frames (file:line, innermost first).  The runtime's frames
-- (lua/lupin/**.lua) and C frames are left out: they are the same for every
-- error and say nothing about the plugin.
local M = {}

-- the directory of the runtime's modules and the SDK's, lua/lupin/
local RUNTIME = debug.getinfo(1, "S").source:match("^@(.*/)runtime/[^/]*$") or "\0"

local function plugin_frame(info)
  local src = info.source
  return src:sub(1, 1) == "@" and src:sub(2, #RUNTIME + 1) ~= RUNTIME
end

--- The plugin frames of the stack of a running error handler, from level on:
--- "file:line in function 'name' <- file:line in ...", or nil when there are none.
---@param level integer the first stack level to look at
---@return string?
function M.capture(level)
  local frames = {}
  for l = level, level + 40 do
    local info = debug.getinfo(l, "Sln")
    if not info then
      break
    end
    if plugin_frame(info) then
      local what = info.what == "main" and "the main chunk"
        or info.name and ("%s '%s'"):format(info.namewhat, info.name)
        or ("the function of line %d"):format(info.linedefined)
      frames[#frames + 1] = ("%s:%d in %s"):format(info.source:sub(2), info.currentline, what)
    end
  end
  return #frames > 0 and table.concat(frames, " <- ") or nil
end

return M
